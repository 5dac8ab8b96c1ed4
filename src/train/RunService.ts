import { EventEmitter } from "node:events";
import type { CreateRunBodyWire } from "../api/schemas.ts";
import type { DatasetService } from "../datasets/DatasetService.ts";
import type { BlobStore } from "../store/BlobStore.ts";
import type { ModelRef } from "../model/types.ts";
import { ConduitError } from "../errors.ts";
import { newId } from "../store/ids.ts";
import type { Page } from "../store/DatasetRepository.ts";
import type { Run, RunRepository } from "../store/RunRepository.ts";

/** Finds base models by id (the engine's model registry). */
export interface ModelCatalog {
  resolve(id: string): ModelRef | undefined;
}

/** The effective configuration of a run, as stored in `config` and shown to users. */
export interface RunConfig {
  baseModelName: string;
  datasetID: string;
  datasetName: string;
  lr: number;
  epochs: number;
  steps: number | null;
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
