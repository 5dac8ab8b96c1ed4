/**
 * OpenAI's files and fine-tuning jobs, translated onto Conduit's datasets, files and runs (one store,
 * two faces). An OpenAI file is a Conduit file: `POST /v1/files` stores each upload as a dataset of its
 * own, named after the file, and every file of the user's datasets is listed. A job is a run on the
 * training file's dataset (which must hold nothing else but the validation file), and its id is the
 * run id. OpenAI's status names, event objects and `ft:` model names exist on this face only.
 */
import type { Core } from "../../core.ts";
import { ConduitError, inFaceNames } from "../../errors.ts";
import { openAiJobFields } from "./errorFields.ts";
import type { DatasetFile } from "../../domain/datasets.ts";
import type { RunCheckpoint, RunStatus } from "../../contract/runs.ts";
import type { JobRequest, Run } from "../../domain/runs.ts";
import { checkpointModelName, servedModelName } from "../../domain/modelNames.ts";
import type { CreateRun } from "../../train/commands.ts";
import { runEstimate } from "../../domain/runs.ts";
import type {
  OpenAiDpoHyperparametersWire,
  OpenAiCheckpointListWire,
  OpenAiJobCreateBodyWire,
  OpenAiJobEventWire,
  OpenAiJobWire,
} from "../../contract/openAiFineTuning.ts";
import { parseTimestamp } from "../../domain/time.ts";

type OpenAiStatus = Exclude<OpenAiJobWire["status"], "pausing">;

/** Run status → OpenAI job status (a PAUSED run whose trainer is still stopping is `pausing`). */
export const openAiStatus: Record<RunStatus, OpenAiStatus> = {
  QUEUED: "queued",
  RUNNING: "running",
  PAUSED: "paused",
  READY: "succeeded",
  FAILED: "failed",
  CANCELLED: "cancelled",
};

/** Unix seconds of a stored timestamp (`YYYY-MM-DD HH:MM:SS.mmm`, UTC). */
export function unixSeconds(timestamp: string): number {
  return Math.floor(parseTimestamp(timestamp) / 1000);
}

export function toOpenAiFile(file: DatasetFile) {
  return {
    id: file.id,
    object: "file" as const,
    bytes: file.size,
    created_at: unixSeconds(file.createdAt),
    filename: file.name,
    purpose: "fine-tune" as const,
    status: "processed" as const,
    status_details: null,
    expires_at: null,
    dataset_id: file.datasetId,
  };
}

const RESULT_FILE_PREFIX = "file-";

/** A job's result file id: `file-{run id}` (an uploaded file's id is `file_…`, never `file-…`). */
export function resultFileId(runId: string): string {
  return `${RESULT_FILE_PREFIX}${runId}`;
}

/** The run whose result file `fileId` is, or `undefined` when it names an uploaded file. */
export function resultFileRun(fileId: string): string | undefined {
  return fileId.startsWith(RESULT_FILE_PREFIX) ? fileId.slice(RESULT_FILE_PREFIX.length) : undefined;
}

/** A succeeded job's result file: what the run produced (`RunService.artifact`), as an OpenAI file. */
export function toOpenAiResultFile(run: Run, artifact: { fileName: string; sizeBytes: number }) {
  return {
    id: resultFileId(run.id),
    object: "file" as const,
    bytes: artifact.sizeBytes,
    created_at: unixSeconds(run.updatedAt),
    filename: artifact.fileName,
    purpose: "fine-tune-results" as const,
    status: "processed" as const,
    status_details: null,
    expires_at: null,
    dataset_id: null,
  };
}

function recordOf(run: Run): Partial<JobRequest> {
  const request = run.config.jobRequest;
  return request?.face === "openai" ? request : {};
}

const ended = (status: RunStatus) => status === "READY" || status === "FAILED" || status === "CANCELLED";

/** When a run's last log line was written (an ended run's last line comes with its end). */
function lastLogSeconds(run: Run): number | undefined {
  const last = run.logs.at(-1);
  return last === undefined ? undefined : unixSeconds(last.slice(0, 23));
}

export function toOpenAiJob(run: Run): OpenAiJobWire {
  const record = recordOf(run);
  const stats = run.stats as { final?: { sampleTokens?: unknown } };
  // A RUNNING run's finish is in its estimate; a QUEUED one's counts from now (the queue ahead left out).
  const estimate = runEstimate(run);
  const hyperparameters = {
    n_epochs: Number(run.config.epochs),
    learning_rate_multiplier: record.lrMultiplier ?? 1,
    batch_size: "auto" as const,
  };
  const finished = ended(run.status) ? Math.max(unixSeconds(run.updatedAt), lastLogSeconds(run) ?? 0) : null;
  return {
    id: run.id,
    object: "fine_tuning.job",
    created_at: unixSeconds(run.createdAt),
    finished_at: finished,
    estimated_finish: !estimate
      ? null
      : estimate.finishAt !== null
        ? unixSeconds(estimate.finishAt)
        : run.status === "QUEUED"
          ? Math.round(Date.now() / 1000 + estimate.remainingSeconds)
          : null,
    error:
      run.status === "FAILED"
        ? { code: "training_failed", message: run.error ?? "the run failed", param: null }
        : null,
    fine_tuned_model: run.status === "READY" ? servedModelName(run) : null,
    model: record.model ?? String(run.config.baseModelName),
    organization_id: run.userId,
    result_files: run.status === "READY" && run.modelPath ? [resultFileId(run.id)] : [],
    seed: Number(run.config.seed),
    status: run.pausing ? "pausing" : openAiStatus[run.status],
    trained_tokens: typeof stats.final?.sampleTokens === "number" ? stats.final.sampleTokens : null,
    training_file: record.trainingFileID ?? run.datasetId,
    validation_file: typeof run.config.validationFileID === "string" ? run.config.validationFileID : null,
    hyperparameters,
    method:
      run.config.dpo === undefined
        ? { type: "supervised", supervised: { hyperparameters } }
        : { type: "dpo", dpo: { hyperparameters: { ...hyperparameters, beta: run.config.dpo.beta } } },
    integrations: [],
    metadata: record.metadata ?? null,
    user_provided_suffix: record.suffix ?? null,
  };
}

/** What a job's final event says. */
const endMessages: Partial<Record<RunStatus, (run: Run) => string>> = {
  READY: (run) => `The job has successfully completed: the model is ${servedModelName(run)}`,
  FAILED: (run) => `The job failed: ${run.error ?? "unknown reason"}`,
  CANCELLED: () => "The job was cancelled",
};

/**
 * A job's events, oldest first: one for each line of the run's log (queued, settings, started,
 * epochs, warnings, the outcome), then, once the run has ended, one saying how (with `data.status`).
 * Event ids are `ftevent-{run id}-{line}` and `ftevent-{run id}-end`.
 */
export function toOpenAiJobEvents(run: Run): OpenAiJobEventWire[] {
  const events: OpenAiJobEventWire[] = run.logs.map((line, index) => {
    const message = line.slice(24);
    return {
      id: `ftevent-${run.id}-${index}`,
      object: "fine_tuning.job.event",
      created_at: unixSeconds(line.slice(0, 23)),
      level: message.startsWith("run failed") ? "error" : / warning: /.test(` ${message}`) ? "warn" : "info",
      message,
      type: "message",
      data: null,
    };
  });
  const end = endMessages[run.status];
  if (end)
    events.push({
      id: `ftevent-${run.id}-end`,
      object: "fine_tuning.job.event",
      created_at: Math.max(unixSeconds(run.updatedAt), lastLogSeconds(run) ?? 0),
      level: run.status === "FAILED" ? "error" : "info",
      message: end(run),
      type: "message",
      data: { status: openAiStatus[run.status] },
    });
  return events;
}

/** A page of events, newest first, older than the event `after`. */
export function eventPage(run: Run, after: string | undefined, limit: number) {
  const events = toOpenAiJobEvents(run).reverse();
  let start = 0;
  if (after !== undefined) {
    start = events.findIndex((event) => event.id === after) + 1;
    if (start === 0)
      throw new ConduitError("invalid_request", `query field "after": no event ${after} in job ${run.id}`, {
        param: "after",
      });
  }
  const data = events.slice(start, start + limit);
  return { object: "list" as const, data, has_more: start + limit < events.length };
}

/**
 * The hyperparameters, from `method.supervised` (or `method.dpo`) or the older top-level field (not both); the
 * method's object must be the one `method.type` names.
 */
function hyperparametersOf(body: OpenAiJobCreateBodyWire): OpenAiDpoHyperparametersWire {
  const type = body.method?.type ?? "supervised";
  const other = type === "dpo" ? "supervised" : "dpo";
  if (body.method?.[other] !== undefined && body.method[other] !== null)
    throw new ConduitError(
      "invalid_request",
      `"method.${other}" does not go with "method.type": "${type}"; give "method.${type}"`,
      { param: `method.${other}` },
    );
  const nested =
    type === "dpo" ? body.method?.dpo?.hyperparameters : body.method?.supervised?.hyperparameters;
  if (nested !== undefined && body.hyperparameters !== undefined)
    throw new ConduitError(
      "invalid_request",
      `give the hyperparameters once: in "method.${type}.hyperparameters" (or the older "hyperparameters")`,
      { param: "hyperparameters" },
    );
  return nested ?? body.hyperparameters ?? {};
}

/**
 * Starts a job: a run on the training file's dataset. That dataset may hold no other file than the
 * validation file (a job trains on one file); `POST /v1/files` makes such a dataset for each upload.
 */
export async function createOpenAiJob(
  core: Core,
  userId: string,
  body: OpenAiJobCreateBodyWire,
): Promise<Run> {
  const hyperparameters = hyperparametersOf(body);
  // Characters as JSON Schema counts them (code points, as the document's limit is stated), not UTF-16 units.
  for (const key of Object.keys(body.metadata ?? {}))
    if ([...key].length > 64)
      throw new ConduitError(
        "invalid_request",
        `metadata key "${[...key].slice(0, 64).join("")}…" is longer than 64 characters`,
        {
          param: "metadata",
        },
      );
  const dpo = body.method?.type === "dpo";
  const fineTuned = body.model.startsWith("ft:") || body.model.startsWith("ft_");
  if (fineTuned && !dpo)
    throw new ConduitError(
      "invalid_request",
      `"${body.model}" is a fine-tuned model; only preference tuning ("method": {"type": "dpo"}) continues one: ` +
        "fine-tune its base model",
      { param: "model" },
    );
  const file = await core.datasets.getUserFile(userId, body.training_file, "training_file");
  const others = (await core.datasets.listFiles(userId, file.datasetId, { limit: 3, offset: 0 })).filter(
    (f) => f.id !== file.id && f.id !== body.validation_file,
  );
  if (others.length > 0)
    throw new ConduitError(
      "invalid_request",
      `file ${file.id} is one of several files of dataset ${file.datasetId}, and a job trains on its file alone: ` +
        "upload it with POST /v1/files (or train the whole dataset with POST /conduit/finetuning)",
      { param: "training_file" },
    );
  const multiplier =
    typeof hyperparameters.learning_rate_multiplier === "number"
      ? hyperparameters.learning_rate_multiplier
      : null;
  const jobRequest: JobRequest = {
    face: "openai",
    trainingFileID: file.id,
    suffix: body.suffix ?? null,
    metadata: body.metadata ?? null,
    lrMultiplier: multiplier,
    ...(fineTuned ? { model: body.model } : {}),
  };
  const command: CreateRun = {
    datasetID: file.datasetId,
    // Preference tuning of a fine-tuned model continues its adapter, on its base.
    ...(fineTuned ? { fromRunID: body.model } : { baseModelName: body.model }),
    ...(dpo
      ? {
          method: "dpo" as const,
          beta: typeof hyperparameters.beta === "number" ? hyperparameters.beta : undefined,
        }
      : {}),
    epochs: hyperparameters.n_epochs ?? "auto",
    validationFileID: body.validation_file,
    name: body.suffix,
    seed: body.seed,
    lrMultiplier: multiplier ?? undefined,
    jobRequest,
  };
  try {
    return await core.runs.create(userId, command);
  } catch (error) {
    throw error instanceof ConduitError ? inFaceNames(error, openAiJobFields) : error;
  }
}

/** A kept checkpoint's id on OpenAI's face: `ftckpt_<run id without ft_>_<step>`. */
export function openAiCheckpointId(run: Pick<Run, "id">, step: number): string {
  return `ftckpt_${run.id.replace(/^ft_/, "")}_${step}`;
}

/** A job's kept checkpoints on OpenAI's face, newest first, paged with `after` (a checkpoint id) and `limit`. */
export function checkpointPage(
  run: Run,
  checkpoints: RunCheckpoint[],
  after: string | undefined,
  limit: number,
): OpenAiCheckpointListWire {
  const all = checkpoints.map((c) => ({
    id: openAiCheckpointId(run, c.step),
    object: "fine_tuning.job.checkpoint" as const,
    created_at: unixSeconds(c.createdAt),
    fine_tuned_model_checkpoint: checkpointModelName(run, c.step),
    fine_tuning_job_id: run.id,
    metrics: {
      step: c.step,
      train_loss: c.trainLoss,
      ...(c.evalLoss === undefined ? {} : { valid_loss: c.evalLoss, full_valid_loss: c.evalLoss }),
    },
    step_number: c.step,
  }));
  const start = after === undefined ? 0 : all.findIndex((c) => c.id === after) + 1;
  if (after !== undefined && start === 0)
    throw new ConduitError("invalid_request", `after: job ${run.id} has no checkpoint ${after}`, {
      param: "after",
    });
  const data = all.slice(start, start + limit);
  return {
    object: "list",
    data,
    first_id: data[0]?.id ?? null,
    last_id: data.at(-1)?.id ?? null,
    has_more: start + limit < all.length,
  };
}
