/**
 * LoRA against full fine-tuning, in one run, on the same model, text, threads and window: training tokens/s,
 * peak RSS of the trainer process and the size of what each writes. Every variant is Conduit's own trainer
 * (the child process the scheduler starts); full fine-tuning is the reference the ratios are taken against.
 *
 *   node --import tsx bench/lora.ts [smollm2-135m|stories260K|file.gguf] [--threads 1] [--ctx 256] [--kb 6]
 *     [--bases F32,Q8_0,Q4_1] [--rank 16] [--steps 12]
 *   node --import tsx bench/lora.ts --big [--steps 2]   # a random ~1B model of TinyLlama's shape, Q4_0 base
 *   node --import tsx bench/lora.ts smollm2-135m --gpu cuda [--layers all] [--methods lora] [--bases Q8_0,F32]
 *     [--json FILE] [--native-log FILE]   # on a GPU: also peak GPU memory and the ops left to the CPU
 *
 * `--gpu cuda|vulkan` trains on that build of llama.cpp (job.gpu, as `CONDUIT_GPU` gives the scheduler), with
 * `--layers` offloaded; each run then reports its peak GPU memory (`stats.peakGpuBytes`) and the trainer's log
 * lines about the device (which GPU, which ops of a step it cannot run and leaves to the CPU). `--methods lora`
 * leaves out the full fine-tune (the ratios are then not printed). `--native-log FILE` appends llama.cpp's own
 * log of every run to FILE (with `GGML_SCHED_DEBUG=1` in the environment: the scheduler's splits per backend).
 * Rates leave out the first optimizer step (graph allocation): tokens between the first and the last progress
 * report over the time between them. Peak RSS is the trainer process's own `maxRSS` (a Node process, ~50 MB
 * of it before any model). With `--big` only LoRA runs (full F32 training of 1B parameters needs ~16 GB).
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { createTinyModel } from "../src/model/tinyModel.ts";
import { LLAMA_CPP_LORA_TARGETS } from "../src/train/native/llamaCppTrainer.ts";
import { loadLlamaLib } from "../src/train/libllama/llamaLib.ts";
import { convertModel } from "../src/train/native/runTraining.ts";
import type { TrainerOutputType } from "../src/domain/runs.ts";
import { startTrainer } from "../src/train/trainer.ts";
import { llamaCppJob, type JobInput } from "../test/lib/trainerJob.ts";
import { corpus } from "./lib/corpus.ts";
import { modelPath, requireFile, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    threads: { type: "string", default: "1" },
    ctx: { type: "string", default: "256" },
    kb: { type: "string", default: "6" },
    bases: { type: "string", default: "F32,Q8_0,Q4_1" },
    rank: { type: "string", default: "16" },
    steps: { type: "string", default: "12" },
    big: { type: "boolean", default: false },
    gpu: { type: "string", default: "cpu" },
    layers: { type: "string", default: "all" },
    methods: { type: "string", default: "full,lora" },
    json: { type: "string" },
    "native-log": { type: "string" },
  },
});
const gpu = values.gpu as "cpu" | "cuda" | "vulkan";
if (!["cpu", "cuda", "vulkan"].includes(gpu)) throw new Error(`--gpu is cpu, cuda or vulkan, not ${gpu}`);
const gpuLayers = values.layers === "all" ? ("all" as const) : Number(values.layers);
const methods = values.methods.split(",");
// The conversions below run in this process on the first libllama it loads: the GPU build's (a GPU host may
// have no CPU-only package), as the trainer does.
if (gpu !== "cpu") loadLlamaLib({ gpu });
/** Every run's results, for `--json`. */
const results: Record<string, Measured> = {};
const threads = Number(values.threads);
const ctx = Number(values.ctx);
const steps = Number(values.steps);
const rank = Number(values.rank);
const work = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-lora-"));
process.on("exit", () => fs.rmSync(work, { recursive: true, force: true }));

interface Measured {
  tokensPerSecond: number;
  peakRssMb: number;
  outputMb: number;
  parameters: number;
  wallSeconds: number;
  steps: number;
  /** On a GPU: `stats.peakGpuBytes` in MiB. */
  peakGpuMb?: number;
  /** The trainer's log lines about the device: where it trains, ops it leaves to the CPU. */
  deviceLog: string[];
}

async function train(job: Partial<JobInput> & Pick<JobInput, "baseModelPath">): Promise<Measured> {
  const started = performance.now();
  let first: { at: number; step: number } | undefined;
  let last: { at: number; step: number } | undefined;
  const deviceLog: string[] = [];
  const handle = startTrainer(
    llamaCppJob({
      outputPath: path.join(work, "out.gguf"),
      workDir: path.join(work, "work"),
      samples: corpus(Number(values.kb)),
      learningRate: 1e-4,
      epochs: 1,
      maxSteps: steps,
      contextSize: ctx,
      threads,
      options: { device: gpu, gpuLayers },
      seed: 0,
      lrSchedule: { kind: "constant" },
      ...job,
    }),
    {
      onLog: (line) => {
        if (/training on|registered no GPU|cannot run|llama\.cpp .* from /.test(line)) {
          deviceLog.push(line);
          console.log(`    ${line}`);
        }
      },
      ...(values["native-log"] === undefined
        ? {}
        : { onNativeLog: (line: string) => fs.appendFileSync(values["native-log"]!, `${line}\n`) }),
      onProgress: (progress) => {
        const point = { at: performance.now(), step: progress.step };
        first ??= point;
        last = point;
      },
    },
  );
  const outcome = await handle.done;
  if (outcome.status !== "completed") throw new Error(`trainer: ${JSON.stringify(outcome)}`);
  if (!first || !last || last.step <= first.step) throw new Error("fewer than 2 steps: raise --steps");
  return {
    tokensPerSecond: ((last.step - first.step) * ctx) / ((last.at - first.at) / 1000),
    peakRssMb: outcome.stats.peakRssBytes / 2 ** 20,
    outputMb: outcome.stats.outputBytes / 2 ** 20,
    parameters: outcome.stats.trainableParameters,
    wallSeconds: (performance.now() - started) / 1000,
    steps: outcome.stats.steps,
    ...(outcome.stats.peakGpuBytes === undefined ? {} : { peakGpuMb: outcome.stats.peakGpuBytes / 2 ** 20 }),
    deviceLog,
  };
}

const lora = { rank, alpha: 2 * rank, targets: [...LLAMA_CPP_LORA_TARGETS] };
const row = (name: string, m: Measured, reference?: Measured) => {
  results[name] = m;
  console.log(
    `  ${name.padEnd(18)} ${m.tokensPerSecond.toFixed(1).padStart(8)} tok/s  peak RSS ${m.peakRssMb.toFixed(0).padStart(6)} MB  ` +
      (m.peakGpuMb === undefined ? "" : `peak GPU ${m.peakGpuMb.toFixed(0).padStart(6)} MB  `) +
      `writes ${m.outputMb.toFixed(2).padStart(7)} MB  ${(m.parameters / 1e6).toFixed(2).padStart(7)} M trained  ` +
      `wall ${m.wallSeconds.toFixed(0).padStart(4)} s` +
      (reference
        ? `  | vs full: tok/s ${(m.tokensPerSecond / reference.tokensPerSecond).toFixed(2)}x, ` +
          `RSS ${(m.peakRssMb / reference.peakRssMb).toFixed(2)}x, size ${(m.outputMb / reference.outputMb).toFixed(3)}x`
        : ""),
  );
};

if (values.big) {
  // TinyLlama-1.1B's shape (2048 wide, 22 blocks, 32 heads, 4 KV heads, 5632 FFN) with the tiny vocabulary:
  // ~0.97 B parameters; cost does not depend on the weights' values.
  const f32 = path.join(work, "big-f32.gguf");
  const q40 = path.join(work, "big-q4_0.gguf");
  const info = await createTinyModel(f32, {
    embeddingLength: 2048,
    blockCount: 22,
    headCount: 32,
    headCountKv: 4,
    feedForwardLength: 5632,
    contextLength: 2048,
  });
  convertModel(f32, q40, "Q4_0", threads);
  fs.rmSync(f32);
  console.log(
    `random model of TinyLlama's shape: ${(info.parameters / 1e9).toFixed(2)} B parameters, Q4_0 ` +
      `${(fs.statSync(q40).size / 1e6).toFixed(0)} MB; ${threads} thread(s), context ${ctx}, ${steps} steps, ` +
      `${os.cpus().length} cores, load ${os.loadavg()[0]?.toFixed(1)}, gpu ${gpu}`,
  );
  row(`LoRA r${rank} on Q4_0`, await train({ baseModelPath: q40, method: "lora", lora }));
} else {
  const name = positionals[0] ?? "smollm2-135m";
  const source = requireFile(name.endsWith(".gguf") ? path.resolve(name) : modelPath(name as BenchModel));
  console.log(
    `model ${path.basename(source)}; ${threads} thread(s), context ${ctx}, ${steps} steps of ${ctx} tokens, ` +
      `LoRA rank ${rank} on ${lora.targets.join(",")}; ${os.cpus().length} cores, load ${os.loadavg()[0]?.toFixed(1)}, ` +
      `gpu ${gpu}${gpu === "cpu" ? "" : ` (${values.layers} layers)`}`,
  );
  let full: Measured | undefined;
  if (methods.includes("full")) {
    full = await train({ baseModelPath: source, method: "full", outputType: "Q8_0" });
    row("full (F32 → Q8_0)", full);
  }
  for (const type of methods.includes("lora") ? values.bases.split(",") : []) {
    const base = path.join(work, `base-${type}.gguf`);
    convertModel(source, base, type as TrainerOutputType, threads);
    row(`LoRA on ${type}`, await train({ baseModelPath: base, method: "lora", lora }), full);
    fs.rmSync(base);
  }
}
// --json FILE: the results, merged into FILE's when it already has some (runs with other settings, e.g. steps).
if (values.json) {
  const before = fs.existsSync(values.json)
    ? (JSON.parse(fs.readFileSync(values.json, "utf8")) as { results?: Record<string, Measured> }).results
    : undefined;
  const merged = { gpu, layers: values.layers, threads, ctx, rank, results: { ...before, ...results } };
  fs.writeFileSync(values.json, `${JSON.stringify(merged, null, 2)}\n`);
}
