/**
 * The torch trainer's job, driven from the trainer child process: Conduit tokenizes the samples with the
 * model's own llama.cpp tokenizer and plans the run as every trainer does (`prepareTrainingData`), writes
 * every window the run will see to the work directory, and hands the job to the PyTorch + PEFT worker
 * (`worker.py`), whose messages it relays. The worker writes the trained adapter's tensors raw in llama.cpp's
 * layout; the GGUF adapter is written here, by the same writer as the llama.cpp trainer's, so both trainers'
 * adapters are served the same way.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { killedBy } from "../core/killedBy.ts";
import type {
  ExampleLoss,
  PreferenceJobOptions,
  TrainerJob,
  TrainerProgress,
  TrainingStats,
} from "../core/trainerJob.ts";
import type { TrainingHooks, TrainingResult } from "../core/TrainerBackend.ts";
import { prepareTrainingData } from "../core/prepareTrainingData.ts";
import type { TorchOptions } from "./torchTrainer.ts";
import { learningRateAt } from "../core/learningRate.ts";
import { findBinDir, findLibrary, loadLlamaLib, type LlamaLib, type Pointer } from "../libllama/llamaLib.ts";
import {
  loraWeights,
  servedAdapterType,
  writeTrainedAdapter,
  type AdapterTensorType,
  type LoraSpec,
  type LoraWeight,
} from "../core/loraAdapter.ts";
import { readModelFile, type ModelFileInfo } from "../core/modelFile.ts";
import type { TrainingWindow, WindowSpan } from "../core/packWindows.ts";
import { CheckpointDir, jobFingerprint, keptSteps, type KeptCheckpoint } from "../core/checkpoint.ts";
import type { TokenStore } from "../core/sampleStore.ts";
import { TrainingPlan } from "../core/trainingPlan.ts";
import { trainingWarnings } from "../core/trainingWarnings.ts";
import { tokenizeSamples } from "../core/tokenizeSample.ts";
import { preferenceWindow, writePreferenceInputs, type PreferenceWorkerJob } from "./preferenceInputs.ts";

/** A job of the torch trainer. */
type TorchJob = TrainerJob<TorchOptions>;

/** The worker program, next to this file. */
export const TORCH_WORKER = fileURLToPath(new URL("./worker.py", import.meta.url));

/** Where the worker keeps each epoch's adapter raw in the checkpoint directory (`KEPT_DIR` in worker.py). */
const TORCH_KEPT_DIR = "torch-kept";

/** How long a cancelled worker gets to stop before it is killed (it stops at once, mid-step). */
const CANCEL_KILL_MS = 3_000;
/** Lines of the worker's stderr kept to explain a failure. */
const STDERR_TAIL_LINES = 12;

/** What the worker is given (`worker.py` reads these fields). */
export interface TorchWorkerJob {
  baseModelPath: string;
  windowSize: number;
  train: { file: string };
  eval: { file: string } | null;
  stepsPerEpoch: number[];
  /** The learning rate of every step. */
  learningRates: number[];
  /** Steps (counted from 1) after which the run evaluates, keeps the best weights and checkpoints. */
  evaluationPoints: number[];
  examples: { split: "train" | "eval"; file: string; spansFile: string; count: number }[];
  lossesFile: string | null;
  lora: { rank: number; alpha: number; targets: string[]; weights: LoraWeight[] };
  optimizer: "adamw" | "sgd";
  weightDecay: number;
  earlyStoppingPatience: number | null;
  checkpointDir: string | null;
  fingerprint: string;
  seed: number;
  threads: number;
  device: "auto" | "cpu" | "cuda";
  dtype: "auto" | "bf16" | "f32";
  /** Where the trained adapter's tensors are written raw. */
  adapterFile: string;
  probe: { tokens: number[]; file: string } | null;
  /** Where the adapter is also saved as PEFT files; `null`: not. */
  peftDir: string | null;
  cacheDir: string | null;
  /** ggml's base library, whose dequantization the worker uses to read a quantized GGUF base; `null`: gguf-py's. */
  ggmlLibrary: string | null;
  /** Windows one optimizer step averages (`TorchOptions.windowsPerStep`). */
  windowsPerStep: number;
  /** Whether the worker chooses its CPU threads between steps (`TorchOptions.tuneThreads`). */
  tuneThreads: boolean;
  /** Preference tuning (`preferenceInputs.ts`): each step's window is an example's preferred conversation. */
  dpo: PreferenceWorkerJob | null;
}

/** The worker's `done` message. */
interface WorkerDone {
  type: "done";
  stats: Omit<TrainingStats, "warnings" | "outputBytes" | "finalTrainLoss"> & {
    finalTrainLoss: number | null;
    device: string;
    dtype: string;
  };
  evalHistory: { epoch: number; step: number; trainLoss: number; evalLoss: number }[];
  examples: { train: ExampleLoss[]; eval: ExampleLoss[] };
}

type WorkerMessage =
  | { type: "log"; line: string }
  | ({ type: "progress" } & TrainerProgress)
  | WorkerDone
  /** `code`: the errno name of an OSError that ended the job (`ENOSPC` on a full disk). */
  | { type: "error"; message: string; code?: string }
  | { type: "cancelled" };

export async function runTorchTraining(job: TorchJob, hooks: TrainingHooks): Promise<TrainingResult> {
  if (job.method !== "lora" || job.lora === null)
    throw new Error('trainer: the torch trainer trains LoRA adapters only ("method": "lora")');
  const startedAt = performance.now();
  const lora: LoraSpec = { ...job.lora, complexity: job.complexity };
  fs.mkdirSync(job.workDir, { recursive: true });
  const stores: TokenStore[] = [];
  try {
    const prepared = await prepare(job, lora, hooks, stores);
    if (prepared === undefined) return { status: "cancelled" };
    const { workerJob, baseInfo, weights } = prepared;
    hooks.log(
      `trainer: ${workerJob.stepsPerEpoch.reduce((a, b) => a + b, 0)} windows of ${workerJob.windowSize} tokens ` +
        `written for the torch worker; starting ${job.options.python}`,
    );
    const outcome = await runWorker(job.options, workerJob, job.workDir, hooks);
    if (outcome.type === "cancelled") return { status: "cancelled" };

    const type = servedAdapterType(job.outputType);
    if (job.checkpointDir !== null)
      await keepEpochAdapters(new CheckpointDir(job.checkpointDir), baseInfo, weights, lora, type, hooks);
    hooks.log(`trainer: writing the LoRA adapter (${weights.length} weights, ${type})`);
    const values = readAdapterValues(workerJob.adapterFile, weights, lora.rank);
    const outputBytes = await writeTrainedAdapter(baseInfo, job.outputPath, weights, lora, values, type);
    hooks.log(
      `trainer: wrote the LoRA adapter (${(outputBytes / 2 ** 20).toFixed(2)} MiB) to ${job.outputPath}`,
    );
    const { device: _device, dtype: _dtype, ...stats } = outcome.stats;
    const finalTrainLoss = stats.finalTrainLoss ?? Number.NaN;
    const best =
      stats.bestEvalLoss === undefined
        ? null
        : { loss: stats.bestEvalLoss, epoch: stats.bestEpoch ?? 0, step: stats.bestStep ?? 0 };
    const warnings = trainingWarnings(finalTrainLoss, outcome.evalHistory, best);
    for (const warning of warnings) hooks.log(`trainer: warning: ${warning}`);
    return {
      status: "completed",
      outputPath: job.outputPath,
      examples: outcome.examples,
      stats: {
        ...stats,
        finalTrainLoss,
        warnings,
        outputBytes,
        elapsedSeconds: (performance.now() - startedAt) / 1000,
      },
    };
  } finally {
    for (const store of stores) store.dispose();
    for (const name of fs.readdirSync(job.workDir))
      if (/\.(windows|spans\.json|adapter\.f32)$|^worker-job\.json$/.test(name))
        fs.rmSync(path.join(job.workDir, name), { force: true });
  }
}

/**
 * Tokenizes and plans the job with llama.cpp (the model's vocabulary only) and writes the worker's inputs
 * to its work directory (benches also hand them to the worker on another machine: `worker.py --job`).
 * `undefined` when cancelled meanwhile. The token stores are pushed to `stores`, for the caller to dispose.
 */
export async function prepare(
  job: TorchJob,
  lora: LoraSpec,
  hooks: Pick<TrainingHooks, "log" | "isCancelled" | "yieldToEventLoop">,
  stores: TokenStore[],
) {
  const lib = loadLlamaLib({ gpu: "cpu" });
  lib.ggml_backend_load_all_from_path(lib.binDir);
  lib.llama_backend_init();
  let model: Pointer | null = null;
  try {
    const baseInfo = readModelFile(lib, job.baseModelPath);
    const weights = loraWeights(baseInfo, lora);
    const params = lib.llama_model_default_params();
    params.vocab_only = true;
    model = lib.llama_model_load_from_file(job.baseModelPath, params);
    if (model === null) throw new Error(`trainer: could not read the vocabulary of ${job.baseModelPath}`);
    const data = await prepareTrainingData(lib, model, job, hooks, stores);
    if (data === undefined) return undefined;
    const { plan } = data;
    hooks.log(
      `trainer: ${plan.train.size} samples (${plan.train.tokens} tokens, ${data.trainedTokens} trained on) in ` +
        `windows of ${plan.windowSize} tokens, ${plan.epochs} epochs, ${plan.totalSteps} steps` +
        (plan.evalWindows.length > 0 ? `, ${plan.evalSet.size} eval samples` : ""),
    );
    const workerJob =
      job.preference === null
        ? await writeWorkerInputs(job, plan, weights, hooks)
        : await writePreferenceJob(job, job.preference, lib, model, plan, weights, hooks, stores);
    if (workerJob === undefined) return undefined;
    return { workerJob, baseInfo, weights };
  } finally {
    if (model !== null) lib.llama_model_free(model);
    lib.llama_backend_free();
  }
}

/**
 * A preference job's worker inputs: the non-preferred conversations tokenized as the preferred ones were, and
 * the windows of both (`preferenceInputs.ts`); the worker measures its per-example losses on those.
 */
async function writePreferenceJob(
  job: TorchJob,
  preference: PreferenceJobOptions,
  lib: LlamaLib,
  model: Pointer,
  plan: TrainingPlan,
  weights: LoraWeight[],
  hooks: Pick<TrainingHooks, "log" | "isCancelled" | "yieldToEventLoop">,
  stores: TokenStore[],
): Promise<TorchWorkerJob | undefined> {
  if (job.samplesFile === null)
    throw new Error("trainer: a preference job reads its examples from a file (samplesFile)");
  const vocab = lib.llama_model_get_vocab(model);
  const rejectedOf = async (source: string | null, name: string) =>
    source === null
      ? tokenizeSamples(lib, vocab, [], job.workDir, name, hooks, stores)
      : tokenizeSamples(lib, vocab, source, job.workDir, name, hooks, stores, "rejected");
  const train = await rejectedOf(job.samplesFile, "train-rejected");
  const held = train && (await rejectedOf(job.evalSamplesFile, "eval-rejected"));
  if (train === undefined || held === undefined) return undefined;
  const rejected = { train: train.store, eval: held.store };
  const window = preferenceWindow(plan, rejected, job.contextSize, lib.llama_model_n_ctx_train(model));
  const write = (file: string, windows: Iterable<TrainingWindow>) => {
    const out = new WindowFile(file, window.size);
    try {
      for (const w of windows) out.write(w);
      out.close();
    } finally {
      out.dispose();
    }
  };
  const inputs = await writePreferenceInputs({ ...job, preference }, plan, rejected, window, write, hooks);
  if (inputs === undefined) return undefined;
  hooks.log(
    `trainer: preference tuning (DPO, beta ${preference.beta}) on ${plan.train.size} examples` +
      (plan.evalSet.size > 0 ? ` (${plan.evalSet.size} held out)` : "") +
      `, windows of ${window.size} tokens, starting from ` +
      (preference.initAdapterPath === null ? "the base model" : "the adapter of the run it continues"),
  );
  return {
    ...(await workerJobFields(job, plan, weights)),
    windowSize: window.size,
    train: { file: inputs.trainFile },
    eval: null,
    evaluationPoints: inputs.evaluationPoints,
    examples: [],
    dpo: inputs.dpo,
  };
}

/** node-llama-cpp's prebuilt libggml-base (the one that serves the base), or null where there is none. */
function ggmlBaseLibrary(): string | null {
  try {
    return findLibrary(findBinDir("cpu"), /^libggml-base\.so$/);
  } catch {
    return null;
  }
}

/** The worker job's fields that do not depend on the windows. */
async function workerJobFields(job: TorchJob, plan: TrainingPlan, weights: LoraWeight[]) {
  return {
    baseModelPath: job.baseModelPath,
    stepsPerEpoch: plan.stepsPerEpoch,
    learningRates: Array.from({ length: plan.totalSteps }, (_, step) =>
      learningRateAt(job.learningRate, job.lrSchedule, step, plan.totalSteps),
    ),
    lossesFile: job.lossesFile,
    lora: { rank: job.lora!.rank, alpha: job.lora!.alpha, targets: job.lora!.targets, weights },
    optimizer: job.optimizer,
    weightDecay: job.weightDecay,
    earlyStoppingPatience: job.earlyStoppingPatience,
    checkpointDir: job.checkpointDir,
    fingerprint: await jobFingerprint(job),
    seed: job.seed,
    threads: job.threads,
    device: job.options.device,
    dtype: job.options.dtype,
    adapterFile: path.join(job.workDir, "trained.adapter.f32"),
    probe: job.options.probe,
    peftDir: job.options.peftDir ?? null,
    cacheDir: job.options.cacheDir,
    ggmlLibrary: ggmlBaseLibrary(),
    windowsPerStep: job.options.windowsPerStep,
    tuneThreads: job.options.tuneThreads ?? false,
  };
}

/** Writes every window of the plan (training in step order, eval, per-example passes) and returns the worker's job. */
async function writeWorkerInputs(
  job: TorchJob,
  plan: TrainingPlan,
  weights: LoraWeight[],
  hooks: Pick<TrainingHooks, "isCancelled" | "yieldToEventLoop">,
): Promise<TorchWorkerJob | undefined> {
  const file = (name: string) => path.join(job.workDir, name);
  const evaluationPoints: number[] = [];
  const train = new WindowFile(file("train.windows"), plan.windowSize);
  try {
    let step = 0;
    for (const epoch of plan.epochPlans()) {
      for (let k = 0; k < epoch.steps; k++) {
        train.write(plan.trainWindow(epoch, k));
        step += 1;
        if (TrainingPlan.evaluatesAfter(epoch, k)) evaluationPoints.push(step);
        if (step % 256 === 0) {
          await hooks.yieldToEventLoop();
          if (hooks.isCancelled()) return undefined;
        }
      }
    }
    train.close();
  } finally {
    train.dispose();
  }
  let evalFile: string | null = null;
  if (plan.evalWindows.length > 0) {
    evalFile = file("eval.windows");
    const out = new WindowFile(evalFile, plan.windowSize);
    try {
      for (let k = 0; k < plan.evalWindows.length; k++) out.write(plan.evalWindow(k));
      out.close();
    } finally {
      out.dispose();
    }
  }
  const examples: TorchWorkerJob["examples"] = [];
  for (const [split, store] of [
    ["train", plan.train],
    ["eval", plan.evalSet],
  ] as const) {
    const inOrder = plan.inOrder(store);
    const windowsFile = file(`examples-${split}.windows`);
    const spansFile = file(`examples-${split}.spans.json`);
    const out = new WindowFile(windowsFile, plan.windowSize);
    const spans: [number, number, number][][] = [];
    try {
      for (let k = 0; k < inOrder.windows.length; k++) {
        const window = inOrder.window(k);
        out.write(window);
        spans.push(window.spans.map((s: WindowSpan) => [s.sample, s.start, s.length]));
        if (k % 256 === 255) {
          await hooks.yieldToEventLoop();
          if (hooks.isCancelled()) return undefined;
        }
      }
      out.close();
    } finally {
      out.dispose();
    }
    fs.writeFileSync(spansFile, JSON.stringify(spans));
    examples.push({ split, file: windowsFile, spansFile, count: store.size });
  }
  return {
    ...(await workerJobFields(job, plan, weights)),
    windowSize: plan.windowSize,
    train: { file: file("train.windows") },
    eval: evalFile === null ? null : { file: evalFile },
    evaluationPoints,
    examples,
    dpo: null,
  };
}

/**
 * Windows as the worker reads them: packed little-endian records of int32 sample tokens, int32 input[W],
 * int32 labels[W] and uint8 loss mask[W], written through a buffer and fsynced on close.
 */
class WindowFile {
  private readonly fd: number;
  private readonly record: Buffer;
  private readonly buffer: Buffer;
  private used = 0;

  constructor(
    file: string,
    private readonly size: number,
  ) {
    this.fd = fs.openSync(file, "w");
    this.record = Buffer.alloc(4 + size * 9);
    this.buffer = Buffer.alloc(Math.max(this.record.length, 1 << 20));
  }

  write(window: TrainingWindow): void {
    const { size, record } = this;
    record.writeInt32LE(window.sampleTokens, 0);
    Buffer.from(window.input.buffer, window.input.byteOffset, size * 4).copy(record, 4);
    Buffer.from(window.labels.buffer, window.labels.byteOffset, size * 4).copy(record, 4 + size * 4);
    Buffer.from(window.lossMask.buffer, window.lossMask.byteOffset, size).copy(record, 4 + size * 8);
    if (this.used + record.length > this.buffer.length) this.flush();
    record.copy(this.buffer, this.used);
    this.used += record.length;
  }

  close(): void {
    this.flush();
    fs.fsyncSync(this.fd);
  }

  dispose(): void {
    try {
      fs.closeSync(this.fd);
    } catch {
      // already closed
    }
  }

  private flush(): void {
    for (let done = 0; done < this.used;) done += fs.writeSync(this.fd, this.buffer, done, this.used - done);
    this.used = 0;
  }
}

/**
 * Writes the epoch-end adapters the worker kept raw (`TORCH_KEPT_DIR`, across every attempt of the run) as the
 * run's kept checkpoints, GGUF adapters of the type it serves, as the llama.cpp trainer keeps them; each raw file
 * is removed once written, and so is what a killed attempt left half-written.
 */
async function keepEpochAdapters(
  dir: CheckpointDir,
  baseInfo: ModelFileInfo,
  weights: readonly LoraWeight[],
  lora: LoraSpec,
  type: AdapterTensorType,
  hooks: Pick<TrainingHooks, "log">,
): Promise<void> {
  const raw = path.join(dir.dir, TORCH_KEPT_DIR);
  const steps = keptSteps(raw);
  for (const step of steps) {
    const name = path.join(raw, `step-${step}`);
    const checkpoint = JSON.parse(fs.readFileSync(`${name}.json`, "utf8")) as KeptCheckpoint;
    const values = readAdapterValues(`${name}.f32`, weights, lora.rank);
    await dir.writeKept(checkpoint, async (file) => {
      await writeTrainedAdapter(baseInfo, file, weights, lora, values, type);
    });
    fs.rmSync(`${name}.f32`, { force: true });
    fs.rmSync(`${name}.json`, { force: true });
  }
  // What is left is a killed worker's: a file it was writing (`*.tmp-<pid>`), a step's tensors without its JSON.
  if (fs.existsSync(raw))
    for (const entry of fs.readdirSync(raw))
      fs.rmSync(path.join(raw, entry), { recursive: true, force: true });
  if (steps.length > 0)
    hooks.log(`trainer: kept the adapters of steps ${steps.join(", ")} (${type}) as the run's checkpoints`);
}

/** The worker's raw adapter file back as the tensors `writeTrainedAdapter` takes. */
export function readAdapterValues(
  file: string,
  weights: readonly LoraWeight[],
  rank: number,
): Map<string, Float32Array> {
  const bytes = fs.readFileSync(file);
  const values = new Map<string, Float32Array>();
  let at = 0;
  const take = (count: number) => {
    const data = new Float32Array(count);
    if (at + count * 4 > bytes.length) throw new Error(`trainer: ${file} ends early`);
    Buffer.from(data.buffer).set(bytes.subarray(at, at + count * 4));
    at += count * 4;
    return data;
  };
  for (const weight of weights) {
    values.set(`${weight.name}.lora_a`, take(weight.inputs * rank));
    values.set(`${weight.name}.lora_b`, take(rank * weight.outputs));
  }
  if (at !== bytes.length)
    throw new Error(`trainer: ${file} holds ${bytes.length - at} bytes more than the adapter`);
  return values;
}

/**
 * How the worker is started: alone, it reads its job from stdin and takes a cancel message there; with more
 * than one rank, `torchrun` (PyTorch's own launcher, run by the same Python) starts the ranks on this machine,
 * which share stdin, so the job is a file next to the windows and a cancel closes stdin.
 */
export function workerCommand(
  options: Pick<TorchOptions, "ranks" | "nodes" | "rendezvous">,
  jobFile: string,
): { args: string[]; jobOnStdin: boolean } {
  if (options.ranks <= 1 && options.nodes <= 1) return { args: ["-u", TORCH_WORKER], jobOnStdin: true };
  const { rendezvous } = options;
  const where =
    options.nodes > 1 && rendezvous !== null
      ? // This machine is the first (its first rank is the run's rank 0) and hosts the rendezvous.
        [
          `--nnodes=${options.nodes}`,
          "--node-rank=0",
          `--master-addr=${rendezvous.host}`,
          `--master-port=${rendezvous.port}`,
        ]
      : // One machine: a rendezvous of its own on a free port, so that runs never meet.
        ["--standalone", "--nnodes=1"];
  return {
    args: [
      "-u",
      "-m",
      "torch.distributed.run",
      ...where,
      `--nproc-per-node=${options.ranks}`,
      TORCH_WORKER,
      "--job",
      jobFile,
      "--parent",
    ],
    jobOnStdin: false,
  };
}

/**
 * Runs the worker on a job and relays its logs and progress. Its stderr (Python's own output) goes to this
 * process's stderr, which the parent keeps as the native log; a failure names its last lines.
 */
function runWorker(
  options: TorchOptions,
  workerJob: TorchWorkerJob,
  workDir: string,
  hooks: TrainingHooks,
): Promise<WorkerDone | { type: "cancelled" }> {
  const { python } = options;
  const jobFile = path.join(workDir, "worker-job.json");
  const command = workerCommand(options, jobFile);
  if (!command.jobOnStdin) fs.writeFileSync(jobFile, JSON.stringify(workerJob));
  return new Promise((resolve, reject) => {
    const child = spawn(python, command.args, {
      stdio: ["pipe", "pipe", "pipe"],
      env: {
        ...process.env,
        PYTHONUNBUFFERED: "1",
        // Nothing is downloaded: the model is the GGUF file, the tokenizer is llama.cpp's.
        HF_HUB_OFFLINE: "1",
        TRANSFORMERS_OFFLINE: "1",
        TQDM_DISABLE: "1",
        // The ranks share the threads (the worker sets the same count for PyTorch's own pool).
        OMP_NUM_THREADS: String(Math.max(1, Math.floor(workerJob.threads / Math.max(1, options.ranks)))),
      },
    });
    let final: WorkerMessage | undefined;
    let spawnError: Error | undefined;
    let cancelSent = false;
    const stderrTail: string[] = [];
    readline.createInterface({ input: child.stderr, crlfDelay: Infinity }).on("line", (line) => {
      process.stderr.write(`${line}\n`);
      stderrTail.push(line);
      if (stderrTail.length > STDERR_TAIL_LINES) stderrTail.shift();
    });
    readline.createInterface({ input: child.stdout, crlfDelay: Infinity }).on("line", (line) => {
      let message: WorkerMessage;
      try {
        message = JSON.parse(line) as WorkerMessage;
      } catch {
        process.stderr.write(`${line}\n`); // a library printing to stdout: kept as native output
        return;
      }
      if (message.type === "log") hooks.log(message.line);
      else if (message.type === "progress") {
        const { type: _type, ...progress } = message;
        hooks.progress(progress);
      } else final = message;
    });
    child.on("error", (error) => (spawnError ??= error));
    child.stdin.on("error", () => undefined); // a worker that died is reported on close
    if (command.jobOnStdin) child.stdin.write(`${JSON.stringify({ type: "job", job: workerJob })}\n`);
    const poll = setInterval(() => {
      if (cancelSent || !hooks.isCancelled()) return;
      cancelSent = true;
      if (command.jobOnStdin) child.stdin.write(`${JSON.stringify({ type: "cancel" })}\n`);
      else child.stdin.end();
      setTimeout(() => child.kill("SIGKILL"), CANCEL_KILL_MS).unref();
    }, 100);
    child.on("close", (code, signal) => {
      clearInterval(poll);
      if (final?.type === "done") return resolve(final);
      if (final?.type === "cancelled" || cancelSent) return resolve({ type: "cancelled" });
      if (final?.type === "error")
        return reject(
          Object.assign(
            new Error(withTail(final.message, stderrTail)),
            final.code ? { code: final.code } : {},
          ),
        );
      const how =
        spawnError !== undefined
          ? `could not be started (${python}: ${spawnError.message})`
          : signal !== null
            ? killedBy(signal)
            : `exited with code ${code}`;
      reject(new Error(withTail(`trainer: the torch worker ${how}`, stderrTail)));
    });
  });
}

function withTail(message: string, tail: readonly string[]): string {
  const last = tail.filter((line) => line.trim() !== "").slice(-4);
  return last.length === 0 ? message : `${message}; last output: ${last.join(" | ")}`;
}
