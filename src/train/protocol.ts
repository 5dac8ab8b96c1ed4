/**
 * What the API process and the trainer child process say to each other over the `child_process.fork`
 * IPC channel, and the job they agree on. One job per child: the parent sends `{type: "job"}`, may
 * send `{type: "cancel"}`, and the child answers with logs and progress, then exactly one of `done`,
 * `cancelled` or `error`, and exits.
 */
import type { LoraTarget, RunTotals, TrainerName, TrainerOutputType } from "../contract/runs.ts";
import type { TrainerBackend } from "./native/llamaLib.ts";

/** How the learning rate moves over the run's optimizer steps. */
export interface LearningRateSchedule {
  /**
   * `constant` keeps `learningRate`; `linear` and `cosine` decay from `learningRate` towards
   * `learningRate * minFraction` over the steps after warm-up. Defaults to `runDefaults.lrSchedule` (`"cosine"`).
   */
  kind?: "constant" | "linear" | "cosine";
  /** Steps over which the rate ramps up linearly to `learningRate` first. Defaults to `0`. */
  warmupSteps?: number;
  /** Where a decay ends, as a fraction of `learningRate`. Defaults to `runDefaults.lrMinFraction` (`0.1`). */
  minFraction?: number;
}

/** A piece of a training text, and whether its tokens are trained on (count in the loss). */
export interface SampleSegment {
  text: string;
  train: boolean;
  /**
   * `text` as the chat template's own text (`special`: control-token text is meant) and the pair's
   * contents (not `special`: written by a person). When a content holds control-token text, the pieces
   * are tokenized one by one so that it stays text; otherwise `text` is tokenized at once. Absent: all
   * of `text` is the template's.
   */
  pieces?: readonly { text: string; special: boolean }[];
}

/**
 * One training example: a text trained on in full, or segments of which only those with
 * `train: true` count in the loss (the assistant's answers and their end markers). Segments are
 * tokenized one by one and joined, exactly as inference tokenizes the prompt and then generates.
 */
export type TrainingSample = string | readonly SampleSegment[];

/** The loss of one example with the served weights. */
export interface ExampleLoss {
  /** Mean loss in nats per trained token; `null` when the example has no trained token. */
  loss: number | null;
  /** Its trained tokens. */
  tokens: number;
}

/** A LoRA adapter's shape. */
export interface LoraJobOptions {
  /** Rank of the A·B update. */
  rank: number;
  /** llama.cpp scales the update by `alpha / rank`. */
  alpha: number;
  /** Weights of each adapted block that get an adapter. */
  targets: LoraTarget[];
}

/**
 * A fine-tuning job on a GGUF model: a LoRA adapter trained on the frozen base (`method: "lora"`), or
 * full-weight training of the top transformer blocks (`"full"`).
 */
export interface TrainerJob {
  /**
   * Which trainer computes: llama.cpp's own training API in the trainer process (`"llama.cpp"`), or the
   * PyTorch + PEFT worker (`"torch"`, LoRA only, needs `torch`). Defaults to `"llama.cpp"`.
   */
  backend?: TrainerName;
  /** The `torch` backend's Python and where it computes; required with `backend: "torch"`. */
  torch?: TorchJobOptions;
  /**
   * `"lora"` writes an adapter GGUF to `outputPath` (the base stays frozen, in its own type when quantized);
   * `"full"` writes a whole model. Defaults to `runDefaults.method` (`"lora"`).
   */
  method?: "lora" | "full";
  /** The adapter's rank, alpha and targets; required with `method: "lora"`. */
  lora?: LoraJobOptions;
  /** The GGUF model to start from; any type llama.cpp can dequantize (it is converted to F32 first). */
  baseModelPath: string;
  /** Where the trained GGUF is written, atomically (temp file + rename in the same directory). */
  outputPath: string;
  /** Scratch directory for the F32 copies of the model; the caller owns and removes it. */
  workDir: string;
  /**
   * Training examples. Special-token text such as `<|im_end|>` is parsed as the control token. One of
   * `samples` and `samplesFile` is required.
   */
  samples?: TrainingSample[];
  /**
   * The training examples in a JSONL file instead: one object with a `sample` field (a `TrainingSample`)
   * per line; other fields are ignored. The trainer reads it as a stream and keeps its tokens on disk in
   * `workDir`, so its memory does not grow with the file (a few bytes per example).
   */
  samplesFile?: string;
  /** Held-out examples whose loss is measured after each epoch (and every quarter of a long one). Defaults to none. */
  evalSamples?: TrainingSample[];
  /** The held-out examples in a JSONL file, as `samplesFile`. Defaults to none. */
  evalSamplesFile?: string | null;
  /**
   * Where the per-example losses are written, one `{"loss","tokens"}` JSON line per example (the
   * training examples in order, then the held-out ones), instead of in the `done` message, whose
   * `examples` lists are then empty. Defaults to none (the losses are in the `done` message).
   */
  lossesFile?: string | null;
  /**
   * Most tokens the job may train on: its samples' tokens times its epochs (within `maxSteps`). A job
   * over it fails once its samples are tokenized, before its first step, with the numbers (the
   * scheduler passes `CONDUIT_MAX_RUN_TOKENS`). Defaults to no limit.
   */
  maxTrainTokens?: number | null;
  /**
   * Evaluations in a row without a new best eval loss after which training stops. Defaults to
   * `null` (never stops early).
   */
  earlyStoppingPatience?: number | null;
  /**
   * Where the latest and the best checkpoint are kept. A job started again with the same settings
   * and samples resumes from the latest (the optimizer's moments start again from zero). The caller
   * owns and removes it. Defaults to none (no checkpoints: the best weights are still kept in memory).
   */
  checkpointDir?: string | null;
  /**
   * Packs several examples into each training window (they attend to the ones before them in it);
   * `false` gives every example a window of its own, several times slower on short examples.
   * Defaults to `true` (docs/fine-tuning.md, "What training optimises", has the measurement).
   */
  packing?: boolean;
  /** `sgd` exists for tests of the gradient (its update is linear in it). Defaults to `"adamw"`. */
  optimizer?: "adamw" | "sgd";
  /** Peak AdamW learning rate. */
  learningRate: number;
  /** Passes over `samples`. */
  epochs: number;
  /** Caps the total number of optimizer steps (one step per context window). Defaults to no cap. */
  maxSteps?: number;
  /**
   * Fraction of the transformer blocks that train, counted from the top: 1 trains every block,
   * 0.25 the top quarter (at least one block). `output` and `output_norm` always train.
   * Defaults to `runDefaults.complexity` (`1`).
   */
  complexity?: number;
  /**
   * The longest training window. The window is the smallest multiple of 64 tokens (at least 256) that
   * holds the longest example, capped by this and by the model's trained context; an example longer
   * than the cap fails the job before training. Defaults to `runDefaults.contextSize` (`1024`).
   */
  contextSize?: number;
  /** CPU threads for llama.cpp. Defaults to `1`. */
  threads?: number;
  /**
   * Where to compute (`CONDUIT_GPU` as the engine resolved it): `cpu`, or a GPU backend with the model layers
   * it takes (`all` or a count). A GPU backend whose device does not register trains on the CPU, with a log
   * line. Defaults to `{ backend: "cpu", layers: 0 }`.
   */
  gpu?: { backend: TrainerBackend; layers: "all" | number };
  /**
   * A ggml BLAS backend library for the llama.cpp trainer to load on the CPU (`npm run setup:trainer`,
   * blasBackend.ts): LoRA then trains on an F32 copy of the base. Defaults to `null` (none).
   */
  blasLibrary?: string | null;
  /**
   * OpenBLAS's threads in the BLAS backend (`OPENBLAS_NUM_THREADS`, unless the environment sets it); ggml's own
   * CPU ops keep `threads`. Defaults to `threads`.
   */
  blasThreads?: number;
  /** Type of the written model. Defaults to `runDefaults.outputType` (`"Q8_0"`). */
  outputType?: TrainerOutputType;
  /** Seeds the order in which samples are packed into windows each epoch. Defaults to `runDefaults.seed` (`42`). */
  seed?: number;
  /** Learning-rate schedule. Defaults to `runDefaults`' (cosine decay to 0.1 × the rate, no warm-up). */
  lrSchedule?: LearningRateSchedule;
  /** AdamW decoupled weight decay. Defaults to `0`. */
  weightDecay?: number;
}

/** How the `torch` backend runs. */
export interface TorchJobOptions {
  /** The Python executable that has the pinned PyTorch, transformers, PEFT and gguf packages. */
  python: string;
  /** `auto` uses CUDA when PyTorch sees a GPU. Defaults to `"auto"`. */
  device?: "auto" | "cpu" | "cuda";
  /** Type of the base weights: `auto` is bf16 where the hardware computes it natively, else F32. Defaults to `"auto"`. */
  dtype?: "auto" | "bf16" | "f32";
  /**
   * For tests and benches: after training, the trained model's logits for these tokens (one sequence) are
   * written to `file`, raw F32 `[tokens, vocab]`, to compare with llama.cpp serving the exported adapter.
   * Defaults to none.
   */
  probe?: { tokens: number[]; file: string } | null;
  /**
   * Where the worker keeps a dequantized copy of each base it loads (transformers parses and dequantizes a GGUF
   * in Python on every load: 15–40 s for small models), so that the next run on the same file loads in about
   * a second. Defaults to none (every run loads the GGUF).
   */
  cacheDir?: string | null;
}

/** A job with every default applied; this is what crosses the IPC channel. */
export type ResolvedTrainerJob = Required<
  Omit<
    TrainerJob,
    | "maxSteps"
    | "lrSchedule"
    | "lora"
    | "earlyStoppingPatience"
    | "checkpointDir"
    | "samples"
    | "samplesFile"
    | "evalSamplesFile"
    | "lossesFile"
    | "maxTrainTokens"
    | "torch"
  >
> & {
  /** Set with `backend: "torch"`, else `null`. */
  torch: Required<TorchJobOptions> | null;
  /** Empty when the samples are in `samplesFile`. */
  samples: TrainingSample[];
  samplesFile: string | null;
  evalSamplesFile: string | null;
  lossesFile: string | null;
  maxTrainTokens: number | null;
  earlyStoppingPatience: number | null;
  checkpointDir: string | null;
  maxSteps: number | null;
  lrSchedule: Required<LearningRateSchedule>;
  /** Set with `method: "lora"`, else `null`. */
  lora: LoraJobOptions | null;
};

export interface TrainerProgress {
  /** Optimizer steps done so far (1-based once the first has run). */
  step: number;
  totalSteps: number;
  /** The epoch in progress (1-based). */
  epoch: number;
  /** Epochs the run will start, after `maxSteps` is applied. */
  epochs: number;
  /** Mean loss per trained token over the current epoch so far. */
  trainLoss: number;
  /** Mean loss per trained token on `evalSamples`, present on the progress report of an evaluation. */
  evalLoss?: number;
  /** The learning rate of the last step. */
  learningRate: number;
  /** Training tokens (whole windows, padding included) per second of training so far. */
  tokensPerSecond: number;
  elapsedSeconds: number;
  etaSeconds: number;
}

/** A finished job's figures: the totals a READY run shows (`stats.final`, {@link RunTotals}), and more. */
export interface TrainingStats extends RunTotals {
  /** The evaluation with the lowest eval loss: its weights are the ones written. */
  bestEvalLoss?: number;
  bestEpoch?: number;
  bestStep?: number;
  /** Training stopped because the eval loss had not improved for `earlyStoppingPatience` evaluations. */
  stoppedEarly: boolean;
  /** The step this attempt resumed from (0 when it started from the base). */
  resumedFromStep: number;
  /** Plain-words warnings about how the run learned. */
  warnings: string[];
  tokensPerSecond: number;
  /** Seconds spent in optimizer steps and evaluation. */
  trainSeconds: number;
  /** Seconds for the whole job, conversions and saving included. */
  elapsedSeconds: number;
  trainableTensors: number;
  trainableParameters: number;
  /** Peak resident memory of the trainer process. */
  peakRssBytes: number;
  /** On a GPU: the most GPU memory the run took (drop of the devices' free memory since it started). */
  peakGpuBytes?: number;
  /** CPU seconds (all threads of the trainer process) of its training steps, evaluations left out. */
  trainCpuSeconds?: number;
  /** Wall and CPU seconds of the first step (graph and buffer allocation, kernel selection), for benches. */
  firstStepSeconds?: number;
  firstStepCpuSeconds?: number;
}

export type ParentMessage = { type: "job"; job: ResolvedTrainerJob } | { type: "cancel" };

export type ChildMessage =
  | { type: "log"; line: string }
  | ({ type: "progress" } & TrainerProgress)
  | {
      type: "done";
      outputPath: string;
      stats: TrainingStats;
      /**
       * Per-example loss with the written weights, in the order of `samples` and `evalSamples`; empty
       * lists when the job has a `lossesFile`.
       */
      examples: { train: ExampleLoss[]; eval: ExampleLoss[] };
    }
  /** `outOfSpace`: the disk (or quota) was full, so the job could not write its files. */
  | { type: "error"; message: string; outOfSpace?: boolean }
  | { type: "cancelled" };
