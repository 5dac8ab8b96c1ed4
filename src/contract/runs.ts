/**
 * What the wire says of fine-tuning runs, shared by the HTTP API, the CLI, the dashboard and the domain:
 * statuses, methods, LoRA targets and limits (the request schema checks them), and the shape of a run's
 * `stats`. The run's settings and their defaults are the domain's (`src/domain/runs.ts`). Each is defined
 * here once.
 */
import { ConduitError } from "../errors.ts";

/**
 * Run states. QUEUED → RUNNING → READY | FAILED | CANCELLED; QUEUED → CANCELLED; a RUNNING run
 * whose worker stopped heartbeating goes back to QUEUED (or FAILED after `maxAttempts`). QUEUED or RUNNING →
 * PAUSED by a user (a RUNNING run's trainer stops, its checkpoint kept), PAUSED → QUEUED when resumed (it
 * resumes from its checkpoint), PAUSED → CANCELLED.
 */
export const runStatuses = ["QUEUED", "RUNNING", "PAUSED", "READY", "FAILED", "CANCELLED"] as const;
export type RunStatus = (typeof runStatuses)[number];
/**
 * An event id of a run's events stream, `<log seq>.<last train step>.<last eval step>.<stats hash>.<status>`
 * (`src/train/FollowCursor.ts`), or empty: what `Last-Event-ID` and `lastEventId` accept.
 */
export const RUN_EVENT_ID_PATTERN =
  "^$|^(-1|\\d{1,15})\\.(-1|\\d{1,15})\\.(-1|\\d{1,15})\\.([0-9a-z]{0,16})\\.([A-Z]{0,16})$";

/** The statuses of a run that has not ended (a PAUSED run goes on once resumed). */
export const activeStatuses: readonly RunStatus[] = ["QUEUED", "RUNNING", "PAUSED"];

/** How a run fine-tunes: `lora` trains an adapter on the frozen base model, `full` the weights themselves. */
export const TRAIN_METHODS = ["lora", "full"] as const;
export type TrainMethod = (typeof TRAIN_METHODS)[number];

/**
 * What a run may ask for as its `method`: a way of training the weights (`TRAIN_METHODS`, supervised on
 * pairs), or `dpo`, preference tuning (Direct Preference Optimization) of a LoRA adapter on preference
 * examples. A `dpo` run is stored as `method: "lora"` with its `dpo` settings.
 */
export const RUN_METHODS = [...TRAIN_METHODS, "dpo"] as const;
export type RunMethod = (typeof RUN_METHODS)[number];

/**
 * The trainers, by the name a run's `config.trainer` keeps (and a run may ask for): llama.cpp's own training API,
 * shipped with node-llama-cpp (no install), and the PyTorch + PEFT worker (`npm run setup:torch`). Each is a
 * backend of `src/train/trainers.ts`, whose registry the compiler holds to this list.
 */
export const TRAINERS = ["llama.cpp", "torch"] as const;
export type TrainerName = (typeof TRAINERS)[number];

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
 * Refuses LoRA targets that are not in `LORA_TARGETS`, naming them and the targets: the request's shape, which
 * the Conduit face checks before the body schema's own check (the route's `preValidation`), so that a typo
 * gets the list instead of a bare "must be one of". Anything that is not a list of strings is left to the
 * schema. Whether the run's trainer can train a target is the trainer's to say (`TrainerBackend.cannotTrain`).
 */
export function checkLoraTargets(targets: unknown): void {
  if (!Array.isArray(targets)) return;
  for (const target of targets) {
    if (typeof target !== "string" || (LORA_TARGETS as readonly string[]).includes(target)) continue;
    throw new ConduitError(
      "invalid_request",
      `${JSON.stringify(target)} is not a LoRA target; the targets are ${LORA_TARGETS.join(", ")}`,
      { param: "loraTargets" },
    );
  }
}

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
  /**
   * When the run's current attempt started on its worker (`YYYY-MM-DD HH:MM:SS.mmm`, UTC): until its first step,
   * the planned time counts down from it.
   */
  startedAt?: string;
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
  /**
   * A `dpo` run's reward margin: β × how much more the trained model prefers the preferred answer over the
   * non-preferred one than the reference does, averaged over the current epoch so far (`trainLoss` is the DPO loss).
   */
  rewardMargin?: number;
  /** A `dpo` run's share of examples, over the current epoch so far, whose preferred answer wins (margin > 0). */
  rewardAccuracy?: number;
  /** A `dpo` run's reward margin on the validation pairs at the latest evaluation (`evalLoss` is their DPO loss). */
  evalRewardMargin?: number;
  /** A `dpo` run's share of validation pairs whose preferred answer wins, at the latest evaluation. */
  evalRewardAccuracy?: number;
  /** The trainer's totals, once the run is READY. */
  final?: RunTotals;
  /** The checkpoints kept of a READY run (its last epochs' ends), oldest first; each is servable. */
  checkpoints?: RunCheckpoint[];
}

/** A kept checkpoint: the weights at an epoch's end, served as `<the run's model name>:ckpt-step-<step>`. */
export interface RunCheckpoint {
  step: number;
  /** The epoch that ended there (1-based). */
  epoch: number;
  /** Mean loss per trained token over that epoch. */
  trainLoss: number;
  /** The eval loss there; absent without an eval set. */
  evalLoss?: number;
  /** When it was written (`YYYY-MM-DD HH:MM:SS.mmm`, UTC). */
  createdAt: string;
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
