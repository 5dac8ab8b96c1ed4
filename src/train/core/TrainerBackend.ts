/**
 * The seam between Conduit and a trainer. The run service asks a trainer, before it queues a run, whether it
 * is installed here and can train the run, with which default LoRA targets, and how fast; the scheduler asks it
 * for its options on this worker before it starts a job; the trainer child process runs the job with it.
 * Each trainer is one folder (`native/` for llama.cpp, `torch/`) exporting one `TrainerBackend`, and one line
 * of the registry (`src/train/trainers.ts`), keyed by its name.
 */
import os from "node:os";
import type { Static, TObject } from "@sinclair/typebox";
import type { GpuLayers, GpuSetting } from "../../contract/accelerator.ts";
import type { LoraTarget, TrainMethod } from "../../contract/runs.ts";
import type { TrainerName, TrainObjective } from "../../domain/runs.ts";
import type { ComputeDevice } from "../libllama/llamaLib.ts";
import type { ExampleLoss, TrainerJob, TrainerProgress, TrainingStats } from "./trainerJob.ts";

export interface TrainerBackend<Options = unknown> {
  /** Its key in the registry, and a run's `config.trainer`. */
  readonly name: TrainerName;
  /** The command that installs it, for messages (`npm run setup:torch`); `null` when it ships with Conduit. */
  readonly setupCommand: string | null;
  /** Whether it can train on this server, and if not why; cached where finding out is slow. */
  status(host: TrainerHost): Promise<TrainerStatus>;
  /** Its block of `/healthz`, under its name. */
  readonly health: TrainerHealth;
  /**
   * Why it cannot train a run, whether or not it is installed (the method, the base model's architecture, the
   * LoRA targets asked for), or `undefined` when it can.
   */
  cannotTrain(run: TrainingRequest): Refusal | undefined;
  /** The LoRA targets it trains: a LoRA run that names none gets all of them. */
  readonly loraTargets: readonly LoraTarget[];
  /** Its compute threads for `CONDUIT_TRAIN_THREADS`: a count as it is; `auto`, its own choice for this machine. */
  threads(setting: number | "auto"): number;
  /** Its speed before any run of it was measured on this server, for a run's estimate. */
  prior(host: TrainerHost): EstimatePrior;
  /**
   * The host memory its process needs at its peak to train `method` on `model` (bytes, measured: bench/README.md),
   * for the check at creation that a run fits beside what the server has loaded.
   */
  memoryNeed(method: TrainMethod, model: ModelSize, host: TrainerHost): Promise<number>;
  /** Its settings for a job on this worker (where it computes, the libraries it loads); needs it available. */
  jobOptions(host: TrainerHost): Promise<Options>;
  /** Trains a job; runs in the trainer child process. */
  run(job: TrainerJob<Options>, hooks: TrainingHooks): Promise<TrainingResult>;
}

/** What a server offers its trainers: its settings and where it computes (`core.ts` makes it from the config). */
export interface TrainerHost {
  /** `CONDUIT_TRAIN_THREADS`: compute threads of each trainer, or `auto` (each trainer's own choice). */
  threads: number | "auto";
  /** `CONDUIT_GPU` as set: `off` keeps every trainer on the CPU. */
  gpu: GpuSetting;
  /** Where generation computes, as the engine resolved `CONDUIT_GPU`: trainers compute there too. */
  accelerator(): Promise<{ device: ComputeDevice; gpuLayers: GpuLayers }>;
  /** `CONDUIT_PYTHON`: the torch trainer's Python; `undefined` takes the project's venv when there is one. */
  python: string | undefined;
  /** `CONDUIT_TRAIN_RANKS`: the torch trainer's data-parallel processes on this machine. */
  ranks: number;
  /** `CONDUIT_TRAIN_NODES`: machines a torch run trains on, this one first. */
  nodes: number;
  /** `CONDUIT_TRAIN_RENDEZVOUS`: where the other machines reach this one; `null` with one machine. */
  rendezvous: { host: string; port: number } | null;
  /** `CONDUIT_TRAINER_BLAS`: the llama.cpp trainer's BLAS backend, `off`, or `undefined` (the project's, if built). */
  blas: string | undefined;
  /** Where trainers keep what outlives a run (the torch worker's dequantized bases). */
  cacheDir: string;
}

export type TrainerStatus =
  /** `detail`: what it computes with, for logs (`PyTorch 2.13.0+cpu + PEFT 0.21.2 on the CPU, bf16`). */
  { available: true; detail?: string } | { available: false; reason: string };

/**
 * A trainer's block of `/healthz`: its schema (described, for the OpenAPI document), and the block now, as last
 * known: reading it never waits on a check (it may start one, and then says so).
 */
export interface TrainerHealth<Schema extends TObject = TObject> {
  readonly schema: Schema;
  now(host: TrainerHost): Static<Schema>;
}

/** What a trainer is asked to train, as far as its ability goes. */
export interface TrainingRequest {
  method: TrainMethod;
  /** What it optimises: the supervised loss, or DPO's on preference examples. */
  objective: TrainObjective;
  /** The base model's `general.architecture`. */
  architecture: string;
  /** The LoRA targets the run named; `undefined` when it named none (the trainer's own). */
  loraTargets: readonly LoraTarget[] | undefined;
}

/** Why a trainer cannot train a run: one sentence, and the field of the run to blame (the domain's name). */
export interface Refusal {
  param: "method" | "baseModelName" | "loraTargets" | "trainer";
  why: string;
}

/** A base model's size as the estimate sees it. */
export interface ModelSize {
  /** Every tensor's elements, embeddings included. */
  parameters: number;
  /** llama.cpp's name of the file type (`F32`, `Q8_0`, `Q4_K_M` …); `null` when the header has none. */
  fileType: string | null;
  sizeBytes: number;
  /** The model's file. */
  file: string;
}

/** A trainer's peak memory as a line of the base's parameters: `fixed` bytes plus `perParameter` bytes each. */
export interface MemoryLine {
  fixed: number;
  perParameter: number;
}

/** This machine's memory, or the container's limit when that is less (cgroups: `process.constrainedMemory`). */
export function totalMemory(): number {
  const limit = process.constrainedMemory();
  return limit > 0 ? Math.min(os.totalmem(), limit) : os.totalmem();
}

/** The bytes a {@link MemoryLine} gives for `parameters`. */
export function memoryOf(line: MemoryLine, parameters: number): number {
  return line.fixed + line.perParameter * parameters;
}

/** How fast a trainer is expected to be before it was measured on this server: its benches, scaled. */
export interface EstimatePrior {
  /** Training tokens per second (wall clock) of `method` on a model with `threads` compute threads. */
  tokensPerSecond(method: TrainMethod, model: ModelSize, threads: number): number;
  /** Seconds a run spends outside its training loop besides per-example losses (starting, loading the base). */
  overheadSeconds(model: ModelSize): number;
  /** What a forward pass (evaluation, per-example losses) costs against a training step. */
  forwardShare: number;
}

export interface TrainingHooks {
  log(line: string): void;
  progress(progress: TrainerProgress): void;
  /** Polled between optimizer steps; true stops the run at that step boundary. */
  isCancelled(): boolean;
  /** Lets the event loop run between steps so that a cancel message can arrive. */
  yieldToEventLoop(): Promise<void>;
}

export type TrainingResult =
  | {
      status: "completed";
      outputPath: string;
      stats: TrainingStats;
      examples: { train: ExampleLoss[]; eval: ExampleLoss[] };
    }
  | { status: "cancelled" };
