/**
 * A training job, whichever trainer computes it: what it trains on, how, and where it writes; and what it
 * reports back (progress, per-example losses, the totals). The scheduler builds a complete job from a run's
 * stored config (every setting defaulted once, when the run was created) and what its worker offers; the
 * trainer child process receives it as it is.
 */
import type { LoraTarget, RunTotals, TrainMethod } from "../../contract/runs.ts";
import type { TrainerName, TrainerOutputType } from "../../domain/runs.ts";

/** How the learning rate moves over the run's optimizer steps. */
export interface LearningRateSchedule {
  /**
   * `constant` keeps `learningRate`; `linear` and `cosine` decay from `learningRate` towards
   * `learningRate * minFraction` over the steps after warm-up.
   */
  kind: "constant" | "linear" | "cosine";
  /** Steps over which the rate ramps up linearly to `learningRate` first. */
  warmupSteps: number;
  /** Where a decay ends, as a fraction of `learningRate`, in [0, 1]. */
  minFraction: number;
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
  /** The update is scaled by `alpha / rank`. */
  alpha: number;
  /** Weights of each adapted block that get an adapter. */
  targets: LoraTarget[];
}

/**
 * A fine-tuning job on a GGUF model: a LoRA adapter trained on the frozen base (`method: "lora"`), or
 * full-weight training of the top transformer blocks (`"full"`). Every field is set: what a run left to its
 * default was filled in when the run was created. `Options` are the trainer's own settings (where it
 * computes, the libraries it loads), each trainer typing its own (`src/train/trainers.ts` pairs them).
 */
export interface TrainerJob<Options = unknown> {
  /** Which trainer computes: a key of the trainers' registry (`src/train/trainers.ts`). */
  trainer: TrainerName;
  /** The trainer's own settings for this job. */
  options: Options;
  /** `"lora"` writes an adapter GGUF to `outputPath` (the base stays frozen); `"full"` writes a whole model. */
  method: TrainMethod;
  /** The adapter's rank, alpha and targets with `method: "lora"`; `null` with `"full"`. */
  lora: LoraJobOptions | null;
  /** The GGUF model to start from; any type llama.cpp can read. */
  baseModelPath: string;
  /** Where the trained GGUF is written, atomically (temp file + rename in the same directory). */
  outputPath: string;
  /** Scratch directory (token files, converted copies of the model); the caller owns and removes it. */
  workDir: string;
  /**
   * Training examples. Special-token text such as `<|im_end|>` is parsed as the control token. Empty when they
   * are in `samplesFile`.
   */
  samples: TrainingSample[];
  /**
   * The training examples in a JSONL file instead: one object with a `sample` field (a `TrainingSample`) per
   * line; other fields are ignored. The trainer reads it as a stream and keeps its tokens on disk in `workDir`,
   * so its memory does not grow with the file (a few bytes per example). `null`: they are in `samples`.
   */
  samplesFile: string | null;
  /** Held-out examples whose loss is measured after each epoch (and every quarter of a long one); may be empty. */
  evalSamples: TrainingSample[];
  /** The held-out examples in a JSONL file, as `samplesFile`; `null` for none (or `evalSamples`). */
  evalSamplesFile: string | null;
  /**
   * Where the per-example losses are written, one `{"loss","tokens"}` JSON line per example (the training
   * examples in order, then the held-out ones), instead of in the result, whose `examples` lists are then
   * empty. `null`: in the result.
   */
  lossesFile: string | null;
  /**
   * Most tokens the job may train on: its samples' tokens times its epochs (within `maxSteps`). A job over it
   * fails once its samples are tokenized, before its first step, with the numbers (the scheduler passes
   * `CONDUIT_MAX_RUN_TOKENS`). `null`: no limit.
   */
  maxTrainTokens: number | null;
  /** Evaluations in a row without a new best eval loss after which training stops; `null` never stops early. */
  earlyStoppingPatience: number | null;
  /**
   * Where the latest and the best checkpoint are kept. A job started again with the same settings and samples
   * resumes from the latest (the optimizer's moments start again from zero). The caller owns and removes it.
   * `null`: no checkpoints (the best weights are still kept in memory).
   */
  checkpointDir: string | null;
  /**
   * Packs several examples into each training window (they attend to the ones before them in it); `false`
   * gives every example a window of its own, several times slower on short examples (runs pack: docs/fine-tuning.md,
   * "What training optimises", has the measurement).
   */
  packing: boolean;
  /** `adamw` trains runs; `sgd` exists for tests of the gradient (its update is linear in it). */
  optimizer: "adamw" | "sgd";
  /** Peak learning rate. */
  learningRate: number;
  /** Passes over `samples`. */
  epochs: number;
  /** Caps the total number of optimizer steps (one step per window); `null`: no cap. */
  maxSteps: number | null;
  /**
   * Fraction of the transformer blocks that train, counted from the top: 1 trains every block, 0.25 the top
   * quarter (at least one block). With `"full"`, `output` and `output_norm` always train.
   */
  complexity: number;
  /**
   * The longest training window. The window is the smallest multiple of 256 tokens that holds the longest
   * example, capped by this and by the model's trained context; an example longer than the cap fails the job
   * before training.
   */
  contextSize: number;
  /** Compute threads. */
  threads: number;
  /** Type of the written model (`"full"`), or of the LoRA adapter (F32, F16 or Q8_0; see `servedAdapterType`). */
  outputType: TrainerOutputType;
  /** Seeds the order in which samples are packed into windows each epoch, and the adapter's initial A. */
  seed: number;
  /** How the learning rate moves over the optimizer steps. */
  lrSchedule: LearningRateSchedule;
  /** AdamW decoupled weight decay, in [0, 1]. */
  weightDecay: number;
  /**
   * Preference tuning (DPO) instead of the supervised loss: every line of `samplesFile` and `evalSamplesFile`
   * also has `rejected`, the conversation ending with the non-preferred answer; each example is a window of its
   * own (`packing` is false). `null`: the supervised loss.
   */
  preference: PreferenceJobOptions | null;
}

/** A preference-tuning job's settings. */
export interface PreferenceJobOptions {
  /** DPO's β. */
  beta: number;
  /**
   * A LoRA adapter GGUF of the same base, rank, alpha and targets that the trained adapter starts from (its
   * model is the reference); `null`: a new adapter (the base is the reference).
   */
  initAdapterPath: string | null;
}

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
  /** Preference tuning (`trainLoss` and `evalLoss` are then DPO losses per example): see `RunStats`. */
  rewardMargin?: number;
  rewardAccuracy?: number;
  evalRewardMargin?: number;
  evalRewardAccuracy?: number;
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
