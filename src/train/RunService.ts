import { EventEmitter } from "node:events";
import fsp from "node:fs/promises";
import type { CreateRunBodyWire } from "../api/schemas.ts";
import type { DatasetService } from "../datasets/DatasetService.ts";
import type { BlobStore } from "../store/BlobStore.ts";
import type { ModelRef } from "../model/types.ts";
import { ConduitError } from "../errors.ts";
import { newId } from "../store/ids.ts";
import type { Page } from "../store/DatasetRepository.ts";
import type { Run, RunRepository } from "../store/RunRepository.ts";
import { LORA_TARGETS, UNTRAINABLE_LORA_TARGETS, type LoraTarget } from "./loraTargets.ts";

/** Finds base models by id (the engine's model registry). */
export interface ModelCatalog {
  resolve(id: string): ModelRef | undefined;
}

/** How a run fine-tunes: `lora` trains an adapter on the frozen base model, `full` the weights themselves. */
export const TRAIN_METHODS = ["lora", "full"] as const;
export type TrainMethod = (typeof TRAIN_METHODS)[number];

/** Bounds of the LoRA settings; the API refuses values outside them. */
export const loraLimits = { minRank: 1, maxRank: 256, maxAlpha: 4096 } as const;

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
  outputType: string;
  /**
   * Fraction of pairs held out for eval loss, when the dataset has at least 50 pairs (the
   * scheduler's `minPairsForEval`).
   */
  evalFraction: number;
  seed: number;
}

export const runDefaults = {
  method: "lora" as TrainMethod,
  loraRank: 16,
  /** The default alpha is this times the rank (a scale of 2). */
  loraAlphaPerRank: 2,
  loraTargets: LORA_TARGETS,
  lr: 5e-4,
  epochs: 3,
  complexity: 1,
  contextSize: 256,
  lrSchedule: "cosine" as const,
  lrMinFraction: 0.1,
  outputType: "Q8_0",
  evalFraction: 0.1,
  seed: 42,
};

/**
 * A run's method from its stored config. Runs created before LoRA existed have no `method`: they
 * trained every weight.
 */
export function methodOf(config: Record<string, unknown>): TrainMethod {
  return config.method === "lora" ? "lora" : "full";
}

/**
 * Refuses LoRA targets that are not in `LORA_TARGETS`, naming the reason. Runs before the body
 * schema's own check too (the route's `preValidation`), so that `attn_k` and `attn_v` get theirs
 * instead of a bare "must be one of". Anything that is not a list of strings is left to the schema.
 */
export function checkLoraTargets(targets: unknown): void {
  if (!Array.isArray(targets)) return;
  for (const target of targets) {
    if (typeof target !== "string" || (LORA_TARGETS as readonly string[]).includes(target)) continue;
    const allowed = LORA_TARGETS.join(", ");
    const message = (UNTRAINABLE_LORA_TARGETS as readonly string[]).includes(target)
      ? `"${target}" cannot be a LoRA target: this llama.cpp release gives the attention K and V weights ` +
        `no gradient (K and V pass through the KV cache), so an adapter on them would never train; ` +
        `the targets are ${allowed}`
      : `${JSON.stringify(target)} is not a LoRA target; the targets are ${allowed}`;
    throw new ConduitError("invalid_request", message, { param: "loraTargets" });
  }
}

/** The method and its settings, with defaults filled in; LoRA settings with method `full` are a 400. */
function methodConfig(body: CreateRunBodyWire): TrainMethodConfig {
  const method = body.method ?? runDefaults.method;
  if (method === "full") {
    for (const field of ["loraRank", "loraAlpha", "loraTargets"] as const)
      if (body[field] !== undefined)
        throw new ConduitError(
          "invalid_request",
          `"${field}" is a LoRA setting; leave it out with "method": "full" (or use "method": "lora")`,
          { param: field },
        );
    return { method, loraRank: null, loraAlpha: null, loraTargets: null };
  }
  checkLoraTargets(body.loraTargets);
  const targets = body.loraTargets ?? runDefaults.loraTargets;
  if (targets.length === 0)
    throw new ConduitError("invalid_request", '"loraTargets" needs at least one target', {
      param: "loraTargets",
    });
  if (new Set(targets).size !== targets.length)
    throw new ConduitError("invalid_request", '"loraTargets" lists a target twice', { param: "loraTargets" });
  const loraRank = body.loraRank ?? runDefaults.loraRank;
  return {
    method,
    loraRank,
    loraAlpha: body.loraAlpha ?? runDefaults.loraAlphaPerRank * loraRank,
    loraTargets: [...targets],
  };
}

/** A READY run's downloadable file: the adapter of a LoRA run, the model of a full run. */
export interface RunArtifact {
  path: string;
  /** `<run id>-lora.gguf` or `<run id>.gguf`. */
  fileName: string;
  sizeBytes: number;
}

export interface RunEvents {
  /** A run was created or cancelled; the scheduler wakes up. */
  changed: [runId: string];
}

/** Fine-tuning runs: creation with validated config, reads, cancel and delete. */
export class RunService {
  /** Emits `changed` so an in-process scheduler reacts at once instead of on its next poll. */
  readonly events = new EventEmitter<RunEvents>();

  constructor(
    private readonly runs: RunRepository,
    private readonly datasets: DatasetService,
    private readonly models: ModelCatalog,
    private readonly blobs: BlobStore,
    private readonly options: { defaultModel: string | undefined; trackerUrl: (runId: string) => string },
  ) {}

  async create(userId: string, body: CreateRunBodyWire): Promise<Run> {
    const method = methodConfig(body);
    const datasetId = body.datasetID ?? body.datasetId;
    if (!datasetId && !body.datasetName)
      throw new ConduitError("invalid_request", 'one of "datasetID" and "datasetName" is required', {
        param: "datasetID",
      });
    const dataset = await this.datasets.find(userId, { id: datasetId, name: body.datasetName });
    if (dataset.ioPairsCount === 0)
      throw new ConduitError(
        "invalid_request",
        `dataset ${dataset.id} has no IO pairs; upload a file first`,
        {
          param: datasetId ? "datasetID" : "datasetName",
        },
      );
    const baseModelName = body.baseModelName ?? this.options.defaultModel;
    if (!baseModelName)
      throw new ConduitError(
        "invalid_request",
        '"baseModelName" is required (no CONDUIT_DEFAULT_MODEL is set)',
        {
          param: "baseModelName",
        },
      );
    if (!this.models.resolve(baseModelName))
      throw new ConduitError("model_not_found", `model "${baseModelName}" not found`, {
        param: "baseModelName",
      });

    const id = newId("ft");
    const config: RunConfig = {
      baseModelName,
      datasetID: dataset.id,
      datasetName: dataset.name,
      lr: body.lr ?? runDefaults.lr,
      epochs: body.epochs ?? runDefaults.epochs,
      steps: body.steps ?? null,
      complexity: body.complexity ?? runDefaults.complexity,
      ...method,
      systemPrompt: body.systemPrompt ?? "",
      name: body.name ?? `${dataset.name}-${baseModelName}`,
      trackerProject: body.trackerProject ?? null,
      trackerEntity: body.trackerEntity ?? null,
      contextSize: runDefaults.contextSize,
      lrSchedule: runDefaults.lrSchedule,
      lrMinFraction: runDefaults.lrMinFraction,
      outputType: runDefaults.outputType,
      evalFraction: runDefaults.evalFraction,
      seed: runDefaults.seed,
    };
    const run = await this.runs.create({
      id,
      userId,
      datasetId: dataset.id,
      datasetName: dataset.name,
      name: config.name,
      ioPairsCount: dataset.ioPairsCount,
      trackerUrl: this.options.trackerUrl(id),
      config: { ...config },
    });
    this.events.emit("changed", id);
    return run;
  }

  async get(userId: string, id: string): Promise<Run> {
    const run = await this.runs.get(userId, id);
    if (!run) throw new ConduitError("not_found", `run ${id} not found`, { param: "finetune_id" });
    return run;
  }

  /**
   * What a READY run produced, for download: its adapter (`lora`) or its model (`full`). A run that
   * is not READY is a 409; a READY run whose file is not on this server's disk a 404.
   */
  async artifact(userId: string, id: string): Promise<RunArtifact> {
    const run = await this.get(userId, id);
    if (run.status !== "READY" || !run.modelPath)
      throw new ConduitError(
        "conflict",
        `run ${run.id} is ${run.status}, not READY; only a READY run has a file to download`,
      );
    const fileName = methodOf(run.config) === "lora" ? `${run.id}-lora.gguf` : `${run.id}.gguf`;
    const stat = await fsp.stat(run.modelPath).catch(() => undefined);
    if (!stat?.isFile())
      throw new ConduitError(
        "not_found",
        `run ${run.id} is READY but its file ${fileName} is not in this server's storage ` +
          "(removed from disk, or trained by a server that does not share this one's data directory)",
      );
    return { path: run.modelPath, fileName, sizeBytes: stat.size };
  }

  list(userId: string, page: Page): Promise<Run[]> {
    return this.runs.list(userId, page);
  }

  /** Cancels a QUEUED or RUNNING run; a finished one is a 409. */
  async cancel(userId: string, id: string): Promise<void> {
    const previous = await this.runs.cancel(userId, id);
    if (previous === undefined)
      throw new ConduitError("not_found", `run ${id} not found`, { param: "finetune_id" });
    if (previous !== "QUEUED" && previous !== "RUNNING")
      throw new ConduitError("conflict", `run ${id} is ${previous} and cannot be cancelled`);
    this.events.emit("changed", id);
  }

  /** Deletes a run; a running one is cancelled first so its trainer stops. */
  async delete(userId: string, id: string): Promise<Run> {
    const run = await this.get(userId, id);
    if (run.status === "QUEUED" || run.status === "RUNNING") {
      await this.runs.cancel(userId, id);
      this.events.emit("changed", id);
    }
    if (!(await this.runs.delete(userId, id)))
      throw new ConduitError("not_found", `run ${id} not found`, { param: "finetune_id" });
    // A live run's files are removed by its worker once the trainer has stopped.
    if (run.status !== "QUEUED" && run.status !== "RUNNING") await this.blobs.remove(`runs/${id}`);
    return run;
  }
}
