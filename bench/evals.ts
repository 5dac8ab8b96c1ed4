/**
 * Eval throughput: the same eval run (greedy answers to `--items` questions) with `parallel` 1 (one answer at a
 * time, as a script sending one request after another) and `parallel` N (answers in flight at once, batched by the
 * engine), in one process on the same model, one after the other. Prints each wall time, answers per second and the
 * ratio, with the machine's load.
 *
 *   node --import tsx bench/evals.ts [smollm2-135m|stories260K|file.gguf] [--items 64] [--parallel 8] [--max-tokens 32]
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { loadConfig } from "../src/config.ts";
import { createCore } from "../src/core.ts";
import type { EvalRun } from "../src/domain/evals.ts";
import { modelPath, requireFile, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    items: { type: "string", default: "64" },
    parallel: { type: "string", default: "8" },
    "max-tokens": { type: "string", default: "32" },
  },
});
const modelArg = positionals[0] ?? "smollm2-135m";
const model = requireFile(
  modelArg.endsWith(".gguf") ? path.resolve(modelArg) : modelPath(modelArg as BenchModel),
);
const items = Number(values.items);
const parallel = Number(values.parallel);
const maxTokens = Number(values["max-tokens"]);

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-evals-"));
fs.mkdirSync(path.join(dataDir, "models"));
fs.symlinkSync(model, path.join(dataDir, "models", "base.gguf"));
const config = loadConfig({
  CONDUIT_DATA_DIR: dataDir,
  CONDUIT_LOG_LEVEL: "warn",
  CONDUIT_TRAIN_CONCURRENCY: "0",
  // Every answer in flight gets a sequence of its own: the batch is as wide as `--parallel`.
  CONDUIT_PARALLEL: String(parallel),
  CONDUIT_CONTEXT_SIZE: "512",
});
const core = await createCore(config);
core.evals.start(core.runEvents);
try {
  const questions = Array.from({ length: items }, (_, i) => ({
    input: `Write the date ${2000 + (i % 25)}-0${1 + (i % 9)}-1${i % 10} in words.`,
    expected: "",
  }));
  const created = await core.evals.create("bench", {
    name: "throughput",
    source: { type: "items", items: questions },
    graders: [{ type: "similarity" }],
  });
  const timed = async (inFlight: number): Promise<{ seconds: number; run: EvalRun }> => {
    const started = performance.now();
    const queued = await core.evals.createRun("bench", created.id, {
      models: ["base"],
      maxTokens,
      parallel: inFlight,
    });
    let run = queued;
    while (run.status === "QUEUED" || run.status === "RUNNING") {
      await new Promise((resolve) => setTimeout(resolve, 50));
      run = await core.evals.getRun("bench", created.id, queued.id);
    }
    if (run.status !== "COMPLETED") throw new Error(`eval run ${run.status}: ${run.error}`);
    return { seconds: (performance.now() - started) / 1000, run };
  };
  // The model is loaded (and its first answers warm) before anything is timed.
  await timed(parallel);
  const load = os.loadavg()[0]!.toFixed(1);
  const one = await timed(1);
  const many = await timed(parallel);
  const tokens = (r: EvalRun) => r.results[0]?.completionTokens ?? 0;
  console.log(
    `model ${path.basename(model)}, ${items} items, max ${maxTokens} tokens each, load ${load} → ${os.loadavg()[0]!.toFixed(1)}`,
  );
  console.log(`| parallel | seconds | answers/s | tokens out | tokens/s |`);
  for (const [n, r] of [
    [1, one],
    [parallel, many],
  ] as const)
    console.log(
      `| ${n} | ${r.seconds.toFixed(1)} | ${(items / r.seconds).toFixed(2)} | ${tokens(r.run)} | ${(tokens(r.run) / r.seconds).toFixed(1)} |`,
    );
  console.log(`parallel ${parallel} is ${(one.seconds / many.seconds).toFixed(2)}× as fast as one at a time`);
} finally {
  await core.close();
  fs.rmSync(dataDir, { recursive: true, force: true });
}
