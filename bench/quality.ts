/**
 * What fine-tuning buys, measured through the service end to end, on one of two generated tasks
 * (bench/lib/qualityTasks.ts):
 *
 * - `dates` (default): an ISO date such as `2023-07-04` written out as `4 July 2023`; 200 pairs, 160 to
 *   train on and 40 held out. A format to learn: memorisation of the mapping is most of it.
 * - `classify`: a short customer message → one label of billing/shipping/refund/technical/account;
 *   300 pairs, 240 to train on and 60 held out. No filled-in sentence of a held-out message occurs in
 *   the training pairs, so it measures generalisation to new messages; with `--hold-out unseen` the
 *   held-out messages are built from two templates per label that no training message uses.
 *
 * A real `conduit serve` process uploads the training pairs and fine-tunes the base model on them; the
 * held-out pairs are then scored by the product's evals (`/conduit/evals`): one eval run in which the base model
 * (before) and the run (after) answer every held-out pair greedily, with the same system prompt, graded by the
 * task's exact-match grader (`grader` in bench/lib/qualityTasks.ts, the same rule as its `correct`). `--epochs`, `--lr` and
 * `--rank` default to `auto`: nothing is sent and the service chooses (the chosen numbers are read back
 * from the run's `config`). Prints held-out accuracy before and after, and one summary row for a table.
 *
 * `--task preference`: what preference tuning (DPO) moves, base vs SFT vs SFT+DPO on held-out messages: how often
 * greedy answers take the preferred form, and the preferred answer's log-probability margin gain over the other
 * (bench/lib/preferenceQuality.ts; `--epochs` and `--beta` apply, the DPO run needs the torch trainer).
 *
 *   node --import tsx bench/quality.ts [smollm2-135m|file.gguf] [--task dates|classify|preference]
 *     [--epochs auto|N] [--lr auto|X] [--rank auto|N] [--method lora|full] [--train-on-inputs]
 *     [--hold-out random|unseen] [--threads 1|auto] [--pairs N] [--complexity 1] [--beta 0.1]
 */
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { call, startConduit } from "./lib/conduitServer.ts";
import { TASKS, type HoldOut, type Pair } from "./lib/qualityTasks.ts";
import { modelPath, requireFile, type BenchModel } from "./lib/reference.ts";
import { preferenceQuality } from "./lib/preferenceQuality.ts";
import type { EvalResultWire, EvalRunWire } from "../src/contract/evals.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    task: { type: "string", default: "dates" },
    epochs: { type: "string", default: "auto" },
    method: { type: "string", default: "lora" },
    rank: { type: "string", default: "auto" },
    lr: { type: "string", default: "auto" },
    "train-on-inputs": { type: "boolean", default: false },
    "hold-out": { type: "string", default: "random" },
    complexity: { type: "string", default: "1" },
    threads: { type: "string", default: "1" },
    pairs: { type: "string" },
    beta: { type: "string", default: "0.1" },
  },
});
if (values.task === "preference") {
  const positional = positionals[0] ?? "smollm2-135m";
  const epochs = values.epochs === "auto" ? undefined : Number(values.epochs);
  if (epochs !== undefined && !(Number.isInteger(epochs) && epochs > 0))
    throw new Error(`--epochs ${values.epochs}: "auto" or a positive integer`);
  await preferenceQuality(
    requireFile(
      positional.endsWith(".gguf") ? path.resolve(positional) : modelPath(positional as BenchModel),
    ),
    { threads: values.threads, pairs: Number(values.pairs ?? 150), epochs, beta: Number(values.beta) },
  );
  process.exit(0);
}
if (!(values.task in TASKS))
  throw new Error(`--task ${values.task}: one of ${Object.keys(TASKS).join(", ")}`);
const task = TASKS[values.task as keyof typeof TASKS];
if (values.method !== "lora" && values.method !== "full")
  throw new Error(`--method ${values.method}: lora or full`);
if (values.method === "full" && values.rank !== "auto") throw new Error("--rank is a LoRA setting");
const modelArg = positionals[0] ?? "smollm2-135m";
const model = requireFile(
  modelArg.endsWith(".gguf") ? path.resolve(modelArg) : modelPath(modelArg as BenchModel),
);

/** `"auto"` → undefined (the field is left out, so the service chooses), else the number. */
function setting(name: string, value: string): number | undefined {
  if (value === "auto") return undefined;
  const number = Number(value);
  if (!Number.isFinite(number) || number <= 0)
    throw new Error(`--${name} ${value}: "auto" or a positive number`);
  return number;
}
const asked = {
  epochs: setting("epochs", values.epochs),
  lr: setting("lr", values.lr),
  loraRank: setting("rank", values.rank),
};

if (values["hold-out"] !== "random" && values["hold-out"] !== "unseen")
  throw new Error(`--hold-out ${values["hold-out"]}: random or unseen`);
const holdOut: HoldOut = values["hold-out"];
const { train, heldOut } = task.split(Number(values.pairs ?? task.defaultPairs), holdOut);
/** The task as the summary names it: `classify (unseen)` for held-out templates. */
const taskLabel = holdOut === "random" ? task.name : `${task.name} (${holdOut})`;
const loadAtStart = os.loadavg();

interface Run {
  id: string;
  status: string;
  error: string | null;
  config: {
    epochs: number;
    lr: number;
    loraRank: number | null;
    trainOnInputs: boolean;
    autoSettings: string[];
  };
  stats: {
    step?: number;
    totalSteps?: number;
    elapsedSeconds?: number;
    etaSeconds?: number;
    trainLoss?: number;
    evalLoss?: number;
    tokensPerSecond?: number;
    bestEpoch?: number;
    bestEvalLoss?: number;
    warnings?: string[];
    final?: { bestEvalLoss?: number; finalEvalLoss?: number; stoppedEarly?: boolean; epochs?: number };
  };
  logs: string[];
}

const server = await startConduit(
  { base: model },
  {
    CONDUIT_TRAIN_THREADS: values.threads,
    // `--threads auto`: the trainers' default (CONDUIT_TRAIN_THREADS); generation keeps one thread.
    CONDUIT_THREADS: values.threads === "auto" ? "1" : values.threads,
    CONDUIT_CONTEXT_SIZE: "512",
    // The bench scores its own held-out pairs; the run's automatic before/after would answer its split too.
    CONDUIT_EVAL_AFTER_RUN: "off",
  },
);
try {
  const describe = (pair: Pair, answer: string) =>
    `${JSON.stringify(pair.input)} → ${JSON.stringify(answer.trim())} (want ${pair.output})`;
  /** Correct answers of one model in the eval run's results, with a few samples and misses. */
  const score = (results: EvalResultWire[], model: string) => {
    let correct = 0;
    const samples: string[] = [];
    const misses: string[] = [];
    for (const result of results.filter((r) => r.model === model)) {
      const pair = heldOut[result.item] as Pair;
      if (result.scores[0]?.passed) correct++;
      else if (misses.length < 5) misses.push(describe(pair, result.answer));
      if (samples.length < 3) samples.push(describe(pair, result.answer));
    }
    return { correct, samples, misses };
  };

  const dataset = await call<{ id: string }>(server, "POST", "/conduit/dataset", { name: task.name });
  await call(server, "POST", `/conduit/dataset/${dataset.id}/upload`, {
    name: `${task.name}.jsonl`,
    ioPairs: train,
  });
  const started = performance.now();
  let run = await call<Run>(server, "POST", "/conduit/finetuning", {
    datasetID: dataset.id,
    baseModelName: "base",
    systemPrompt: task.system,
    method: values.method,
    complexity: Number(values.complexity),
    ...(asked.epochs === undefined ? {} : { epochs: asked.epochs }),
    ...(asked.lr === undefined ? {} : { lr: asked.lr }),
    ...(asked.loraRank === undefined ? {} : { loraRank: asked.loraRank }),
    ...(values["train-on-inputs"] ? { trainOnInputs: true } : {}),
  });
  const auto = new Set(run.config.autoSettings);
  const mark = (setting: string, value: number | null) =>
    value === null ? "–" : `${value}${auto.has(setting) ? " (auto)" : ""}`;
  console.error(
    `run ${run.id}: epochs ${mark("epochs", run.config.epochs)}, lr ${mark("lr", run.config.lr)}, ` +
      `rank ${mark("loraRank", run.config.loraRank)}, trainOnInputs ${run.config.trainOnInputs}`,
  );
  let lastLine = 0;
  let lastProgress = performance.now();
  for (;;) {
    for (const line of run.logs.slice(lastLine)) console.error(`  ${line}`);
    lastLine = run.logs.length;
    if (performance.now() - lastProgress > 60_000 && run.stats.step !== undefined) {
      lastProgress = performance.now();
      console.error(
        `  … step ${run.stats.step}/${run.stats.totalSteps}, ${(run.stats.elapsedSeconds ?? 0).toFixed(0)} s, ` +
          `eta ${(run.stats.etaSeconds ?? 0).toFixed(0)} s, load ${os.loadavg()[0]!.toFixed(1)}`,
      );
    }
    if (["READY", "FAILED", "CANCELLED"].includes(run.status)) break;
    await new Promise((resolve) => setTimeout(resolve, 2000));
    run = await call(server, "GET", `/conduit/finetuning/${run.id}`);
  }
  if (run.status !== "READY") throw new Error(`run ended ${run.status}: ${run.error}`);
  const trainSeconds = (performance.now() - started) / 1000;

  // Before and after in one eval run of the product: the base model and the run answer every held-out pair.
  const evaluation = await call<{ id: string }>(server, "POST", "/conduit/evals", {
    name: `${taskLabel} held out`,
    source: { type: "items", items: heldOut.map((pair) => ({ input: pair.input, expected: pair.output })) },
    graders: [task.grader],
    systemPrompt: task.system,
  });
  let evalRun = await call<EvalRunWire>(server, "POST", `/conduit/evals/${evaluation.id}/runs`, {
    models: ["base", run.id],
    maxTokens: task.maxTokens,
  });
  while (evalRun.status === "QUEUED" || evalRun.status === "RUNNING") {
    await new Promise((resolve) => setTimeout(resolve, 1000));
    evalRun = await call(server, "GET", `/conduit/evals/${evaluation.id}/runs/${evalRun.id}`);
  }
  if (evalRun.status !== "COMPLETED") throw new Error(`eval run ended ${evalRun.status}: ${evalRun.error}`);
  const results = await call<EvalResultWire[]>(
    server,
    "GET",
    `/conduit/evals/${evaluation.id}/runs/${evalRun.id}/results?limit=10000`,
  );
  const before = score(results, "base");
  const after = score(results, run.id);
  const worst = await call<{ split: string; input: string; output: string; loss: number | null }[]>(
    server,
    "GET",
    `/conduit/finetuning/${run.id}/examples?sort=loss&limit=3`,
  );
  const loadAtEnd = os.loadavg();

  const { config, stats } = run;
  const autoLine = run.logs.find((line) => line.includes("auto settings:"));
  const bestEvalLoss = stats.final?.bestEvalLoss ?? stats.bestEvalLoss;
  console.log(
    `\nmodel ${path.basename(model)}; task ${taskLabel}: ${task.description}; ${train.length} training pairs ` +
      `(the service holds out its own eval set from these), ${heldOut.length} held out here; ` +
      `${values.method}${config.loraRank === null ? "" : ` rank ${mark("loraRank", config.loraRank)}`}, ` +
      `epochs ${mark("epochs", config.epochs)}, lr ${mark("lr", config.lr)}, trainOnInputs ${config.trainOnInputs}, ` +
      `complexity ${values.complexity}, ${values.threads} thread(s)`,
  );
  if (autoLine) console.log(autoLine.slice(autoLine.indexOf("auto settings:")));
  console.log(
    `run ${run.id}: ${stats.step} steps in ${trainSeconds.toFixed(0)} s (queue to READY), ` +
      `${stats.tokensPerSecond?.toFixed(1)} train tok/s, final train loss ${stats.trainLoss?.toFixed(3)}` +
      (stats.evalLoss === undefined ? "" : `, eval loss ${stats.evalLoss.toFixed(3)}`) +
      (bestEvalLoss === undefined
        ? ""
        : `, best eval loss ${bestEvalLoss.toFixed(3)} (epoch ${stats.bestEpoch})`),
  );
  for (const warning of stats.warnings ?? []) console.log(`warning: ${warning}`);
  console.log(
    `held-out ${task.name === "dates" ? "exact match" : "accuracy"}: before ${before.correct}/${heldOut.length}, ` +
      `after ${after.correct}/${heldOut.length}`,
  );
  console.log(`  before, e.g. ${before.samples.join("; ")}`);
  console.log(`  after,  e.g. ${after.samples.join("; ")}`);
  if (after.misses.length > 0) console.log(`  after, misses: ${after.misses.join("; ")}`);
  console.log(
    `  worst examples by loss: ${worst.map((e) => `${e.split} ${JSON.stringify(e.input)} → ${e.output} (${e.loss?.toFixed(3)})`).join("; ")}`,
  );
  const percent = (n: number) => `${((100 * n) / heldOut.length).toFixed(1)} %`;
  const load = (l: number[]) => l.map((x) => x.toFixed(1)).join(" ");
  console.log(
    `\n| task | method | trainOnInputs | epochs | lr | rank | steps | train s | best epoch | best eval loss | before | after | load (1/5/15 min) start → end |`,
  );
  console.log(
    `| ${taskLabel} | ${values.method} | ${config.trainOnInputs} | ${mark("epochs", config.epochs)} | ${mark("lr", config.lr)} | ` +
      `${mark("loraRank", config.loraRank)} | ${stats.step} | ${trainSeconds.toFixed(0)} | ${stats.bestEpoch ?? "–"} | ` +
      `${bestEvalLoss?.toFixed(3) ?? "–"} | ${before.correct}/${heldOut.length} (${percent(before.correct)}) | ` +
      `${after.correct}/${heldOut.length} (${percent(after.correct)}) | ${load(loadAtStart)} → ${load(loadAtEnd)} |`,
  );
} finally {
  server.stop();
}
