/**
 * `bench/quality.ts --task preference`: what preference tuning (DPO) moves, base vs SFT vs SFT+DPO, through the
 * service end to end. The classify task's customer messages (bench/lib/qualityTasks.ts) are answered in one of two
 * forms: the preferred `Team: billing.` and the plain `billing`. The supervised run (SFT) trains on the training
 * messages with the two forms in turn, so it learns the labels but not which form; the DPO run starts from it
 * (`fromRunID`) on the same messages, each with its preferred and its plain answer, and holds the held-out messages
 * as its validation file. Prints, for the held-out messages:
 *
 * - how often each model's greedy answer takes the preferred form, and how often it is the preferred answer exactly
 *   (right label too), from one product eval run of the three models (a `regex` and an `exact_match` grader);
 * - the DPO run's held-out reward margin and accuracy: β × the mean gain of the preferred answer's log-probability
 *   margin over the plain one, relative to its reference (the SFT model), and how often that gain is positive.
 */
import os from "node:os";
import { ConduitClient } from "../../src/client/ConduitClient.ts";
import type { RunWire } from "../../src/contract/schemas.ts";
import type { EvalResultWire } from "../../src/contract/evals.ts";
import { BENCH_KEY, startConduit } from "./conduitServer.ts";
import { classifyTask, type Pair } from "./qualityTasks.ts";

export interface PreferenceBenchOptions {
  threads: string;
  /** Messages in all, a fifth held out. */
  pairs: number;
  /** Epochs of each run; `undefined`: the service chooses. */
  epochs: number | undefined;
  beta: number;
}

const preferred = (label: string) => `Team: ${label}.`;
/** What a greedy answer in the preferred form looks like, whatever its label. */
const PREFERRED_FORM = "^\\s*Team: [a-z]+\\.\\s*$";

export async function preferenceQuality(model: string, options: PreferenceBenchOptions): Promise<void> {
  const { train, heldOut } = classifyTask.split(options.pairs, "random");
  const loadAtStart = os.loadavg();
  const server = await startConduit(
    { base: model },
    {
      CONDUIT_TRAIN_THREADS: options.threads,
      CONDUIT_THREADS: options.threads === "auto" ? "1" : options.threads,
      CONDUIT_CONTEXT_SIZE: "512",
      CONDUIT_EVAL_AFTER_RUN: "off",
    },
  );
  const client = new ConduitClient({ baseUrl: server.url, key: BENCH_KEY });
  try {
    const jsonl = (rows: object[]) => new Blob([rows.map((row) => JSON.stringify(row)).join("\n") + "\n"]);
    const upload = async (name: string, rows: object[]) => {
      const dataset = await client.createDataset(name);
      const file = await client.uploadFile(dataset.id, jsonl(rows), { name: `${name}.jsonl` });
      return { datasetID: dataset.id, fileID: file.id };
    };
    const sft = await upload(
      "sft",
      train.map((pair, i) => ({
        input: pair.input,
        output: i % 2 === 0 ? preferred(pair.output) : pair.output,
      })),
    );
    const asPreference = (pair: Pair) => ({
      input: pair.input,
      preferred: preferred(pair.output),
      non_preferred: pair.output,
    });
    const dpo = await upload("dpo", train.map(asPreference));
    const held = await upload("dpo-held-out", heldOut.map(asPreference));
    const epochs = options.epochs === undefined ? {} : { epochs: options.epochs };

    const started = performance.now();
    const supervised = await untilEnded(
      client,
      await client.createRun({
        datasetID: sft.datasetID,
        baseModelName: "base",
        systemPrompt: classifyTask.system,
        ...epochs,
      }),
    );
    const sftSeconds = (performance.now() - started) / 1000;
    const tuned = await untilEnded(
      client,
      await client.createRun({
        datasetID: dpo.datasetID,
        validationFileID: held.fileID,
        method: "dpo",
        beta: options.beta,
        fromRunID: supervised.id,
        systemPrompt: classifyTask.system,
        ...epochs,
      }),
    );
    const dpoSeconds = (performance.now() - started) / 1000 - sftSeconds;

    const evaluation = await client.createEval({
      name: "preference held out",
      source: {
        type: "items",
        items: heldOut.map((pair) => ({ input: pair.input, expected: preferred(pair.output) })),
      },
      graders: [
        { type: "regex", name: "preferred_form", pattern: PREFERRED_FORM },
        { type: "exact_match", name: "preferred_answer" },
      ],
      systemPrompt: classifyTask.system,
    });
    const models = ["base", supervised.id, tuned.id];
    let evalRun = await client.createEvalRun(evaluation.id, { models, maxTokens: 8 });
    while (evalRun.status === "QUEUED" || evalRun.status === "RUNNING") {
      await new Promise((resolve) => setTimeout(resolve, 1000));
      evalRun = await client.getEvalRun(evaluation.id, evalRun.id);
    }
    if (evalRun.status !== "COMPLETED") throw new Error(`eval run ended ${evalRun.status}: ${evalRun.error}`);
    const results = await client.evalResults(evaluation.id, evalRun.id, { limit: 10_000 });
    const loadAtEnd = os.loadavg();

    const n = heldOut.length;
    const count = (model: string, grader: number) =>
      results.filter((r: EvalResultWire) => r.model === model && r.scores[grader]?.passed).length;
    const sample = (model: string) =>
      results
        .filter((r) => r.model === model)
        .slice(0, 3)
        .map((r) => JSON.stringify(r.answer.trim()))
        .join(", ");
    const stats = tuned.stats;
    console.log(
      `\nmodel ${model}; classify messages, ${train.length} to train on, ${n} held out; SFT ${supervised.config.epochs} ` +
        `epochs (${sftSeconds.toFixed(0)} s, ${supervised.config.trainer}), DPO β ${options.beta} ` +
        `${tuned.config.epochs} epochs (${dpoSeconds.toFixed(0)} s, ${tuned.config.trainer}), ${options.threads} thread(s)`,
    );
    console.log(
      `DPO held out: reward margin ${stats.evalRewardMargin?.toFixed(3) ?? "–"} ` +
        `(log-probability margin gain over SFT ${
          stats.evalRewardMargin === undefined ? "–" : (stats.evalRewardMargin / options.beta).toFixed(2)
        } nats), preferred wins ${
          stats.evalRewardAccuracy === undefined ? "–" : `${(100 * stats.evalRewardAccuracy).toFixed(1)} %`
        }`,
    );
    const load = (l: number[]) => l.map((x) => x.toFixed(1)).join(" ");
    console.log(`\n| model | preferred form (greedy) | preferred answer | e.g. |`);
    console.log(`| --- | --- | --- | --- |`);
    for (const [label, id] of [
      ["base", "base"],
      ["SFT", supervised.id],
      ["SFT+DPO", tuned.id],
    ] as const)
      console.log(`| ${label} | ${count(id, 0)}/${n} | ${count(id, 1)}/${n} | ${sample(id)} |`);
    console.log(`\nload (1/5/15 min) ${load(loadAtStart)} → ${load(loadAtEnd)}`);
  } finally {
    server.stop();
  }
}

/** Follows a run to its end; throws unless it is READY. */
async function untilEnded(client: ConduitClient, created: RunWire): Promise<RunWire> {
  let run = created;
  let shown = 0;
  for (;;) {
    for (const line of run.logs.slice(shown)) console.error(`  ${line}`);
    shown = run.logs.length;
    if (["READY", "FAILED", "CANCELLED"].includes(run.status)) break;
    await new Promise((resolve) => setTimeout(resolve, 2000));
    run = await client.getRun(run.id);
  }
  if (run.status !== "READY") throw new Error(`run ${run.id} ended ${run.status}: ${run.error}`);
  return run;
}
