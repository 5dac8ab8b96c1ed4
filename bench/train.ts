/**
 * Training speed of Conduit's trainer (the child process the scheduler starts) against `llama-finetune`
 * built from the same llama.cpp source (bench/setup.sh), on the same F32 weights, text, threads and
 * context: training tokens/s and peak RSS.
 *
 *   node --import tsx bench/train.ts [stories260K|smollm2-135m|file.gguf] [--threads 1] [--ctx 256] [--kb 160]
 *
 * The corpus is a deterministic TinyStories-like text (`--kb` KiB). `llama-finetune` tokenizes it whole and
 * trains on windows of `--ctx` tokens with a stride of half a window; Conduit's trainer packs its paragraphs
 * into windows of `--ctx` tokens. Both count window positions as training tokens, and both rates leave out
 * the first optimizer step (graph allocation): tokens between the first and the last progress report over
 * the time between them. Both train every block and the output head (`llama-finetune` offers every tensor
 * to the optimizer; llama.cpp trains neither's token embeddings). The model is converted to F32 once so
 * both train the same weights (only F32 tensors train); a model too deep for llama.cpp's graph size gets the
 * trainer's headroom adapter on both sides (src/train/native/graphHeadroom.ts). Peak RSS: `/usr/bin/time -v` for `llama-finetune`,
 * the trainer process's own `maxRSS` for Conduit (a Node process, ~50 MB of it before any model).
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { writeHeadroomAdapter } from "../src/train/native/graphHeadroom.ts";
import { loadLlamaLib } from "../src/train/libllama/llamaLib.ts";
import { readModelFile } from "../src/train/core/modelFile.ts";
import { convertModel } from "../src/train/native/runTraining.ts";
import { startTrainer, type TrainerProgress } from "../src/train/trainer.ts";
import { llamaCppJob } from "../test/lib/trainerJob.ts";
import { corpus } from "./lib/corpus.ts";
import { modelPath, requireFile, toolPath, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    threads: { type: "string", default: "1" },
    ctx: { type: "string", default: "256" },
    kb: { type: "string" },
  },
});
const modelArg = positionals[0] ?? "stories260K";
const source = requireFile(
  modelArg.endsWith(".gguf") ? path.resolve(modelArg) : modelPath(modelArg as BenchModel),
);
const threads = Number(values.threads);
const ctx = Number(values.ctx);
// A big model trains at tens of tokens/s on one core: a smaller default corpus keeps it to minutes.
const kb = Number(values.kb ?? (fs.statSync(source).size > 20e6 ? 6 : 160));

const work = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-train-"));
process.on("exit", () => fs.rmSync(work, { recursive: true, force: true }));

interface Measured {
  tokensPerSecond: number;
  steps: number;
  peakRssMb: number;
  wallSeconds: number;
}

/** `llama-finetune`, timing its per-batch progress lines as they arrive. */
async function llamaFinetune(model: string, text: string): Promise<Measured> {
  const corpusFile = path.join(work, "corpus.txt");
  fs.writeFileSync(corpusFile, text);
  const timeFile = path.join(work, "finetune.time");
  const args = [
    ...["-v", "-o", timeFile, requireFile(toolPath("llama-finetune"))],
    ...["-m", model, "-f", corpusFile, "-c", String(ctx), "-b", String(ctx), "-ub", String(ctx)],
    ...["-epochs", "1", "-t", String(threads), "-o", path.join(work, "finetuned.gguf")],
  ];
  // llama-finetune aborts on deep models for want of graph nodes, as the trainer would: give it the same
  // headroom adapter, loaded with scale 0 (never applied), as the trainer loads it.
  const headroom = path.join(work, "headroom.gguf");
  const adapter = await writeHeadroomAdapter(readModelFile(loadLlamaLib(), model), headroom);
  if (adapter)
    args.push("--lora-scaled", Array.from({ length: adapter.loads }, () => `${headroom}:0`).join(","));
  const started = performance.now();
  const child = spawn("/usr/bin/time", args, { stdio: ["ignore", "ignore", "pipe"] });
  let first: { at: number; step: number } | undefined;
  let last: { at: number; step: number } | undefined;
  let buffer = "";
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => {
    const now = performance.now();
    buffer += chunk;
    const lines = buffer.split(/[\r\n]/);
    buffer = lines.pop() ?? "";
    for (const line of lines) {
      const match = /^train:.*data=(\d+)\/(\d+)/.exec(line);
      if (!match) continue;
      const point = { at: now, step: Number(match[1]) };
      first ??= point;
      last = point;
    }
  });
  return new Promise((resolve, reject) => {
    child.on("close", (code) => {
      if (code !== 0) return reject(new Error(`llama-finetune exited with ${code}`));
      const rss = /Maximum resident set size \(kbytes\): (\d+)/.exec(fs.readFileSync(timeFile, "utf8"));
      if (!first || !last || last.step <= first.step)
        return reject(new Error("llama-finetune trained fewer than 2 steps: raise --kb"));
      resolve({
        tokensPerSecond: ((last.step - first.step) * ctx) / ((last.at - first.at) / 1000),
        steps: last.step,
        peakRssMb: Number(rss?.[1] ?? Number.NaN) / 1024,
        wallSeconds: (performance.now() - started) / 1000,
      });
    });
  });
}

/** Conduit's trainer, as the scheduler starts it (progress arrives at most twice a second and at the end). */
async function conduitTrainer(model: string, samples: string[]): Promise<Measured> {
  const started = performance.now();
  let first: { at: number; step: number } | undefined;
  let last: { at: number; step: number } | undefined;
  const handle = startTrainer(
    llamaCppJob({
      baseModelPath: model,
      outputPath: path.join(work, "conduit.gguf"),
      workDir: path.join(work, "conduit-work"),
      samples,
      method: "full",
      learningRate: 1e-5,
      epochs: 1,
      contextSize: ctx,
      threads,
      seed: 0,
      lrSchedule: { kind: "constant" },
    }),
    {
      // Which libllama it trains with: node-llama-cpp's local build for this CPU, or its prebuilt one.
      onLog: (line) => {
        if (line.startsWith("trainer: llama.cpp ")) console.log(`  ${line}`);
      },
      onProgress: (progress: TrainerProgress) => {
        const point = { at: performance.now(), step: progress.step };
        first ??= point;
        last = point;
      },
    },
  );
  const outcome = await handle.done;
  if (outcome.status !== "completed") throw new Error(`trainer: ${JSON.stringify(outcome)}`);
  if (!first || !last || last.step <= first.step)
    throw new Error("the trainer trained fewer than 2 steps: raise --kb");
  return {
    tokensPerSecond: ((last.step - first.step) * ctx) / ((last.at - first.at) / 1000),
    steps: outcome.stats.steps,
    peakRssMb: outcome.stats.peakRssBytes / 1024 / 1024,
    wallSeconds: (performance.now() - started) / 1000,
  };
}

const f32 = path.join(work, "model-f32.gguf");
convertModel(source, f32, "F32", threads);
const paragraphs = corpus(kb);
console.log(
  `model ${path.basename(source)} (F32 ${(fs.statSync(f32).size / 1e6).toFixed(1)} MB), ${threads} thread(s), ` +
    `context ${ctx}, corpus ${kb} KiB (${paragraphs.length} paragraphs), ${os.cpus().length} cores, load ${os.loadavg()[0]?.toFixed(1)}`,
);
const reference = await llamaFinetune(f32, paragraphs.join("\n\n"));
const conduit = await conduitTrainer(f32, paragraphs);
const row = (name: string, m: Measured) =>
  console.log(
    `  ${name.padEnd(16)} ${m.tokensPerSecond.toFixed(0).padStart(8)} tok/s  ${String(m.steps).padStart(5)} steps  ` +
      `peak RSS ${m.peakRssMb.toFixed(0).padStart(5)} MB  wall ${m.wallSeconds.toFixed(1)} s`,
  );
row("llama-finetune", reference);
row("conduit trainer", conduit);
console.log(
  `  ratio (conduit / llama-finetune): tokens/s ${(conduit.tokensPerSecond / reference.tokensPerSecond).toFixed(2)}x, ` +
    `peak RSS ${(conduit.peakRssMb / reference.peakRssMb).toFixed(2)}x`,
);
