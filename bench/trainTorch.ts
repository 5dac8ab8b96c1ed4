/**
 * Conduit's two trainers against the bare PyTorch + PEFT peer (bench/peft_peer.py), on the same GGUF,
 * windows, LoRA rank and targets, learning rates and threads, in one run: tokens/s and tokens per CPU-second of
 * each training loop (the first step, which allocates, left out), its first step, and peak RSS (peak GPU memory
 * on CUDA).
 *
 *   node --import tsx bench/trainTorch.ts [smollm2-135m|tinyllama-1b|file.gguf] [--steps 16] [--ctx 256]
 *     [--threads 1] [--blas-threads N|auto] [--rank 16] [--targets attn_q,...] [--device auto|cpu|cuda]
 *     [--skip peft,peft-f32,torch,llama.cpp,llama.cpp+blas,llama.cpp+blas-as-is]
 *   node --import tsx bench/trainTorch.ts smollm2-135m --export DIR [--steps 200]   # a job for worker.py --job
 *   node --import tsx bench/trainTorch.ts smollm2-135m --export DIR --task dates [--epochs 3] [--lr 1e-3]
 *     # the dates task of bench/quality.ts, answer-only, with a probe: the worker writes its logits for a
 *     # held-out pair, for bench/gpu/checkAdapter.ts to compare with llama.cpp serving the adapter
 *
 * - `torch`: Conduit's torch trainer as the scheduler starts it (the trainer process tokenizes and writes the
 *   windows, the worker trains): its own stats (`trainCpuSeconds`, `firstStepSeconds`).
 * - `llama.cpp`: the embedded trainer with its defaults and no setup (a quantized base is converted to Q8_0 and
 *   trained through).
 * - `llama.cpp+blas`: the same with the BLAS backend of `npm run setup:trainer` (CONDUIT_TRAINER_BLAS or
 *   .cache/trainer-blas), as the scheduler gives it: the base converted to F32 (when that copy fits a quarter of
 *   the memory) and trained through BLAS.
 * - `llama.cpp+blas-as-is`: the same through the base as it is, its products' weights converted to F32 one product
 *   at a time (a BLAS build that takes every weight type).
 * - `PEFT`: the textbook loop on the torch trainer's windows (`model(input_ids, labels)`, full logits), in bf16
 *   where the CPU has it (`peft`) and in F32 (`peft-f32`).
 * The torch trainer computes the output head only at the positions whose loss counts (`logits_to_keep`); the
 * samples here are trained in full, so that saves nothing and the comparison is of the same work.
 * `--export DIR` writes the torch worker's job (relative paths, the model expected at `DIR/../models/<file>`) and
 * trains nothing: a machine with Python and no Node (a GPU machine) runs `worker.py --job DIR/job.json` and
 * `peft_peer.py DIR/job.json` on it. `tinyllama-1b` is written by bench/makeModel.ts (F16) when missing.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { type LoraTarget } from "../src/contract/runs.ts";
import { LLAMA_CPP_LORA_TARGETS } from "../src/train/native/llamaCppTrainer.ts";
import { createTinyModel } from "../src/model/tinyModel.ts";
import { loadLlamaLib } from "../src/train/libllama/llamaLib.ts";
import type { TokenStore } from "../src/train/core/sampleStore.ts";
import { tokenizeSample } from "../src/train/core/tokenizeSample.ts";
import { prepare } from "../src/train/torch/runTorchTraining.ts";
import { PROJECT_TORCH_PYTHON } from "../src/train/torch/torchStatus.ts";
import { startTrainer, type AnyTrainerJob, type TrainingStats } from "../src/train/trainer.ts";
import { llamaCppJob, torchJob, type JobInput } from "../test/lib/trainerJob.ts";
import type { ModelRef } from "../src/model/types.ts";
import type { TrainingSample } from "../src/train/core/trainerJob.ts";
import { formatExample } from "../src/train/samples.ts";
import { corpus } from "./lib/corpus.ts";
import { datesTask, type Pair } from "./lib/qualityTasks.ts";
import { SHAPES } from "./makeModel.ts";
import { blasStatus } from "../src/train/native/blasBackend.ts";
import { modelPath, modelsDir, repoRoot, requireFile, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    steps: { type: "string" },
    ctx: { type: "string" },
    threads: { type: "string", default: "1" },
    "blas-threads": { type: "string" },
    rank: { type: "string", default: "16" },
    targets: { type: "string", default: LLAMA_CPP_LORA_TARGETS.filter((t) => t !== "output").join(",") },
    device: { type: "string", default: "cpu" },
    skip: { type: "string", default: "" },
    export: { type: "string" },
    task: { type: "string" },
    epochs: { type: "string", default: "3" },
    lr: { type: "string", default: "1e-3" },
  },
});
const name = positionals[0] ?? "smollm2-135m";
const big = name === "tinyllama-1b";
const steps = Number(values.steps ?? (big ? 4 : 16));
const ctx = Number(values.ctx ?? (big ? 512 : 256));
const threads = Number(values.threads);
const rank = Number(values.rank);
const targets = values.targets.split(",") as LoraTarget[];
const device = values.device as "auto" | "cpu" | "cuda";
const skip = new Set(values.skip.split(",").filter(Boolean));
const python = process.env.CONDUIT_PYTHON ?? PROJECT_TORCH_PYTHON;
const blas = blasStatus(process.env.CONDUIT_TRAINER_BLAS);

async function model(): Promise<string> {
  if (!big) return requireFile(name.endsWith(".gguf") ? path.resolve(name) : modelPath(name as BenchModel));
  const file = path.join(modelsDir, "tinyllama-1b-f16.gguf");
  if (!fs.existsSync(file)) {
    console.log(`writing ${file} (random weights, F16)`);
    await createTinyModel(file, { ...SHAPES["tinyllama-1b"], weightType: "F16" });
  }
  return file;
}

/** Corpus paragraphs joined into samples of 55–95% of a window's tokens, so every window is `ctx` long. */
function samplesFor(modelFile: string, count: number): string[] {
  const lib = loadLlamaLib();
  lib.ggml_backend_load_all_from_path(lib.binDir);
  lib.llama_backend_init();
  const params = lib.llama_model_default_params();
  params.vocab_only = true;
  const m = lib.llama_model_load_from_file(modelFile, params);
  if (m === null) throw new Error(`cannot read ${modelFile}`);
  const vocab = lib.llama_model_get_vocab(m);
  const tokens = (text: string) => tokenizeSample(lib, vocab, text).tokens.length;
  const samples: string[] = [];
  let current = "";
  for (const paragraph of corpus(4 * count * (ctx / 128))) {
    for (const sentence of paragraph.split(/(?<=\.) /)) {
      const next = current === "" ? sentence : `${current} ${sentence}`;
      if (tokens(next) > 0.95 * ctx) {
        if (tokens(current) >= 0.55 * ctx) samples.push(current);
        current = sentence;
      } else current = next;
      if (samples.length === count) break;
    }
    if (samples.length === count) break;
  }
  lib.llama_model_free(m);
  lib.llama_backend_free();
  if (samples.length < count) throw new Error(`only ${samples.length} samples of ${count}`);
  return samples;
}

function job(
  modelFile: string,
  samples: TrainingSample[],
  work: string,
  trainer: "torch" | "llama.cpp",
  blasLibrary: string | null = null,
  loraBase: "auto" | "as-is" = "auto",
): AnyTrainerJob {
  const task = values.task !== undefined;
  const input: JobInput = {
    method: "lora",
    lora: { rank, alpha: 2 * rank, targets },
    baseModelPath: modelFile,
    outputPath: path.join(work, `${trainer}-adapter.gguf`),
    workDir: path.join(work, trainer),
    samples,
    learningRate: task ? Number(values.lr) : 1e-4,
    epochs: task ? Number(values.epochs) : 1,
    ...(task ? {} : { maxSteps: steps }),
    contextSize: ctx,
    threads,
    lrSchedule: { kind: "cosine", minFraction: 0.1 },
    seed: 0,
    packing: true,
  };
  return trainer === "torch"
    ? torchJob({ ...input, options: { python, device, dtype: "auto" } })
    : llamaCppJob({
        ...input,
        options: {
          blasLibrary,
          loraBase,
          // `--blas-threads`: OpenBLAS's threads apart from ggml's; `auto` as the server's CONDUIT_TRAIN_THREADS=auto:
          // every core to start with, one fewer when steps time faster so.
          ...(values["blas-threads"] === undefined
            ? {}
            : values["blas-threads"] === "auto"
              ? { blasThreads: os.availableParallelism(), tuneBlasThreads: true }
              : { blasThreads: Number(values["blas-threads"]) }),
          ...(device === "cuda" ? { device: "cuda", gpuLayers: "all" } : {}),
        },
      });
}

/** Writes the torch worker's job into `dir` with paths relative to it, the model at `modelRef`. */
async function exportJob(
  modelFile: string,
  samples: TrainingSample[],
  dir: string,
  modelRef: string,
  probe?: number[],
): Promise<string> {
  fs.mkdirSync(dir, { recursive: true });
  const exported = { ...job(modelFile, samples, dir, "torch"), workDir: dir };
  if (exported.trainer !== "torch") throw new Error("not a torch job");
  const stores: TokenStore[] = [];
  try {
    const prepared = await prepare(
      exported,
      { ...exported.lora!, complexity: exported.complexity },
      { log: (line) => console.log(line), isCancelled: () => false, yieldToEventLoop: async () => undefined },
      stores,
    );
    if (prepared === undefined) throw new Error("cancelled");
    const relative = (file: string) => path.relative(dir, file);
    const worker = prepared.workerJob;
    const portable = {
      ...worker,
      baseModelPath: modelRef,
      train: { file: relative(worker.train.file) },
      examples: worker.examples.map((e) => ({
        ...e,
        file: relative(e.file),
        spansFile: relative(e.spansFile),
      })),
      lossesFile: null,
      checkpointDir: null,
      adapterFile: "trained.adapter.f32",
      probe: probe === undefined ? null : { tokens: probe, file: "probe.f32" },
    };
    const file = path.join(dir, "job.json");
    fs.writeFileSync(file, JSON.stringify(portable));
    return file;
  } finally {
    for (const store of stores) store.dispose();
    for (const f of fs.readdirSync(dir)) if (/\.(tokens|trained)$/.test(f)) fs.rmSync(path.join(dir, f));
  }
}

interface Row {
  name: string;
  tokensPerSecond: number;
  tokensPerCpuSecond: number;
  firstStepSeconds: number;
  peakRssMb: number;
  peakGpuMb?: number;
  note: string;
}

function fromStats(label: string, stats: TrainingStats, note: string): Row {
  const first = stats.firstStepSeconds ?? 0;
  const firstCpu = stats.firstStepCpuSeconds ?? 0;
  const tokens = stats.trainTokens - stats.windowSize;
  return {
    name: label,
    tokensPerSecond: tokens / (stats.trainSeconds - first),
    tokensPerCpuSecond:
      stats.trainCpuSeconds === undefined ? Number.NaN : tokens / (stats.trainCpuSeconds - firstCpu),
    firstStepSeconds: first,
    peakRssMb: stats.peakRssBytes / 2 ** 20,
    ...(stats.peakGpuBytes === undefined ? {} : { peakGpuMb: stats.peakGpuBytes / 2 ** 20 }),
    note,
  };
}

async function conduit(
  modelFile: string,
  samples: string[],
  work: string,
  trainer: "torch" | "llama.cpp",
  blasLibrary: string | null = null,
  loraBase: "auto" | "as-is" = "auto",
): Promise<Row> {
  const logs: string[] = [];
  const outcome = await startTrainer(job(modelFile, samples, work, trainer, blasLibrary, loraBase), {
    onLog: (line) => logs.push(line),
  }).done;
  if (outcome.status !== "completed")
    throw new Error(`${trainer}: ${JSON.stringify(outcome)}\n${logs.join("\n")}`);
  // What the thread tuner chose (`--blas-threads auto`).
  for (const line of logs.filter((l) => /OpenBLAS on/.test(l))) console.log(line);
  const where = logs.find((line) => /PyTorch|converting the base|LoRA rank/.test(line)) ?? "";
  const label = `Conduit ${trainer}${blasLibrary === null ? "" : " + BLAS"}${loraBase === "as-is" ? " (base as it is)" : ""}`;
  return fromStats(label, outcome.stats, where.replace(/^trainer: /, "").slice(0, 90));
}

function peer(jobFile: string, dtype: "auto" | "f32"): Promise<Row> {
  return new Promise((resolve, reject) => {
    const args = [path.join(repoRoot, "bench", "peft_peer.py"), jobFile, "--dtype", dtype];
    const child = spawn(python, args, {
      stdio: ["ignore", "pipe", "inherit"],
      env: { ...process.env, HF_HUB_OFFLINE: "1", TQDM_DISABLE: "1", OMP_NUM_THREADS: String(threads) },
    });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    child.on("close", (code) => {
      if (code !== 0) return reject(new Error(`peft_peer.py exited with ${code}`));
      const r = JSON.parse(out.trim().split("\n").at(-1)!) as Record<string, number | string>;
      resolve({
        name: `bare PEFT ${r.dtype}`,
        tokensPerSecond: r.tokensPerSecond as number,
        tokensPerCpuSecond: r.tokensPerCpuSecond as number,
        firstStepSeconds: r.firstStepSeconds as number,
        peakRssMb: (r.peakRssBytes as number) / 2 ** 20,
        ...(r.peakGpuBytes === undefined ? {} : { peakGpuMb: (r.peakGpuBytes as number) / 2 ** 20 }),
        note: `PyTorch ${r.torch} on ${r.device}, ${r.dtype}`,
      });
    });
  });
}

/** The dates task's training pairs as the service formats them, and a held-out pair's tokens (prompt and answer). */
async function taskSamples(modelFile: string): Promise<{ samples: TrainingSample[]; probe: number[] }> {
  const base = { id: path.basename(modelFile, ".gguf"), path: modelFile } as ModelRef;
  const { train, heldOut } = datesTask.split(datesTask.defaultPairs, "random");
  const format = async (p: Pair) =>
    (await formatExample(base, datesTask.system, p.input, p.output, false)).sample;
  const samples = await Promise.all(train.map(format));
  const lib = loadLlamaLib();
  lib.ggml_backend_load_all_from_path(lib.binDir);
  lib.llama_backend_init();
  const params = lib.llama_model_default_params();
  params.vocab_only = true;
  const m = lib.llama_model_load_from_file(modelFile, params);
  if (m === null) throw new Error(`cannot read ${modelFile}`);
  const probe = Array.from(
    tokenizeSample(lib, lib.llama_model_get_vocab(m), await format(heldOut[0]!)).tokens,
  );
  lib.llama_model_free(m);
  lib.llama_backend_free();
  return { samples, probe };
}

const modelFile = await model();
if (values.export !== undefined) {
  const dir = path.resolve(values.export);
  const modelRef = path.join("..", "models", path.basename(modelFile));
  if (values.task === "dates") {
    const { samples, probe } = await taskSamples(modelFile);
    await exportJob(modelFile, samples, dir, modelRef, probe);
  } else if (values.task !== undefined) throw new Error(`unknown --task ${values.task}`);
  else await exportJob(modelFile, samplesFor(modelFile, steps), dir, modelRef);
  console.log(`wrote ${dir}/job.json on ${path.basename(modelFile)} (expected at ../models/)`);
} else {
  const samples = samplesFor(modelFile, steps);
  const work = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-torch-"));
  process.on("exit", () => fs.rmSync(work, { recursive: true, force: true }));
  console.log(
    `${path.basename(modelFile)}: ${steps} steps of ${ctx}-token windows, LoRA rank ${rank} on ${targets.join(",")}, ` +
      `${threads} thread(s), device ${device}; ${os.cpus().length} cores (${os.cpus()[0]?.model}), load ${os.loadavg()[0]?.toFixed(2)}`,
  );
  const rows: Row[] = [];
  if (!skip.has("peft") || !skip.has("peft-f32")) {
    const jobFile = await exportJob(modelFile, samples, path.join(work, "peer"), modelFile);
    if (!skip.has("peft")) rows.push(await peer(jobFile, "auto"));
    if (!skip.has("peft-f32")) rows.push(await peer(jobFile, "f32"));
  }
  if (!skip.has("torch")) rows.push(await conduit(modelFile, samples, work, "torch"));
  if (!skip.has("llama.cpp")) rows.push(await conduit(modelFile, samples, work, "llama.cpp"));
  if (!skip.has("llama.cpp+blas")) {
    if (blas.available) rows.push(await conduit(modelFile, samples, work, "llama.cpp", blas.library));
    else console.log(`llama.cpp + BLAS skipped: ${blas.reason}`);
  }
  // A BLAS build that takes every weight type trains a base whose F32 copy is over budget as it is; this row does
  // so whatever the budget.
  if (!skip.has("llama.cpp+blas-as-is") && blas.available && blas.quantized)
    rows.push(await conduit(modelFile, samples, work, "llama.cpp", blas.library, "as-is"));
  const ratio = (r: Row, dtype: string) => {
    const reference = rows.find((p) => p.name === `bare PEFT ${dtype}`);
    return reference ? (r.tokensPerCpuSecond / reference.tokensPerCpuSecond).toFixed(2) : "-";
  };
  console.log(`load after: ${os.loadavg()[0]?.toFixed(2)}`);
  console.log("| trainer | tok/s | tok/CPU-s | × PEFT F32 | × PEFT bf16 | first step | peak RSS | what |");
  console.log("|---|---|---|---|---|---|---|---|");
  for (const r of rows)
    console.log(
      `| ${r.name} | ${r.tokensPerSecond.toFixed(1)} | ${r.tokensPerCpuSecond.toFixed(1)} | ` +
        `${ratio(r, "f32")} | ${ratio(r, "bf16")} | ` +
        `${r.firstStepSeconds.toFixed(2)} s | ${r.peakRssMb.toFixed(0)} MB` +
        `${r.peakGpuMb === undefined ? "" : ` (GPU ${r.peakGpuMb.toFixed(0)} MB)`} | ${r.note} |`,
    );
}
