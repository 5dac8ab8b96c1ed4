/**
 * What fine-tuning buys, measured through the service end to end: a small text transformation (an ISO date
 * such as `2023-07-04` written out as `4 July 2023`), 200 generated pairs, 160 to train on and 40 held out.
 * A real `conduit serve` process uploads the training pairs, fine-tunes the base model on them with the
 * run's defaults (unless given), and the held-out pairs are answered greedily before (the base model
 * through `/conduit/v1/chat`) and after (the run through `/conduit/finetuning/{id}/inference`), with the
 * same system prompt. Prints exact-match accuracy on the held-out pairs, before and after.
 *
 *   node --import tsx bench/quality.ts [smollm2-135m|file.gguf] [--epochs 3] [--lr 0.0001] [--threads 1]
 *     [--method lora|full] [--rank 16]
 */
import path from "node:path";
import { parseArgs } from "node:util";
import { call, startConduit } from "./lib/conduitServer.ts";
import { modelPath, requireFile, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    epochs: { type: "string", default: "3" },
    method: { type: "string", default: "full" },
    rank: { type: "string", default: "16" },
    lr: { type: "string", default: "0.0001" },
    complexity: { type: "string", default: "1" },
    threads: { type: "string", default: "1" },
    pairs: { type: "string", default: "200" },
  },
});
const modelArg = positionals[0] ?? "smollm2-135m";
const model = requireFile(
  modelArg.endsWith(".gguf") ? path.resolve(modelArg) : modelPath(modelArg as BenchModel),
);
const SYSTEM = "Write the date in words.";
const MONTHS = [
  "January",
  "February",
  "March",
  "April",
  "May",
  "June",
  "July",
  "August",
  "September",
  "October",
  "November",
  "December",
];

/** Deterministic distinct dates, 1950–2049, as {input: "2023-07-04", output: "4 July 2023"}. */
function datePairs(count: number): { input: string; output: string }[] {
  let state = 7;
  const next = (n: number) => {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    return state % n;
  };
  const seen = new Set<string>();
  const pairs: { input: string; output: string }[] = [];
  while (pairs.length < count) {
    const year = 1950 + next(100);
    const month = next(12);
    const day = 1 + next(28);
    const input = `${year}-${String(month + 1).padStart(2, "0")}-${String(day).padStart(2, "0")}`;
    if (seen.has(input)) continue;
    seen.add(input);
    pairs.push({ input, output: `${day} ${MONTHS[month]} ${year}` });
  }
  return pairs;
}

const pairs = datePairs(Number(values.pairs));
const heldOut = pairs.slice(0, Math.round(pairs.length / 5));
const train = pairs.slice(heldOut.length);
const greedy = { temperature: 0, presence_penalty: 0, frequency_penalty: 0, max_tokens: 16 };

const server = await startConduit(
  { base: model },
  { CONDUIT_TRAIN_THREADS: values.threads, CONDUIT_THREADS: values.threads, CONDUIT_CONTEXT_SIZE: "512" },
);
try {
  /** Exact matches of the held-out pairs, answered by `ask`. */
  const score = async (ask: (input: string) => Promise<string>) => {
    let exact = 0;
    const samples: string[] = [];
    for (const pair of heldOut) {
      const answer = (await ask(pair.input)).trim();
      if (answer === pair.output) exact++;
      if (samples.length < 3) samples.push(`${pair.input} → ${JSON.stringify(answer)} (want ${pair.output})`);
    }
    return { exact, samples };
  };

  const before = await score(async (input) => {
    const result = await call<{ choices: { content: string }[] }>(server, "POST", "/conduit/v1/chat", {
      model: "base",
      prompt: input,
      system_prompt: SYSTEM,
      ...greedy,
    });
    return result.choices[0]?.content ?? "";
  });

  const dataset = await call<{ id: string }>(server, "POST", "/conduit/dataset", { name: "dates" });
  await call(server, "POST", `/conduit/dataset/${dataset.id}/upload`, {
    name: "dates.jsonl",
    ioPairs: train,
  });
  const started = performance.now();
  let run = await call<{ id: string; status: string; stats: Record<string, unknown>; logs: string[] }>(
    server,
    "POST",
    "/conduit/finetuning",
    {
      datasetID: dataset.id,
      baseModelName: "base",
      systemPrompt: SYSTEM,
      epochs: Number(values.epochs),
      lr: Number(values.lr),
      method: values.method,
      ...(values.method === "lora" ? { loraRank: Number(values.rank) } : {}),
      complexity: Number(values.complexity),
    },
  );
  let lastLine = 0;
  while (!["READY", "FAILED", "CANCELLED"].includes(run.status)) {
    await new Promise((resolve) => setTimeout(resolve, 2000));
    run = await call(server, "GET", `/conduit/finetuning/${run.id}`);
    for (const line of run.logs.slice(lastLine)) console.error(`  ${line}`);
    lastLine = run.logs.length;
  }
  if (run.status !== "READY") throw new Error(`run ended ${run.status}`);
  const trainSeconds = (performance.now() - started) / 1000;

  const after = await score(async (input) => {
    const result = await call<{ response: string }>(
      server,
      "POST",
      `/conduit/finetuning/${run.id}/inference`,
      {
        prompt: input,
        ...greedy,
      },
    );
    return result.response;
  });

  const stats = run.stats as {
    trainLoss?: number;
    evalLoss?: number;
    tokensPerSecond?: number;
    step?: number;
  };
  console.log(
    `\nmodel ${path.basename(model)}; task: ISO date → words; ${train.length} training pairs, ${heldOut.length} held out; ` +
      `${values.method}${values.method === "lora" ? ` rank ${values.rank}` : ""}, ` +
      `epochs ${values.epochs}, lr ${values.lr}, complexity ${values.complexity}, ${values.threads} thread(s)`,
  );
  console.log(
    `run ${run.id}: ${stats.step} steps in ${trainSeconds.toFixed(0)} s (queue to READY), ` +
      `${stats.tokensPerSecond?.toFixed(0)} train tok/s, final train loss ${stats.trainLoss?.toFixed(3)}` +
      (stats.evalLoss === undefined ? "" : `, eval loss ${stats.evalLoss.toFixed(3)}`),
  );
  console.log(
    `exact match on held-out pairs: before ${before.exact}/${heldOut.length}, after ${after.exact}/${heldOut.length}`,
  );
  console.log(`  before, e.g. ${before.samples.join("; ")}`);
  console.log(`  after,  e.g. ${after.samples.join("; ")}`);
} finally {
  server.stop();
}
