import type { Dataset, DatasetFile } from "../../domain/datasets.ts";
import { runEstimate, type Run } from "../../domain/runs.ts";
import type { RunEvaluation } from "../../contract/evals.ts";
import type { DatasetFileWire, DatasetWire, RunSummaryWire, RunWire } from "../../contract/schemas.ts";

/** Domain records → the Conduit API's wire shapes (both spellings of the dataset id where the API has them). */

export function toDatasetWire(d: Dataset): DatasetWire {
  return {
    id: d.id,
    userId: d.userId,
    name: d.name,
    ioPairsCount: d.ioPairsCount,
    status: d.status,
    createdAt: d.createdAt,
    updatedAt: d.updatedAt,
  };
}

export function toFileWire(f: DatasetFile): DatasetFileWire {
  return {
    id: f.id,
    datasetId: f.datasetId,
    datasetID: f.datasetId,
    name: f.name,
    size: f.size,
    type: f.type,
    format: f.format as DatasetFileWire["format"],
    ioPairsCount: f.ioPairsCount,
    createdAt: f.createdAt,
    updatedAt: f.updatedAt,
  };
}

/** A run on the Conduit face, with its automatic before/after (`evaluation`, null when none was made). */
export function toRunWire(r: Run, evaluation: RunEvaluation | null): RunWire {
  return {
    id: r.id,
    userId: r.userId,
    datasetId: r.datasetId,
    datasetID: r.datasetId,
    datasetName: r.datasetName,
    name: r.name,
    ioPairsCount: r.ioPairsCount,
    status: r.status,
    trackerURL: r.trackerUrl,
    createdAt: r.createdAt,
    updatedAt: r.updatedAt,
    logs: r.logs,
    stats: r.stats,
    config: r.config,
    error: r.error,
    estimate: runEstimate(r),
    evaluation,
  };
}

/** A run as lists show it: no log, no loss series (the run itself has them). */
export function toRunSummaryWire(r: Run, evaluation: RunEvaluation | null): RunSummaryWire {
  const { logs: _logs, stats, ...rest } = toRunWire(r, evaluation);
  const { lossSeries: _loss, evalLossSeries: _eval, ...summary } = stats;
  return { ...rest, stats: summary };
}

export const SUCCESS = { message: "SUCCESS" } as const;
