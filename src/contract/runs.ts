/**
 * The vocabulary of fine-tuning runs that the HTTP API, the CLI, the dashboard and the domain share:
 * statuses, methods, targets, output types, defaults and limits, and the shapes of a run's `config` and
 * `stats`. Each is defined here once; this module imports nothing but types.
 */

/**
 * Run states. QUEUED → RUNNING → READY | FAILED | CANCELLED; QUEUED → CANCELLED; a RUNNING run
 * whose worker stopped heartbeating goes back to QUEUED (or FAILED after `maxAttempts`).
 */
export const runStatuses = ["QUEUED", "RUNNING", "READY", "FAILED", "CANCELLED"] as const;
export type RunStatus = (typeof runStatuses)[number];
/**
 * An event id of a run's events stream, `<log seq>.<last train step>.<last eval step>.<stats hash>.<status>`
 * (`src/train/FollowCursor.ts`), or empty: what `Last-Event-ID` and `lastEventId` accept.
 */
export const RUN_EVENT_ID_PATTERN =
  "^$|^(-1|\\d{1,15})\\.(-1|\\d{1,15})\\.(-1|\\d{1,15})\\.([0-9a-z]{0,16})\\.([A-Z]{0,16})$";

/** The statuses of a run that has not ended. */
export const activeStatuses: readonly RunStatus[] = ["QUEUED", "RUNNING"];

/** How a run fine-tunes: `lora` trains an adapter on the frozen base model, `full` the weights themselves. */
export const TRAIN_METHODS = ["lora", "full"] as const;
export type TrainMethod = (typeof TRAIN_METHODS)[number];

/** Bounds of the LoRA settings; the API refuses values outside them. */
export const loraLimits = { minRank: 1, maxRank: 256, maxAlpha: 4096 } as const;

/**
 * The weights a LoRA adapter can target, by their llama.cpp tensor names: `blk.N.<target>.weight` in the
 * blocks `complexity` selects, and `output` for the output head (`output.weight`; skipped when the model ties
 * it to the token embeddings, as SmolLM2 does, since llama.cpp has no adapter path for the embeddings).
 */
export const LORA_TARGETS = [
  "attn_q",
  "attn_k",
  "attn_v",
  "attn_output",
  "ffn_gate",
  "ffn_up",
  "ffn_down",
  "output",
] as const;

export type LoraTarget = (typeof LORA_TARGETS)[number];

/**
 * The targets the llama.cpp trainer can train: `attn_k` and `attn_v` are left out because in the pinned
 * llama.cpp release keys and values reach attention through the KV cache (`set_rows`), which has no backward
 * pass, so adapters on them would get no gradient and never train. The torch trainer trains all of them.
 */
export const LLAMA_CPP_LORA_TARGETS = [
  "attn_q",
  "attn_output",
  "ffn_gate",
  "ffn_up",
  "ffn_down",
  "output",
] as const satisfies readonly LoraTarget[];

/** Weights that exist in llama.cpp models but cannot be trained by this release's backward pass. */
export const UNTRAINABLE_LORA_TARGETS = ["attn_k", "attn_v"] as const satisfies readonly LoraTarget[];

/**
 * The trainers: llama.cpp's own training API, shipped with node-llama-cpp (no install), and the PyTorch + PEFT
 * worker (`npm run setup:torch`).
 */
export const TRAINERS = ["llama.cpp", "torch"] as const;
export type TrainerName = (typeof TRAINERS)[number];

/** `CONDUIT_TRAINER`: a trainer, or `auto` (the torch trainer where it is installed and can train the run). */
export const TRAINER_SETTINGS = ["auto", ...TRAINERS] as const;
export type TrainerSetting = (typeof TRAINER_SETTINGS)[number];

/** The targets a LoRA run gets when it names none: every one its trainer can train. */
export function defaultLoraTargets(trainer: TrainerName): readonly LoraTarget[] {
  return trainer === "torch" ? LORA_TARGETS : LLAMA_CPP_LORA_TARGETS;
}

/** Quantization types the trained model can be written as (llama.cpp `llama_ftype` names). */
export const TRAINER_OUTPUT_TYPES = [
  "F32",
  "F16",
  "BF16",
  "Q8_0",
  "Q4_0",
  "Q4_1",
  "Q5_0",
  "Q5_1",
  "Q2_K",
  "Q3_K_S",
  "Q3_K_M",
  "Q3_K_L",
  "Q4_K_S",
  "Q4_K_M",
  "Q5_K_S",
  "Q5_K_M",
  "Q6_K",
] as const;
export type TrainerOutputType = (typeof TRAINER_OUTPUT_TYPES)[number];

/** The settings that accept `"auto"`. */
export const AUTO_SETTINGS = ["epochs", "lr", "loraRank"] as const;
export type AutoSetting = (typeof AUTO_SETTINGS)[number];

/**
 * The method's settings as stored: a LoRA run holds its effective rank, alpha (the adapter's
 * output is scaled by alpha / rank) and targets; a full run holds `null` for all three.
 */
export type TrainMethodConfig =
  | { method: "lora"; loraRank: number; loraAlpha: number; loraTargets: LoraTarget[] }
  | { method: "full"; loraRank: null; loraAlpha: null; loraTargets: null };

/** The effective configuration of a run, as stored in `config` and shown to users. */
export type RunConfig = RunConfigFields & TrainMethodConfig;

interface RunConfigFields {
  baseModelName: string;
  datasetID: string;
  datasetName: string;
  lr: number;
  epochs: number;
  steps: number | null;
  /** Fraction of the top transformer blocks that get adapters (`lora`) or train (`full`). */
  complexity: number;
  systemPrompt: string;
  name: string;
  trackerProject: string | null;
  trackerEntity: string | null;
  /** Tokens per training window (samples are packed into windows of this size). */
  contextSize: number;
  /** How the learning rate moves: cosine decay from `lr` to `lr * lrMinFraction` over the run. */
  lrSchedule: "cosine" | "linear" | "constant";
  lrMinFraction: number;
  /** Weight type of the served model. */
  outputType: TrainerOutputType;
  /**
   * Fraction of pairs held out for eval loss, when the dataset has at least 50 pairs (the
   * scheduler's `minPairsForEval`).
   */
  evalFraction: number;
  seed: number;
  /** Train on the whole conversation (prompt and template included) instead of the answers only. */
  trainOnInputs: boolean;
  /** A file (of this or another of the user's datasets) whose pairs are the eval set; replaces the random hold-out. */
  validationFileID: string | null;
  /** The validation file's name when the run was created, for people reading the config. */
  validationFileName: string | null;
  /** Evaluations without a new best eval loss before training stops; `null` never stops early. */
  earlyStoppingPatience: number | null;
  /** Which of `epochs`, `lr` and `loraRank` were chosen by `"auto"` (their chosen values are in their fields). */
  autoSettings: AutoSetting[];
  /** Which trainer trains the run, chosen at creation (`CONDUIT_TRAINER`); runs older than the choice have none: llama.cpp. */
  trainer?: TrainerName;
  /** What a run created through the OpenAI face was asked (`/v1/fine_tuning/jobs`); absent otherwise. */
  openai?: OpenAiJobRecord;
}

/** What the OpenAI face keeps in a run's `config.openai`. */
export interface OpenAiJobRecord {
  training_file: string;
  suffix: string | null;
  metadata: Record<string, string> | null;
  learning_rate_multiplier: number | null;
}

/**
 * Defaults of the settings that are not `"auto"` (epochs, lr and loraRank are chosen per run): the API documents
 * them, and a trainer job (`TrainerJob`) that leaves a setting out gets the same value.
 */
export const runDefaults = {
  method: "lora" as TrainMethod,
  /** The default alpha is this times the rank (a scale of 2). */
  loraAlphaPerRank: 2,
  complexity: 1,
  contextSize: 1024,
  lrSchedule: "cosine" as const,
  lrMinFraction: 0.1,
  outputType: "Q8_0" as TrainerOutputType,
  evalFraction: 0.1,
  seed: 42,
};

/** A point of a run's loss curves. */
export interface LossPoint {
  step: number;
  trainLoss: number;
}
export interface EvalLossPoint {
  step: number;
  epoch: number;
  evalLoss: number;
}

/**
 * What a run reports as it trains (`run.stats`, and the `stats` events of its event stream). Fields appear
 * as training goes: a QUEUED run has none.
 */
export interface RunStats {
  /** Optimizer steps done so far. */
  step?: number;
  totalSteps?: number;
  /** The epoch in progress (1-based). */
  epoch?: number;
  epochs?: number;
  /** Mean loss per trained token over the current epoch so far. */
  trainLoss?: number;
  /** The latest eval loss, per trained token of the held-out pairs. */
  evalLoss?: number;
  learningRate?: number;
  tokensPerSecond?: number;
  elapsedSeconds?: number;
  etaSeconds?: number;
  /** The training loss by step, thinned to at most 500 points. */
  lossSeries?: LossPoint[];
  evalLossSeries?: EvalLossPoint[];
  /** On a `stats` event: the series start over (the run restarted); they replace what was shown. */
  seriesReset?: boolean;
  /** The evaluation with the lowest eval loss: its weights are the ones served. */
  bestEpoch?: number;
  bestStep?: number;
  bestEvalLoss?: number;
  /** Training stopped because the eval loss had not improved for `earlyStoppingPatience` evaluations. */
  stoppedEarly?: boolean;
  /** What may have gone wrong, one plain sentence each. */
  warnings?: string[];
  /** The trainer's totals, once the run is READY. */
  final?: RunTotals;
}

/** A READY run's totals (`stats.final`). */
export interface RunTotals {
  steps: number;
  /** Epochs completed (the last may be partial when `maxSteps` cut it). */
  epochs: number;
  /** Window positions trained on (padding included). */
  trainTokens: number;
  /** Sample tokens trained on (padding excluded). */
  sampleTokens: number;
  /** Tokens whose loss counted (answers only, unless the run trains on inputs). */
  lossTokens: number;
  /** The training window in tokens. */
  windowSize: number;
  finalTrainLoss: number;
  finalEvalLoss?: number;
  /** Size of what was written: the adapter (LoRA) or the model (full). */
  outputBytes: number;
  /**
   * Seconds from the run's start on a worker (its latest attempt) to its results written: preparing the
   * examples, the trainer, the per-example losses. What `estimate.seconds` plans. Absent on runs trained before it.
   */
  runSeconds?: number;
}
