/**
 * The training loop: llama.cpp's own training API (`llama_opt_init` / `llama_opt_epoch`, ggml-opt)
 * driven through koffi. Runs inside the trainer child process only: it blocks its thread for a whole
 * optimizer step, sets process-global llama.cpp state, and a native crash must not take the API down.
 */
import fs from "node:fs";
import path from "node:path";
import koffi from "koffi";
import type { ExampleLoss, TrainerJob, TrainingStats } from "../core/trainerJob.ts";
import { totalMemory, type TrainingHooks, type TrainingResult } from "../core/TrainerBackend.ts";
import { prepareTrainingData } from "../core/prepareTrainingData.ts";
import type { LlamaCppOptions } from "./llamaCppTrainer.ts";
import { learningRateAt } from "../core/learningRate.ts";
import {
  GGML_OPT_OPTIMIZER_TYPE_ADAMW,
  GGML_OPT_OPTIMIZER_TYPE_SGD,
  GGML_OP_CROSS_ENTROPY_LOSS_BACK_NAME,
  GGML_OP_CROSS_ENTROPY_LOSS_NAME,
  GGML_OP_OPT_STEP_SGD,
  GGML_TYPE_F32,
  GGML_TYPE_I32,
  GgmlOptOptimizerParams,
  LLAMA_FLASH_ATTN_TYPE_DISABLED,
  LLAMA_FTYPES,
  LLAMA_LOAD_MODE_NONE,
  OptParamFilter,
  SchedEvalCallback,
  GGML_OP_OPT_STEP_ADAMW,
  GGML_OP_MUL_MAT_NAME,
  loadLlamaLib,
  opByName,
  tensorOp,
  tensorSource,
  tensorNb,
  tensorNe,
  tensorType,
  type LlamaLib,
  type Pointer,
} from "../libllama/llamaLib.ts";
import type { TrainingWindow } from "../core/packWindows.ts";
import type { TokenStore } from "../core/sampleStore.ts";
import { TrainingPlan } from "../core/trainingPlan.ts";
import { trainingWarnings } from "../core/trainingWarnings.ts";
import { BestCheckpoint } from "../core/bestCheckpoint.ts";
import { CheckpointDir, jobFingerprint, type CheckpointState } from "../core/checkpoint.ts";
import { deviceMemory, GpuMemoryWatch, gpuDevices, OffloadAudit, type GpuDevice } from "./devices.ts";
import { writeHeadroomAdapter } from "./graphHeadroom.ts";
import {
  loraWeights,
  servedAdapterType,
  writeInitialAdapter,
  writeTrainedAdapter,
  type LoraSpec,
  type LoraWeight,
} from "../core/loraAdapter.ts";
import {
  bf16Products,
  buildOf,
  loadBlasBackend,
  openBlasThreads,
  TRAINER_SETUP_COMMAND,
} from "./blasBackend.ts";
import { ThreadTuner } from "../core/threadTuner.ts";
import { loraBaseConversion, type LoraBaseOptions } from "./loraBase.ts";
import { readModelFile, type ModelFileInfo } from "../core/modelFile.ts";
import { isTrainableTensor } from "./trainableTensor.ts";

/** A job of the llama.cpp trainer. */
type LlamaCppJob = TrainerJob<LlamaCppOptions>;

/** The latest checkpoint is written at most this often (and at the first evaluation point). */
const CHECKPOINT_INTERVAL_MS = 10_000;
const PROGRESS_INTERVAL_MS = 500;
/** With a BLAS backend, LoRA trains on an F32 copy of the base when it takes at most this share of the memory. */
export const F32_BASE_MEMORY_FRACTION = 0.25;

/** Native handles, freed in reverse order whatever happens. */
class NativeScope {
  private readonly cleanups: Array<() => void> = [];
  defer(cleanup: () => void): void {
    this.cleanups.push(cleanup);
  }
  dispose(): void {
    for (const cleanup of this.cleanups.reverse()) cleanup();
    this.cleanups.length = 0;
  }
}

/** A LoRA job's adapter: its settings and the weights it adapts (known once the base is read). */
type LoraRun = LoraSpec & { weights: LoraWeight[] };

/** Files a job writes in its work directory, removed when it ends. */
interface WorkFiles {
  /** The base's private copy that a conversion reads (see {@link convertBase}). */
  baseCopy: string;
  baseF32: string;
  trainedF32: string;
  baseConverted: string;
  initialAdapter: string;
}

/** The llama.cpp library as loaded for a job, and where it computes. */
interface Compute {
  lib: LlamaLib;
  /** The BLAS backend's device, when one loaded. */
  blas: string | undefined;
  /** The products it takes (loraBase.ts): `none` when none loaded. */
  blasTakes: LoraBaseOptions["blas"];
  /** Whether it computes the products of non-F32 weights in bf16 (blasBackend.ts's `bf16`). */
  bf16: boolean;
  gpus: GpuDevice[];
  /** Layers offloaded: `0` on the CPU, `-1` for all. */
  gpuLayers: number;
  gpuMemory: GpuMemoryWatch | undefined;
  /** Chooses OpenBLAS's threads between steps (`tuneBlasThreads`), and sets them; undefined when not tuned. */
  blasThreads: { tuner: ThreadTuner; set: (threads: number) => void } | undefined;
}

/** Where a job keeps its checkpoints and best weights, and the checkpoint it resumes from. */
interface Checkpoints {
  /** The job's checkpoint directory; none without `checkpointDir`. */
  dir: CheckpointDir | undefined;
  /** Where a full run's best model goes (the checkpoint directory, or the work directory). */
  bestModelDir: CheckpointDir;
  fingerprint: string;
  resume: CheckpointState | undefined;
}

/** What the training loop works on: the loaded model and adapter, the tokenized samples and their plan. */
interface TrainingSession {
  model: Pointer;
  baseInfo: ModelFileInfo;
  ctx: Pointer;
  checkCallback: () => void;
  adapterTensors: Map<string, Pointer>;
  loss: LossTap;
  audit: OffloadAudit;
  plan: TrainingPlan;
  trainSamples: TokenStore;
  evalSamples: TokenStore;
  optimizerParams: Pointer;
  dataset: Pointer;
  result: Pointer;
  trainableTensors: number;
  trainableParameters: number;
}

/**
 * Trains a job, in phases: load llama.cpp and find the devices, prepare the base model (and the initial
 * adapter), load it and tokenize the samples, train epoch by epoch with evaluations and checkpoints, restore the
 * best weights, measure each example's loss, write the output.
 */
export async function runTraining(job: LlamaCppJob, hooks: TrainingHooks): Promise<TrainingResult> {
  // The run service never gives it one (`cannotTrain`); a job built by hand is refused, not trained as SFT.
  if (job.preference !== null)
    throw new Error(
      "trainer: the llama.cpp trainer cannot do preference tuning (DPO); the torch trainer does",
    );
  const startedAt = performance.now();
  const compute = openCompute(job, hooks);
  fs.mkdirSync(job.workDir, { recursive: true });
  const files: WorkFiles = {
    baseCopy: path.join(job.workDir, "base-copy.gguf"),
    baseF32: path.join(job.workDir, "base-f32.gguf"),
    trainedF32: path.join(job.workDir, "trained-f32.gguf"),
    baseConverted: path.join(job.workDir, "base-converted.gguf"),
    initialAdapter: path.join(job.workDir, "adapter-initial.gguf"),
  };
  const scope = new NativeScope();
  const lora: LoraRun | undefined =
    job.method === "lora" && job.lora !== null
      ? { ...job.lora, complexity: job.complexity, weights: [] }
      : undefined;
  const dir = job.checkpointDir === null ? undefined : new CheckpointDir(job.checkpointDir);
  const fingerprint = await jobFingerprint(job);
  const checkpoints: Checkpoints = {
    dir,
    // A full run's best weights are a whole model: without a checkpoint directory they go to the work directory.
    bestModelDir: dir ?? new CheckpointDir(path.join(job.workDir, "best")),
    fingerprint,
    resume: dir?.read(fingerprint),
  };
  const stores: TokenStore[] = [];
  try {
    const base = await prepareBase(compute, job, hooks, lora, files, checkpoints);
    if (hooks.isCancelled()) return { status: "cancelled" };
    const session = await openSession(compute, job, hooks, base, lora, files, scope, stores);
    if (session === undefined) return { status: "cancelled" };
    const loop = new TrainingLoop(job, hooks, compute, session, lora, checkpoints, startedAt);
    if (!(await loop.train())) return { status: "cancelled" };
    await hooks.yieldToEventLoop();
    if (hooks.isCancelled()) return { status: "cancelled" };
    // The phases after the last step, each logged with its time: a large model spends minutes here.
    const servesBest = loop.restoreBest();
    const phaseStart = performance.now();
    hooks.log(
      `trainer: measuring each example's loss with the weights written (${loop.lossWindows} windows)`,
    );
    const examples = await loop.exampleLosses(servesBest);
    if (examples === undefined) return { status: "cancelled" };
    hooks.log(`trainer: measured each example's loss in ${secondsSince(phaseStart)}`);
    const warnings = trainingWarnings(loop.finalTrainLoss, loop.evalHistory, loop.best);
    for (const warning of warnings) hooks.log(`trainer: warning: ${warning}`);
    const writeStart = performance.now();
    const outputBytes = await writeTrained(compute.lib, job, hooks, loop, lora, files, scope, servesBest);
    hooks.log(`trainer: written in ${secondsSince(writeStart)}`);
    compute.lib.llama_backend_free();
    return {
      status: "completed",
      outputPath: job.outputPath,
      examples,
      stats: loop.stats(warnings, outputBytes),
    };
  } finally {
    scope.dispose();
    for (const store of stores) store.dispose();
    for (const file of Object.values(files)) fs.rmSync(file, { force: true });
  }
}

/** Loads llama.cpp (and the BLAS backend on the CPU), finds the GPUs the job may use, and logs what it found. */
function openCompute(job: LlamaCppJob, hooks: TrainingHooks): Compute {
  const lib = loadLlamaLib({ gpu: job.options.device });
  hooks.log(`trainer: llama.cpp ${lib.llama_version()} from ${lib.binDir}`);
  lib.ggml_backend_load_all_from_path(lib.binDir);
  // On the CPU, a BLAS backend takes the products of F32 weights; the base is then trained in F32 (loraBase.ts).
  const blas =
    job.options.blasLibrary !== null && job.options.device === "cpu"
      ? loadBlasBackend(lib, job.options.blasLibrary, job.options.blasThreads, hooks.log)
      : undefined;
  const build = blas === undefined ? undefined : buildOf(job.options.blasLibrary!);
  const blasTakes = build === undefined ? "none" : build.quantized ? "any" : "f32";
  const bf16 = build?.bf16 === true && bf16Products();
  hooks.log(
    blas !== undefined
      ? `trainer: BLAS backend ${blas} (${job.options.blasLibrary}): products of ${blasTakes === "any" ? "weights of any type" : "F32 weights"}, the backward pass's included, go through it on ${process.env.OPENBLAS_NUM_THREADS} thread(s)`
      : job.options.device === "cpu"
        ? `trainer: no BLAS backend; matrix products on ggml's CPU backend (${TRAINER_SETUP_COMMAND} makes training on the CPU faster)`
        : `trainer: no BLAS backend on a GPU`,
  );
  lib.llama_backend_init();
  const gpus = job.options.device === "cpu" ? [] : gpuDevices(lib);
  if (job.options.device !== "cpu" && gpus.length === 0)
    hooks.log(
      `trainer: the ${job.options.device} build of llama.cpp registered no GPU (its backend library did not load ` +
        `or found no device); training on the CPU`,
    );
  const gpuLayers = gpus.length === 0 ? 0 : job.options.gpuLayers === "all" ? -1 : job.options.gpuLayers;
  if (gpus.length > 0) {
    const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(1)} GiB`;
    const names = gpus.map((d) => {
      const { freeBytes, totalBytes } = deviceMemory(lib, d);
      return `${d.name} ${d.description} (${gib(freeBytes)} free of ${gib(totalBytes)})`;
    });
    hooks.log(
      `trainer: training on ${job.options.device}: ${names.join(", ")}; ` +
        `${job.options.gpuLayers === "all" ? "all" : job.options.gpuLayers} layers offloaded`,
    );
  }
  const gpuMemory = gpus.length === 0 ? undefined : new GpuMemoryWatch(lib, gpus);
  return { lib, blas, blasTakes, bf16, gpus, gpuLayers, gpuMemory, blasThreads: blasThreadTuning(job, blas) };
}

/**
 * OpenBLAS's threads chosen between steps: its pool spin-waits, so every core trains fastest on an idle machine and
 * one fewer when another process takes a core (bench/README.md). Only when the job asks (`tuneBlasThreads`), the
 * backend loaded, the environment sets no count of its own and OpenBLAS's setter is found.
 */
function blasThreadTuning(job: LlamaCppJob, blas: string | undefined): Compute["blasThreads"] {
  const start = job.options.blasThreads;
  if (!job.options.tuneBlasThreads || blas === undefined || start < 2) return undefined;
  if (process.env.OPENBLAS_NUM_THREADS !== String(start)) return undefined;
  const set = openBlasThreads();
  return set === undefined ? undefined : { tuner: new ThreadTuner([start, start - 1]), set };
}

/**
 * The model file training loads: a full run's F32 copy of the base (or its checkpoint), a LoRA run's base as
 * it is or converted; a LoRA run's initial adapter is written too (or copied from its checkpoint).
 */
async function prepareBase(
  { lib, blas, blasTakes, bf16 }: Compute,
  job: LlamaCppJob,
  hooks: TrainingHooks,
  lora: LoraRun | undefined,
  files: WorkFiles,
  { dir: checkpoints, resume }: Checkpoints,
): Promise<{ path: string; info: ModelFileInfo }> {
  let basePath: string;
  if (lora === undefined) {
    if (resume !== undefined) {
      // The checkpoint is the F32 model as it was; training goes on from there.
      fs.copyFileSync(checkpoints!.latestWeights, files.baseF32);
    } else {
      // Only F32 tensors train (others silently stay frozen), so the base model is converted first.
      convertBase(lib, job, files, files.baseF32, "F32", () =>
        hooks.log(`trainer: converting ${job.baseModelPath} to F32`),
      );
    }
    basePath = files.baseF32;
  } else {
    // LoRA leaves the base frozen: with a BLAS backend it trains through an F32 copy that fits a quarter of the
    // memory, else through the base as it is when the backend takes every weight type; without BLAS, F32 and Q8_0
    // (QLoRA) train as they are and any other type is converted once to Q8_0, the fastest and lightest to train
    // through by measurement (see loraBase.ts).
    const conversion = loraBaseConversion(readModelFile(lib, job.baseModelPath), {
      blas: blasTakes,
      f32Budget: F32_BASE_MEMORY_FRACTION * totalMemory(),
      asIs: job.options.loraBase === "as-is",
      bf16,
    });
    if (conversion === undefined) {
      basePath = job.baseModelPath;
      hooks.log(
        `trainer: LoRA trains through the base as it is${blas === undefined ? "" : bf16 ? " (the BLAS backend takes its products, in bf16)" : " (the BLAS backend takes its products)"}`,
      );
    } else {
      convertBase(lib, job, files, files.baseConverted, conversion.to, () =>
        hooks.log(`trainer: ${conversion.reason}; converting the base to ${conversion.to} for training`),
      );
      basePath = files.baseConverted;
    }
  }
  const info = readModelFile(lib, basePath);
  if (lora !== undefined) {
    lora.weights = loraWeights(info, lora);
    if (resume !== undefined) fs.copyFileSync(checkpoints!.latestWeights, files.initialAdapter);
    else await writeInitialAdapter(info, files.initialAdapter, lora.weights, lora, job.seed);
  }
  return { path: basePath, info };
}

/**
 * Loads the base (and the adapter), tokenizes the samples, plans the windows, and creates the training context
 * and the optimizer. `undefined` when the job was cancelled meanwhile.
 */
async function openSession(
  compute: Compute,
  job: LlamaCppJob,
  hooks: TrainingHooks,
  base: { path: string; info: ModelFileInfo },
  lora: LoraRun | undefined,
  files: WorkFiles,
  scope: NativeScope,
  stores: TokenStore[],
): Promise<TrainingSession | undefined> {
  const { lib } = compute;
  const model = loadModel(lib, base.path, scope, compute.gpuLayers);
  const nLayers = lib.llama_model_n_layer(model);
  await makeGraphHeadroom(
    lib,
    model,
    base.info,
    path.join(job.workDir, "headroom.gguf"),
    nLayers,
    lora?.weights.length ?? 0,
    scope,
    hooks,
  );
  let adapter: Pointer | undefined;
  if (lora !== undefined) {
    const handle = lib.llama_adapter_lora_init(model, files.initialAdapter);
    if (handle === null) throw new Error("trainer: llama.cpp could not load the initial LoRA adapter");
    scope.defer(() => lib.llama_adapter_lora_free(handle));
    adapter = handle;
  }
  const data = await prepareTrainingData(lib, model, job, hooks, stores);
  if (data === undefined) return undefined;
  const { plan } = data;
  const audit = new OffloadAudit(lib, compute.gpus[0]);
  const context = createContext(lib, model, plan.windowSize, job.threads, scope, adapter, audit);
  const optimizer = prepareOptimizer(lib, job, model, nLayers, lora, context, scope);
  hooks.log(
    trainingSummary(job, lora, nLayers, optimizer, plan, plan.train, data.trainedTokens, plan.evalSet),
  );
  const dataset = lib.ggml_opt_dataset_init(
    GGML_TYPE_I32,
    GGML_TYPE_I32,
    plan.windowSize,
    plan.windowSize,
    1,
    1,
  );
  if (dataset === null) throw new Error("trainer: ggml_opt_dataset_init failed");
  scope.defer(() => lib.ggml_opt_dataset_free(dataset));
  const result = lib.ggml_opt_result_init();
  scope.defer(() => lib.ggml_opt_result_free(result));
  return {
    model,
    baseInfo: base.info,
    ...context,
    audit,
    plan,
    trainSamples: plan.train,
    evalSamples: plan.evalSet,
    optimizerParams: optimizer.params,
    dataset,
    result,
    trainableTensors: optimizer.tensors,
    trainableParameters: optimizer.parameters,
  };
}

/** Flags the trainable tensors (the adapter's, once the warm-up graph has shown them) and initialises the optimizer. */
function prepareOptimizer(
  lib: LlamaLib,
  job: LlamaCppJob,
  model: Pointer,
  nLayers: number,
  lora: LoraRun | undefined,
  { ctx, adapterTensors }: { ctx: Pointer; adapterTensors: Map<string, Pointer> },
  scope: NativeScope,
): { params: Pointer; tensors: number; parameters: number } {
  if (lora !== undefined) {
    // Every adapted weight must have shown both of its tensors in the warm-up graph.
    for (const weight of lora.weights)
      for (const suffix of ["lora_a", "lora_b"])
        if (!adapterTensors.has(`${weight.name}.${suffix}`))
          throw new Error(`trainer: ${weight.name}.${suffix} is not in the model's graph`);
    // Only now (after the warm-up decode) are the adapter tensors flagged as parameters.
    for (const tensor of adapterTensors.values()) lib.ggml_set_param(tensor);
  }
  const params = koffi.alloc(GgmlOptOptimizerParams, 1) as Pointer;
  scope.defer(() => koffi.free(params));
  const { tensors, parameters } = initOptimizer(
    lib,
    ctx,
    model,
    nLayers,
    job.complexity,
    params,
    lora === undefined ? undefined : [...adapterTensors.values()],
    job.optimizer,
  );
  return { params, tensors, parameters };
}

/** The log line that says what trains: the method, the trainable tensors, the samples, windows, epochs and steps. */
function trainingSummary(
  job: LlamaCppJob,
  lora: LoraRun | undefined,
  nLayers: number,
  optimizer: { tensors: number; parameters: number },
  plan: TrainingPlan,
  trainSamples: TokenStore,
  trainedTokens: number,
  evalSamples: TokenStore,
): string {
  const { windowSize, capacity, totalSteps, epochs } = plan;
  return (
    (lora === undefined
      ? `trainer: full fine-tune, ${nLayers} blocks, complexity ${job.complexity}: `
      : `trainer: LoRA rank ${lora.rank} alpha ${lora.alpha} on ${lora.targets.join(", ")} of ` +
        `${new Set(lora.weights.filter((w) => w.name.startsWith("blk.")).map((w) => w.name.split(".")[1])).size}` +
        `/${nLayers} blocks${lora.weights.some((w) => w.name === "output.weight") ? " and the output head" : ""}: `) +
    `${optimizer.tensors} trainable tensors (${optimizer.parameters} parameters); ${trainSamples.size} samples ` +
    `(${trainSamples.tokens} tokens, ${trainedTokens} trained on) in windows of ${windowSize} tokens` +
    (capacity < windowSize ? ` (the first ${capacity}, the model's context, hold examples)` : "") +
    `, ` +
    `${epochs} epochs, ${totalSteps} steps` +
    (plan.evalWindows.length > 0 ? `, ${evalSamples.size} eval samples` : "")
  );
}

/**
 * Writes what was trained: a full run's model (the best checkpoint's, or the last weights) quantized to the
 * job's type, a LoRA run's adapter. Releases the native scope first (the context holds the optimizer's state).
 * Returns the bytes written.
 */
async function writeTrained(
  lib: LlamaLib,
  job: LlamaCppJob,
  hooks: TrainingHooks,
  loop: TrainingLoop,
  lora: LoraRun | undefined,
  files: WorkFiles,
  scope: NativeScope,
  servesBest: boolean,
): Promise<number> {
  if (lora === undefined) {
    hooks.log(`trainer: saving and writing ${job.outputType} to ${job.outputPath}`);
    if (servesBest) fs.copyFileSync(loop.bestModelFile, files.trainedF32);
    else lib.llama_model_save_to_file(loop.model, files.trainedF32);
    // The context and model hold the F32 weights and optimizer state; release them before quantizing.
    scope.dispose();
    writeOutput(lib, files.trainedF32, job);
    return fs.statSync(job.outputPath).size;
  }
  const values = loop.adapterValues();
  scope.dispose();
  const type = servedAdapterType(job.outputType);
  hooks.log(`trainer: writing the LoRA adapter (${lora.weights.length} weights, ${type})`);
  const outputBytes = await writeTrainedAdapter(
    loop.baseInfo,
    job.outputPath,
    lora.weights,
    lora,
    values,
    type,
  );
  hooks.log(
    `trainer: wrote the LoRA adapter (${(outputBytes / 2 ** 20).toFixed(2)} MiB) to ${job.outputPath}`,
  );
  return outputBytes;
}

/**
 * The training loop's state and steps: windows through `llama_opt_epoch`, evaluation points (eval loss, best
 * weights, early stopping, the latest checkpoint), progress, and the per-example losses at the end.
 */
class TrainingLoop {
  step: number;
  readonly resumedFromStep: number;
  /** The best evaluation (the weights served) and early stopping. */
  private readonly tracker: BestCheckpoint;
  private bestValues: Map<string, Float32Array> | undefined;
  private trainTokens = 0;
  private sampleTokens = 0;
  private lossTokens = 0;
  private trainSeconds = 0;
  private trainCpuSeconds = 0;
  private firstStep: { wall: number; cpu: number } | undefined;
  private evalSeconds = 0;
  private lastProgressAt = 0;
  finalTrainLoss = Number.NaN;
  private finalEvalLoss: number | undefined;
  private epochsDone: number;
  private learningRate: number;
  private lastCheckpointAt: number | undefined;
  /** OpenBLAS's threads now, when they are tuned between steps. */
  private blasThreads: number | undefined;
  readonly evalHistory: { epoch: number; step: number; trainLoss: number; evalLoss: number }[] = [];
  private readonly lib: LlamaLib;

  constructor(
    private readonly job: LlamaCppJob,
    private readonly hooks: TrainingHooks,
    private readonly compute: Compute,
    private readonly session: TrainingSession,
    private readonly lora: LoraRun | undefined,
    private readonly checkpoints: Checkpoints,
    private readonly startedAt: number,
  ) {
    this.lib = compute.lib;
    const resume = checkpoints.resume;
    this.step = resume?.step ?? 0;
    this.resumedFromStep = this.step;
    this.tracker = new BestCheckpoint(job.earlyStoppingPatience, resume);
    this.epochsDone = resume?.epoch ?? 0;
    this.learningRate = job.learningRate;
    if (resume !== undefined) {
      if (lora !== undefined && this.best !== null)
        this.bestValues = checkpoints.dir!.readBestValues(resume, this.adapterValues());
      hooks.log(
        `trainer: resuming from the checkpoint at step ${this.step} (epoch ${resume.epoch + 1}, window ${resume.window}); ` +
          "the optimizer's moments start again from zero",
      );
    }
  }

  get best(): CheckpointState["best"] {
    return this.tracker.best;
  }

  private get stoppedEarly(): boolean {
    return this.tracker.stopped;
  }

  /** Windows the per-example losses are measured on (training and eval samples in order). */
  get lossWindows(): number {
    const { plan, trainSamples, evalSamples } = this.session;
    return plan.inOrder(trainSamples).windows.length + plan.inOrder(evalSamples).windows.length;
  }

  get model(): Pointer {
    return this.session.model;
  }

  get baseInfo(): ModelFileInfo {
    return this.session.baseInfo;
  }

  get bestModelFile(): string {
    return this.checkpoints.bestModelDir.bestModel;
  }

  /**
   * One window through llama_opt_epoch: a training step, or a forward pass when `train` is false.
   * Returns the summed loss of its masked-in positions (`loss.rows` holds each one's).
   */
  private runWindow(window: TrainingWindow, train: boolean): number {
    const { lib, session } = this;
    const { dataset, result, loss } = session;
    const windowSize = session.plan.windowSize;
    // The dataset memory is not zeroed by ggml: both tensors are written in full every time.
    lib.ggml_backend_tensor_set(lib.ggml_opt_dataset_data(dataset), window.input, 0, windowSize * 4);
    lib.ggml_backend_tensor_set(lib.ggml_opt_dataset_labels(dataset), window.labels, 0, windowSize * 4);
    lib.ggml_opt_result_reset(result);
    loss.begin(window, train);
    lib.llama_opt_epoch(
      session.ctx,
      dataset,
      train ? result : null,
      train ? null : result,
      train ? 1 : 0,
      null,
      null,
    );
    session.checkCallback();
    if (train) {
      const missing = session.audit.finish(this.job.options.device);
      if (missing !== undefined) this.hooks.log(missing);
    }
    this.compute.gpuMemory?.sample();
    const sum = loss.end();
    if (!Number.isFinite(sum)) throw new Error(`trainer: loss became ${sum}; try a lower learning rate`);
    return sum;
  }

  /** Mean loss per trained token over the held-out samples (forward passes only); undefined when cancelled. */
  private async evaluate(): Promise<number | undefined> {
    const plan = this.session.plan;
    let sum = 0;
    let count = 0;
    for (let k = 0; k < plan.evalWindows.length; k++) {
      await this.hooks.yieldToEventLoop();
      if (this.hooks.isCancelled()) return undefined;
      const window = plan.evalWindow(k);
      sum += this.runWindow(window, false);
      count += window.lossTokens;
    }
    return count > 0 ? sum / count : Number.NaN;
  }

  /** The adapter's tensors as they are now, by name. */
  adapterValues(): Map<string, Float32Array> {
    const values = new Map<string, Float32Array>();
    for (const [name, tensor] of this.session.adapterTensors) {
      const data = new Float32Array(Number(this.lib.ggml_nelements(tensor)));
      this.lib.ggml_backend_tensor_get(tensor, data, 0, data.byteLength);
      values.set(name, data);
    }
    return values;
  }

  /** Saves the trained weights (the adapter, or the F32 model) to `file`. */
  private readonly saveWeights = async (file: string): Promise<void> => {
    if (this.lora === undefined) this.lib.llama_model_save_to_file(this.session.model, file);
    else
      await writeTrainedAdapter(
        this.session.baseInfo,
        file,
        this.lora.weights,
        this.lora,
        this.adapterValues(),
        "F32",
      );
  };

  /** Writes the adapter as the run serves it (its `servedAdapterType`), for a kept checkpoint served and downloaded as it is. */
  private readonly saveServedAdapter = async (file: string): Promise<void> => {
    await writeTrainedAdapter(
      this.session.baseInfo,
      file,
      this.lora!.weights,
      this.lora!,
      this.adapterValues(),
      servedAdapterType(this.job.outputType),
    );
  };

  private report(epoch: number, trainLoss: number, evalLoss: number | undefined, force: boolean): void {
    const now = performance.now();
    if (!force && now - this.lastProgressAt < PROGRESS_INTERVAL_MS) return;
    this.lastProgressAt = now;
    const { totalSteps, epochs } = this.session.plan;
    const stepsDone = this.step - this.resumedFromStep;
    const secondsPerStep = stepsDone > 0 ? (this.trainSeconds + this.evalSeconds) / stepsDone : 0;
    this.hooks.progress({
      step: this.step,
      totalSteps,
      epoch,
      epochs,
      trainLoss,
      ...(evalLoss === undefined ? {} : { evalLoss }),
      learningRate: this.learningRate,
      tokensPerSecond: this.trainSeconds > 0 ? this.trainTokens / this.trainSeconds : 0,
      elapsedSeconds: (now - this.startedAt) / 1000,
      etaSeconds: secondsPerStep * (totalSteps - this.step),
    });
  }

  /** Trains every planned epoch (or until early stopping); false when the job was cancelled. */
  async train(): Promise<boolean> {
    const { plan } = this.session;
    const resume = this.checkpoints.resume;
    // A resumed run draws the orders of the epochs it has done, so that the next one is the same.
    for (const epochPlan of plan.epochPlans(resume?.epoch ?? 0)) {
      const epoch = epochPlan.epoch;
      const windowCount = epochPlan.steps;
      let lossSum = 0;
      let lossCount = 0;
      const first = epoch === resume?.epoch ? resume.window : 0;
      for (let index = first; index < windowCount; index++) {
        const window = plan.trainWindow(epochPlan, index);
        await this.hooks.yieldToEventLoop();
        if (this.hooks.isCancelled()) return false;
        // A window with nothing to learn (every answer empty) would only move the weights by momentum.
        if (window.lossTokens > 0) {
          lossSum += this.trainStep(window);
          lossCount += window.lossTokens;
        } else this.setLearningRate();
        this.step += 1;
        this.finalTrainLoss = lossCount > 0 ? lossSum / lossCount : Number.NaN;
        const last = index === windowCount - 1;
        if (TrainingPlan.evaluatesAfter(epochPlan, index)) {
          if (!(await this.evaluationPoint(epoch, index + 1, this.finalTrainLoss))) return false;
          if (this.stoppedEarly) {
            this.epochsDone = epoch + (last ? 1 : 0);
            return true;
          }
        } else this.report(epoch + 1, this.finalTrainLoss, undefined, false);
      }
      this.epochsDone = epoch + 1;
    }
    return true;
  }

  /** Sets the learning rate of the coming step in the optimizer's parameters. */
  private setLearningRate(): void {
    const job = this.job;
    this.learningRate = learningRateAt(
      job.learningRate,
      job.lrSchedule,
      this.step,
      this.session.plan.totalSteps,
    );
    koffi.encode(this.session.optimizerParams, GgmlOptOptimizerParams, {
      adamw: { alpha: this.learningRate, beta1: 0.9, beta2: 0.999, eps: 1e-8, wd: job.weightDecay },
      sgd: { alpha: this.learningRate, wd: job.weightDecay },
    });
  }

  /** One optimizer step on a window; returns its summed loss and counts its tokens and time. */
  private trainStep(window: TrainingWindow): number {
    this.setLearningRate();
    const tuning = this.compute.blasThreads;
    const threads = tuning?.tuner.threads();
    if (threads !== undefined && threads !== this.blasThreads) {
      tuning!.set(threads);
      this.blasThreads = threads;
    }
    const t0 = performance.now();
    const cpu0 = process.cpuUsage();
    const sum = this.runWindow(window, true);
    const stepSeconds = (performance.now() - t0) / 1000;
    const chose = tuning?.tuner.observe(stepSeconds);
    if (chose !== undefined) this.hooks.log(`trainer: OpenBLAS on ${chose}`);
    const { user, system } = process.cpuUsage(cpu0);
    this.trainSeconds += stepSeconds;
    this.trainCpuSeconds += (user + system) / 1e6;
    if (this.firstStep === undefined) this.firstStep = { wall: stepSeconds, cpu: (user + system) / 1e6 };
    this.lossTokens += window.lossTokens;
    this.trainTokens += this.session.plan.windowSize;
    this.sampleTokens += window.sampleTokens;
    return sum;
  }

  /**
   * An evaluation point (an epoch's end, or a quarter of a long epoch): eval loss, best weights,
   * early stopping, and the latest checkpoint. Returns false when the run was cancelled meanwhile.
   */
  private async evaluationPoint(epoch: number, window: number, trainLoss: number): Promise<boolean> {
    let evalLoss: number | undefined;
    if (this.session.plan.evalWindows.length > 0) {
      const t0 = performance.now();
      evalLoss = await this.evaluate();
      if (evalLoss === undefined) return false;
      this.evalSeconds += (performance.now() - t0) / 1000;
      await this.keepBest(epoch, trainLoss, evalLoss);
    }
    this.report(epoch + 1, trainLoss, evalLoss, true);
    const { epochs, totalSteps, stepsPerEpoch } = this.session.plan;
    const done = window >= (stepsPerEpoch[epoch] ?? 0);
    this.hooks.log(
      `trainer: ${done ? `epoch ${epoch + 1}/${epochs}` : `step ${this.step}/${totalSteps} (epoch ${epoch + 1})`} ` +
        `train loss ${trainLoss.toFixed(4)}` +
        (evalLoss === undefined
          ? ""
          : ` eval loss ${evalLoss.toFixed(4)}${this.best?.step === this.step ? " (best)" : ""}`) +
        ` lr ${this.learningRate.toExponential(2)}`,
    );
    await this.writeLatestCheckpoint(done ? epoch + 1 : epoch, done ? 0 : window);
    // A LoRA run keeps its adapter at each epoch's end (the last few), each servable once the run is READY.
    if (done && this.lora !== undefined)
      await this.checkpoints.dir?.writeKept(
        { step: this.step, epoch: epoch + 1, trainLoss, ...(evalLoss === undefined ? {} : { evalLoss }) },
        this.saveServedAdapter,
      );
    if (this.stoppedEarly)
      this.hooks.log(
        `trainer: stopping early: the eval loss has not improved on ${this.best!.loss.toFixed(4)} (epoch ${this.best!.epoch}) ` +
          `for ${this.tracker.evalsSinceBest} evaluations`,
      );
    return true;
  }

  /** Records an eval loss: whether it improves (early stopping counts the evaluations that do not), and the best weights. */
  private async keepBest(epoch: number, trainLoss: number, evalLoss: number): Promise<void> {
    this.finalEvalLoss = evalLoss;
    this.evalHistory.push({ epoch: epoch + 1, step: this.step, trainLoss, evalLoss });
    if (this.tracker.observe(evalLoss, epoch + 1, this.step)) {
      if (this.lora !== undefined) {
        this.bestValues = this.adapterValues();
        await this.checkpoints.dir?.writeBestValues(this.bestValues);
      } else
        await this.checkpoints.bestModelDir.writeBestModel((file) =>
          this.lib.llama_model_save_to_file(this.session.model, file),
        );
    }
  }

  /**
   * Writes the latest checkpoint, to resume from `epoch` after `window` windows. Small datasets reach an
   * evaluation point every step or two: it is written at the first one and then at most every
   * CHECKPOINT_INTERVAL_MS (a full model is a whole copy).
   */
  private async writeLatestCheckpoint(epoch: number, window: number): Promise<void> {
    const dir = this.checkpoints.dir;
    const now = performance.now();
    if (
      dir === undefined ||
      (this.lastCheckpointAt !== undefined && now - this.lastCheckpointAt < CHECKPOINT_INTERVAL_MS)
    )
      return;
    this.lastCheckpointAt = now;
    await dir.writeLatest(
      {
        fingerprint: this.checkpoints.fingerprint,
        epoch,
        window,
        step: this.step,
        ...this.tracker.state(),
        bestTensors: this.bestValues === undefined ? [] : [...this.bestValues.keys()],
      },
      this.saveWeights,
    );
  }

  /**
   * The weights written are the best by eval loss (the last ones when there is no eval set): a LoRA run's best
   * values go back into the adapter here (a full run's best model is copied when written). Returns whether the
   * best checkpoint is not the last step.
   */
  restoreBest(): boolean {
    const best = this.best;
    const servesBest = best !== null && best.step !== this.step;
    if (best !== null && !servesBest)
      this.hooks.log(
        `trainer: the last step is the best checkpoint (epoch ${best.epoch}, step ${best.step}, eval loss ${best.loss.toFixed(4)})`,
      );
    if (!servesBest || this.lora === undefined) return servesBest;
    if (this.bestValues === undefined) throw new Error("trainer: the best checkpoint's weights are missing");
    for (const [name, data] of this.bestValues) {
      const tensor = this.session.adapterTensors.get(name);
      if (tensor !== undefined) this.lib.ggml_backend_tensor_set_f32(tensor, data, 0, data.byteLength);
    }
    this.hooks.log(
      `trainer: writing the best checkpoint (epoch ${best.epoch}, step ${best.step}, eval loss ${best.loss.toFixed(4)})`,
    );
    return servesBest;
  }

  /**
   * Each example's loss with the weights that are written (full runs: the last weights; see the log), into the
   * job's losses file or the returned lists. Undefined when the job was cancelled meanwhile.
   */
  async exampleLosses(
    servesBest: boolean,
  ): Promise<{ train: ExampleLoss[]; eval: ExampleLoss[] } | undefined> {
    if (servesBest && this.lora === undefined)
      this.hooks.log(
        "trainer: per-example losses are measured with the last weights; the best checkpoint is written",
      );
    const { plan, trainSamples, evalSamples, loss } = this.session;
    // Samples in order fill the windows in order, so each example's loss is complete (and written) once
    // its window has run; an empty sample is in no window.
    const examples = { train: [] as ExampleLoss[], eval: [] as ExampleLoss[] };
    const lossesOut = this.job.lossesFile === null ? undefined : new LossesFile(this.job.lossesFile);
    try {
      for (const [split, samples] of [
        ["train", trainSamples],
        ["eval", evalSamples],
      ] as const) {
        const emit = (example: ExampleLoss) =>
          lossesOut === undefined ? examples[split].push(example) : lossesOut.write(example);
        const inOrder = plan.inOrder(samples);
        let next = 0;
        for (let k = 0; k < inOrder.windows.length; k++) {
          await this.hooks.yieldToEventLoop();
          if (this.hooks.isCancelled()) return undefined;
          const window = inOrder.window(k);
          this.runWindow(window, false);
          for (const span of window.spans) {
            for (; next < span.sample; next++) emit({ loss: null, tokens: 0 });
            let sum = 0;
            let count = 0;
            for (let p = span.start; p < span.start + span.length; p++)
              if (window.lossMask[p]) {
                sum += loss.rows[p] ?? 0;
                count += 1;
              }
            emit({ loss: count > 0 ? sum / count : null, tokens: count });
            next = span.sample + 1;
          }
        }
        for (; next < samples.size; next++) emit({ loss: null, tokens: 0 });
      }
      lossesOut?.close();
    } finally {
      lossesOut?.dispose();
    }
    return examples;
  }

  /** The job's totals once its output is written. */
  stats(warnings: string[], outputBytes: number): TrainingStats {
    const best = this.best;
    return {
      steps: this.step,
      epochs: this.epochsDone,
      trainTokens: this.trainTokens,
      sampleTokens: this.sampleTokens,
      lossTokens: this.lossTokens,
      windowSize: this.session.plan.windowSize,
      finalTrainLoss: this.finalTrainLoss,
      ...(this.finalEvalLoss === undefined ? {} : { finalEvalLoss: this.finalEvalLoss }),
      ...(best === null ? {} : { bestEvalLoss: best.loss, bestEpoch: best.epoch, bestStep: best.step }),
      stoppedEarly: this.stoppedEarly,
      resumedFromStep: this.resumedFromStep,
      warnings,
      tokensPerSecond: this.trainSeconds > 0 ? this.trainTokens / this.trainSeconds : 0,
      trainSeconds: this.trainSeconds + this.evalSeconds,
      trainCpuSeconds: this.trainCpuSeconds,
      ...(this.firstStep === undefined
        ? {}
        : { firstStepSeconds: this.firstStep.wall, firstStepCpuSeconds: this.firstStep.cpu }),
      elapsedSeconds: (performance.now() - this.startedAt) / 1000,
      trainableTensors: this.session.trainableTensors,
      trainableParameters: this.session.trainableParameters,
      outputBytes,
      peakRssBytes: process.resourceUsage().maxRSS * 1024,
      ...(this.compute.gpuMemory === undefined ? {} : { peakGpuBytes: this.compute.gpuMemory.peakBytes }),
    };
  }
}

/** Per-example losses as JSON lines, written in blocks. */
class LossesFile {
  private readonly fd: number;
  private pending: string[] = [];

  constructor(readonly file: string) {
    this.fd = fs.openSync(file, "w");
  }

  write(example: ExampleLoss): void {
    this.pending.push(`${JSON.stringify(example)}\n`);
    if (this.pending.length >= 4096) this.flush();
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
    if (this.pending.length === 0) return;
    fs.writeSync(this.fd, this.pending.join(""));
    this.pending = [];
  }
}

/**
 * Converts the job's base model to `type` at `output`. llama.cpp's quantizer maps its input (`use_mmap` is fixed
 * on in `llama_model_quantize`), and the base is the models directory's file, which an operator may rewrite or
 * truncate in place while a run starts: a mapped page that is gone ends the trainer with SIGBUS. So the quantizer
 * reads a private copy, made by the kernel in a stream (a copy-on-write clone where the file system has them),
 * and removed once converted; only the trainer's own files are ever mapped.
 */
function convertBase(
  lib: LlamaLib,
  job: LlamaCppJob,
  files: WorkFiles,
  output: string,
  type: keyof typeof LLAMA_FTYPES,
  /** Says that the conversion begins (once the copy is made). */
  converting: () => void,
): void {
  fs.copyFileSync(job.baseModelPath, files.baseCopy, fs.constants.COPYFILE_FICLONE);
  converting();
  try {
    quantize(lib, files.baseCopy, output, type, job.threads, "read the base model");
  } finally {
    fs.rmSync(files.baseCopy, { force: true });
  }
}

/**
 * Converts a GGUF model file to another type with llama.cpp's own quantizer, outside a training job
 * (bench/train.ts gives `llama-finetune` the same F32 weights the trainer starts from).
 */
export function convertModel(
  input: string,
  output: string,
  type: keyof typeof LLAMA_FTYPES,
  threads = 1,
): void {
  const lib = loadLlamaLib();
  lib.ggml_backend_load_all_from_path(lib.binDir);
  lib.llama_backend_init();
  try {
    quantize(lib, input, output, type, threads, `convert ${input}`);
  } finally {
    lib.llama_backend_free();
  }
}

function quantize(
  lib: LlamaLib,
  input: string,
  output: string,
  type: keyof typeof LLAMA_FTYPES,
  threads: number,
  what: string,
): void {
  const params = lib.llama_model_quantize_default_params();
  params.ftype = LLAMA_FTYPES[type];
  params.nthread = threads;
  // Needed to go from one quantized type to another (and to dequantize to F32).
  params.allow_requantize = true;
  const status = lib.llama_model_quantize(input, output, params);
  if (status !== 0) {
    // llama.cpp says nothing more; a full disk is the usual cause when the input itself is fine.
    const free = freeBytes(path.dirname(output));
    // A quantized input grows up to ~8x as F32; other conversions stay within about twice its size.
    const needed = (fs.statSync(input, { throwIfNoEntry: false })?.size ?? 0) * (type === "F32" ? 8 : 2);
    if (free !== undefined && needed > 0 && free < needed)
      throw Object.assign(
        new Error(
          `trainer: could not ${what}: the disk is full (${free} bytes free in ${path.dirname(output)}, ` +
            `the converted model needs up to ${needed})`,
        ),
        { code: "ENOSPC" },
      );
    throw new Error(`trainer: could not ${what} (llama_model_quantize ${input} -> ${type} failed)`);
  }
}

function freeBytes(dir: string): number | undefined {
  try {
    const stats = fs.statfsSync(dir);
    return stats.bavail * stats.bsize;
  } catch {
    return undefined;
  }
}

function loadModel(lib: LlamaLib, modelPath: string, scope: NativeScope, gpuLayers = 0): Pointer {
  const params = lib.llama_model_default_params();
  // -1: every layer and the output (llama_model::n_gpu_layers).
  params.n_gpu_layers = gpuLayers;
  // Read, never mapped: full training writes to the weights in place (a read-only mapping would not do), and a
  // LoRA base is the models directory's file itself, which an operator may rewrite or truncate in place during
  // a run of hours: a mapping would end the trainer with SIGBUS at its next step. Read weights take the same
  // resident memory (bench/README.md §Model files).
  params.load_mode = LLAMA_LOAD_MODE_NONE;
  // Repacked CPU buffers are not trainable weights.
  params["use_extra_bufts"] = false;
  const model = lib.llama_model_load_from_file(modelPath, params);
  if (model === null) throw new Error(`trainer: could not load ${modelPath}`);
  scope.defer(() => lib.llama_model_free(model));
  return model;
}

/** Loads the graph-headroom adapter on `model` as often as training a model this deep needs (see graphHeadroom.ts). */
async function makeGraphHeadroom(
  lib: LlamaLib,
  model: Pointer,
  modelInfo: ModelFileInfo,
  adapterPath: string,
  blocks: number,
  loraPairs: number,
  scope: NativeScope,
  hooks: TrainingHooks,
): Promise<void> {
  const adapter = await writeHeadroomAdapter(modelInfo, adapterPath, loraPairs);
  if (adapter === undefined) return;
  for (let i = 0; i < adapter.loads; i++) {
    const handle = lib.llama_adapter_lora_init(model, adapterPath);
    if (handle === null) throw new Error(`trainer: could not load the graph headroom adapter ${adapterPath}`);
    scope.defer(() => lib.llama_adapter_lora_free(handle));
  }
  fs.rmSync(adapterPath, { force: true });
  hooks.log(
    `trainer: ${blocks} blocks need a larger training graph; loaded a zero LoRA adapter ${adapter.loads}x ` +
      `(+${6 * adapter.pairs * adapter.loads} graph nodes; it is never applied)`,
  );
}

/** A context sized for one training window, with the gradient-zeroing eval callback installed. */
function createContext(
  lib: LlamaLib,
  model: Pointer,
  windowSize: number,
  threads: number,
  scope: NativeScope,
  adapter: Pointer | undefined,
  audit?: OffloadAudit,
) {
  let callbackError: unknown;
  let layoutChecked = false;
  // LoRA: the adapter's tensors are not reachable through the public API, but every one of them is the
  // first operand of a MUL_MAT in the graph (build_lora_mm: B·(A·x)). The warm-up decode collects them.
  const adapterTensors = new Map<string, Pointer>();
  let collecting = adapter !== undefined;
  const mulMat = adapter === undefined ? -1 : opByName(lib, GGML_OP_MUL_MAT_NAME);
  const loss = new LossTap(lib, windowSize);
  // Workaround for this release: ggml-opt never zeroes parameter gradients between optimizer steps,
  // so each step would apply the running sum of every past gradient and nothing is learned. Once the
  // scheduler has run `adamw step for X`, the gradient it consumed (its src[1], `grad for X`) is spent:
  // zero it so the next step starts from nothing. The callback is asked about every node of every
  // graph, so that path only reads the op field.
  const cbEval = koffi.register((tensor: Pointer, ask: boolean): boolean => {
    try {
      if (ask) {
        const op = tensorOp(tensor);
        audit?.check(tensor, op);
        if (collecting && op === mulMat) {
          const weight = tensorSource(tensor, 0);
          const name = weight === null ? "" : lib.ggml_get_name(weight);
          if (weight !== null && /\.lora_[ab]$/.test(name)) adapterTensors.set(name, weight);
        }
        return op === GGML_OP_OPT_STEP_ADAMW || op === GGML_OP_OPT_STEP_SGD || loss.wants(op);
      }
      if (loss.observe(tensor)) return true;
      const grad = tensorSource(tensor, 1);
      if (grad === null) return true;
      if (!layoutChecked) {
        const names = `${lib.ggml_get_name(tensor)} <- ${lib.ggml_get_name(grad)}`;
        if (!/^\S+ step for .* <- grad for /.test(names)) {
          throw new Error(`trainer: unexpected optimizer graph (${names}); ggml_tensor layout mismatch?`);
        }
        layoutChecked = true;
      }
      lib.ggml_backend_tensor_memset(grad, 0, 0, Number(lib.ggml_nbytes(grad)));
      return true;
    } catch (error) {
      callbackError ??= error;
      return false; // aborts the graph computation rather than training on with stale gradients
    }
  }, koffi.pointer(SchedEvalCallback));
  const params = lib.llama_context_default_params();
  params.n_ctx = windowSize;
  params.n_batch = windowSize;
  params.n_ubatch = windowSize;
  params.n_seq_max = 1;
  params.n_threads = threads;
  params.n_threads_batch = threads;
  // OUT_PROD has no F16 backward and FLASH_ATTN_EXT no backward pass at all.
  params.type_k = GGML_TYPE_F32;
  params.type_v = GGML_TYPE_F32;
  params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  params.cb_eval = cbEval;
  params.cb_eval_user_data = null;
  params["no_perf"] = true;
  const ctx = lib.llama_init_from_model(model, params);
  if (ctx === null) {
    koffi.unregister(cbEval);
    throw new Error("trainer: could not create a llama context");
  }
  scope.defer(() => koffi.unregister(cbEval));
  scope.defer(() => lib.llama_free(ctx));

  // The adapter goes on the context before the warm-up decode, so that decode's graph contains it.
  if (adapter !== undefined && lib.llama_set_adapters_lora(ctx, [adapter], 1, Float32Array.of(1)) !== 0)
    throw new Error("trainer: llama_set_adapters_lora failed");
  // One decode before training: it applies the thread count and installs cb_eval on the scheduler,
  // which llama_opt_epoch alone does not do.
  const token = koffi.alloc("int32_t", 1) as Pointer;
  try {
    const bos = lib.llama_vocab_bos(lib.llama_model_get_vocab(model));
    koffi.encode(token, "int32_t", Math.max(0, bos));
    const status = lib.llama_decode(ctx, lib.llama_batch_get_one(token, 1));
    if (status !== 0) throw new Error(`trainer: warm-up llama_decode failed (${status})`);
  } finally {
    koffi.free(token);
  }
  collecting = false;
  const checkCallback = () => {
    if (callbackError !== undefined) throw callbackError;
  };
  checkCallback();
  return { ctx, checkCallback, adapterTensors, loss };
}

function initOptimizer(
  lib: LlamaLib,
  ctx: Pointer,
  model: Pointer,
  nLayers: number,
  complexity: number,
  optimizerParams: Pointer,
  adapterTensors: Pointer[] | undefined,
  optimizer: "adamw" | "sgd",
): { tensors: number; parameters: number } {
  let tensors = 0;
  let parameters = 0;
  for (const tensor of adapterTensors ?? []) {
    tensors += 1;
    parameters += Number(lib.ggml_nelements(tensor));
  }
  // llama_opt_init only offers F32 model tensors to the filter, and only calls it during llama_opt_init.
  // With LoRA every model tensor stays frozen: the adapter's tensors were flagged with ggml_set_param.
  const filter = koffi.register((tensor: Pointer): boolean => {
    if (adapterTensors !== undefined) return false;
    const name = lib.ggml_get_name(tensor);
    if (name.startsWith("rope_freqs.") || !isTrainableTensor(name, nLayers, complexity)) return false;
    tensors += 1;
    parameters += Number(lib.ggml_nelements(tensor));
    return true;
  }, koffi.pointer(OptParamFilter));
  try {
    lib.llama_opt_init(ctx, model, {
      n_ctx_train: 0,
      param_filter: filter,
      param_filter_ud: null,
      get_opt_pars: lib.constantOptimizerParamsFn,
      // ggml_opt_get_constant_optimizer_params returns *userdata: the buffer rewritten before each step.
      get_opt_pars_ud: optimizerParams,
      optimizer_type: optimizer === "sgd" ? GGML_OPT_OPTIMIZER_TYPE_SGD : GGML_OPT_OPTIMIZER_TYPE_ADAMW,
    });
  } finally {
    koffi.unregister(filter);
  }
  if (tensors === 0) throw new Error("trainer: no trainable tensors (is the model F32?)");
  return { tensors, parameters };
}

/** Writes the trained model as the requested type to `outputPath`: temp file, fsync, rename. */
function writeOutput(lib: LlamaLib, trainedF32Path: string, job: LlamaCppJob): void {
  fs.mkdirSync(path.dirname(job.outputPath), { recursive: true });
  const temp = `${job.outputPath}.tmp-${process.pid}`;
  try {
    if (job.outputType === "F32") fs.copyFileSync(trainedF32Path, temp);
    else quantize(lib, trainedF32Path, temp, job.outputType, job.threads, `write ${job.outputType}`);
    const fd = fs.openSync(temp, "r");
    try {
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(temp, job.outputPath);
  } finally {
    fs.rmSync(temp, { force: true });
  }
}

/**
 * Answer-only loss through the eval callback (the training API has no loss mask). After the
 * `CROSS_ENTROPY_LOSS` node has run, the loss of each masked-in position is computed from its logits
 * row (log-sum-exp minus the label's logit); after `CROSS_ENTROPY_LOSS_BACK` has run, the rows of its
 * output (d loss / d logits, row i = window position i since `n_ubatch == n_ctx`) for masked-out
 * positions are zeroed, so exactly the masked-in positions contribute to the gradient. ggml scales the
 * gradient by 1 / window size whatever the mask; AdamW's update does not depend on that scale.
 */
class LossTap {
  /** The loss of each masked-in position of the last window (0 elsewhere). */
  readonly rows: Float64Array;
  private readonly lossOp: number;
  private readonly backOp: number;
  private window: TrainingWindow | undefined;
  private training = false;
  private sum = 0;
  private sawLoss = false;
  private sawBack = false;
  private row: Float32Array | undefined;

  constructor(
    private readonly lib: LlamaLib,
    private readonly windowSize: number,
  ) {
    this.rows = new Float64Array(windowSize);
    this.lossOp = opByName(lib, GGML_OP_CROSS_ENTROPY_LOSS_NAME);
    this.backOp = opByName(lib, GGML_OP_CROSS_ENTROPY_LOSS_BACK_NAME);
  }

  wants(op: number): boolean {
    return op === this.lossOp || op === this.backOp;
  }

  begin(window: TrainingWindow, training: boolean): void {
    this.window = window;
    this.training = training;
    this.rows.fill(0);
    this.sum = 0;
    this.sawLoss = false;
    this.sawBack = false;
  }

  /** The summed loss of the window's masked-in positions. */
  end(): number {
    const seen = this.sawLoss && (this.sawBack || !this.training);
    this.window = undefined;
    if (!seen) throw new Error("trainer: the loss nodes did not run; ggml op numbers mismatch?");
    return this.sum;
  }

  /** Handles a loss node that has just run; false for any other node. */
  observe(tensor: Pointer): boolean {
    const op = tensorOp(tensor);
    if (op !== this.lossOp && op !== this.backOp) return false;
    const window = this.window;
    if (window === undefined) return true;
    if (op === this.lossOp) {
      const logits = tensorSource(tensor, 0);
      if (logits === null) throw new Error("trainer: the loss node has no logits");
      const { vocab, stride } = this.rowLayout(logits);
      const row = (this.row ??= new Float32Array(vocab));
      for (let p = 0; p < this.windowSize; p++) {
        if (!window.lossMask[p]) continue;
        this.lib.ggml_backend_tensor_get(logits, row, p * stride, vocab * 4);
        let max = -Infinity;
        for (let i = 0; i < vocab; i++) if (row[i]! > max) max = row[i]!;
        let total = 0;
        for (let i = 0; i < vocab; i++) total += Math.exp(row[i]! - max);
        const value = Math.log(total) + max - row[window.labels[p]!]!;
        this.rows[p] = value;
        this.sum += value;
      }
      this.sawLoss = true;
    } else {
      const { stride } = this.rowLayout(tensor);
      for (let p = 0; p < this.windowSize;) {
        if (window.lossMask[p]) {
          p += 1;
          continue;
        }
        let end = p;
        while (end < this.windowSize && !window.lossMask[end]) end += 1;
        this.lib.ggml_backend_tensor_memset(tensor, 0, p * stride, (end - p) * stride);
        p = end;
      }
      this.sawBack = true;
    }
    return true;
  }

  /** Checks that a logits-shaped tensor is F32 rows of the vocabulary, one per window position. */
  private rowLayout(tensor: Pointer): { vocab: number; stride: number } {
    const vocab = tensorNe(tensor, 0);
    const stride = tensorNb(tensor, 1);
    if (
      tensorType(tensor) !== GGML_TYPE_F32 ||
      tensorNe(tensor, 1) !== this.windowSize ||
      stride !== vocab * 4
    )
      throw new Error(
        `trainer: unexpected logits layout (type ${tensorType(tensor)}, ${vocab} x ${tensorNe(tensor, 1)}, ` +
          `row stride ${stride}); ggml_tensor layout mismatch?`,
      );
    return { vocab, stride };
  }
}

/** Seconds since `start` (a `performance.now()`), for the log: `4.2 s`. */
function secondsSince(start: number): string {
  return `${((performance.now() - start) / 1000).toFixed(1)} s`;
}
