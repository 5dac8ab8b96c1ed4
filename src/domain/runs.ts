/**
 * A fine-tuning run as the domain knows it: what the store keeps, what training updates and what serving
 * reads, and the vocabulary of its settings (the trainers, the output types, the defaults). Training
 * (`src/train`) and serving (`src/inference`) both import this module and neither imports the other. What the
 * wire checks of a request (methods, targets, limits) is `src/contract/runs.ts`.
 */
import path from "node:path";
import type { LoraTarget, RunStats, RunStatus, TrainMethod } from "../contract/runs.ts";
import { TRAINERS, type TrainerName } from "../contract/runs.ts";
import { currentEstimate, type RunEstimate, type RunPlan } from "../contract/estimate.ts";
import { parseTimestamp } from "./time.ts";

export interface Run {
  id: string;
  userId: string;
  datasetId: string;
  datasetName: string;
  name: string;
  ioPairsCount: number;
  status: RunStatus;
  trackerUrl: string;
  config: RunConfig;
  stats: RunStats;
  logs: string[];
  error: string | null;
  modelPath: string | null;
  attempts: number;
  /** PAUSED while its worker is still stopping its trainer (OpenAI's `pausing`). */
  pausing: boolean;
  /** The estimate made when the run was created; null for runs created before estimates (or none could be made). */
  estimate: RunPlan | null;
  createdAt: string;
  updatedAt: string;
}

export { TRAINERS, type TrainerName };

/** `CONDUIT_TRAINER`: a trainer, or `auto` (the first trainer, by the registry's order, that can train the run). */
export const TRAINER_SETTINGS = ["auto", ...TRAINERS] as const;
export type TrainerSetting = (typeof TRAINER_SETTINGS)[number];

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

/**
 * `CONDUIT_ADAPTER_TYPE`: how a LoRA run's served adapter is stored. `q8_0` reads a quarter of F32's bytes per
 * token, which is what serving many adapters at once costs (bench/README.md §Serving many adapters); `f16` is
 * the half-size float. A LoRA run keeps it as its `outputType`.
 */
export const ADAPTER_TYPE_SETTINGS = ["q8_0", "f16"] as const;
export type AdapterTypeSetting = (typeof ADAPTER_TYPE_SETTINGS)[number];

/** The `outputType` of a LoRA run created with `CONDUIT_ADAPTER_TYPE` `setting`. */
export function adapterOutputType(setting: AdapterTypeSetting): TrainerOutputType {
  return setting === "f16" ? "F16" : "Q8_0";
}

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

type RunConfigFields = {
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
  /** Which trainer trains the run, chosen at creation (`CONDUIT_TRAINER`); see {@link trainerOf}. */
  trainer?: TrainerName;
  /** What a run created through a compatibility face was asked besides its settings; absent otherwise. */
  jobRequest?: JobRequest;
  /** The model that also grades the automatic before/after (a `score_model` grader); absent: none. */
  judgeModel?: string;
  /** A preference-tuning run's settings (`"method": "dpo"`, stored as a LoRA run with these); absent otherwise. */
  dpo?: DpoConfig;
};

/**
 * What a run created through a compatibility face was asked that its settings do not hold, kept to show the run
 * back as that face's job: the OpenAI face's `/v1/fine_tuning/jobs` (its training file, suffix, metadata). Runs
 * stored before it have `openai` with OpenAI's field names; the store reads them as this.
 */
export interface JobRequest {
  /** The face that was asked; its runs are served under its model names (`ft:…`, `servedModelName`). */
  face: "openai";
  /** The file the job named to train on, by the face's id. */
  trainingFileID: string;
  /** The suffix of the served model's name. */
  suffix: string | null;
  /** The job's metadata, returned as it was sent. */
  metadata: Record<string, string> | null;
  /** The learning-rate multiplier the job asked for; null when it did not say. */
  lrMultiplier: number | null;
  /** The fine-tuned model (`ft:` name) a DPO job continues, as it was asked; absent for a job on a base model. */
  model?: string;
}

/** What a run's training optimises: the answers' likelihood (`sft`), or the preferred answers' margin (`dpo`). */
export type TrainObjective = "sft" | "dpo";

/** The settings of a `dpo` run. */
export interface DpoConfig {
  /** How far the trained model may move from the reference: DPO's β (higher keeps it closer). */
  beta: number;
  /**
   * The READY supervised LoRA run whose adapter it starts from (its reference model is that run's model);
   * `null`: a new adapter on the base model (the reference is the base).
   */
  fromRunID: string | null;
}

/**
 * Defaults of the settings that are not `"auto"` (epochs, lr and loraRank are chosen per run), applied once, by
 * the run service when it creates a run; the API documents them (a unit test holds the request schema's
 * descriptions to these values).
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
  /** DPO's β of a `dpo` run (as OpenAI and TRL default it). */
  beta: 0.1,
};

/**
 * A run's method from its stored config. Runs created before LoRA existed have no `method`: they
 * trained every weight.
 */
export function methodOf(config: { method?: string }): TrainMethod {
  return config.method === "lora" ? "lora" : "full";
}

/** A run's trainer from its stored config. Runs created before there was a choice have none: llama.cpp trained them. */
export function trainerOf(config: { trainer?: TrainerName | undefined }): TrainerName {
  return config.trainer ?? "llama.cpp";
}

/**
 * Where a READY run's kept checkpoint `step` is (a LoRA adapter): `checkpoints/step-<step>.gguf` beside the run's
 * model file. `undefined` when the run has no model file.
 */
export function keptCheckpointPath(run: Pick<Run, "modelPath">, step: number): string | undefined {
  return run.modelPath === null
    ? undefined
    : path.join(path.dirname(run.modelPath), "checkpoints", `step-${step}.gguf`);
}

/** The run's estimate: its plan, refined from its stats (a RUNNING run's were written at its `updatedAt`). */
export function runEstimate(r: Run): RunEstimate | null {
  return currentEstimate(r.estimate, {
    status: r.status,
    stats: r.stats,
    updatedAt: parseTimestamp(r.updatedAt),
  });
}
