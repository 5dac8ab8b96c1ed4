import { ApiError } from "../../src/client/ApiError.ts";
import { ConduitClient } from "../../src/client/ConduitClient.ts";
import type { IoPairPreviewWire, ModelEntryWire } from "../../src/contract/client.ts";
import { activeStatuses, type RunStatus } from "../../src/contract/runs.ts";
import type {
  CreateRunBodyWire,
  DatasetFileWire,
  DatasetWire,
  RunCheckpointWire,
  RunExampleWire,
  RunSummaryWire,
  RunWire,
} from "../../src/contract/schemas.ts";
import type { EvalResultWire, EvalRunWire, EvalWire, RunEvaluation } from "../../src/contract/evals.ts";
import { apiKey, signOut } from "./auth.ts";

/**
 * The dashboard's API client: the one the CLI uses (src/client/), with the signed-in key; a key the
 * server refuses signs the user out. The wire types are the API's own (src/contract/), types only.
 */
export const api = new ConduitClient({
  key: apiKey,
  onError: (error) => {
    if (error.status === 401) signOut("The server did not accept the API key. Sign in again.");
  },
});

export { ApiError };
export type Dataset = DatasetWire;
export type DatasetFile = DatasetFileWire;
export type IoPairPreview = IoPairPreviewWire;
export type Run = RunWire;
/** A run as the list shows it: no log, no loss series. */
export type RunSummary = RunSummaryWire;
export type CreateRunBody = CreateRunBodyWire;
/** A training or validation pair of a READY run, with its loss under the served weights. */
export type RunExample = RunExampleWire;
/** A READY run's kept checkpoint, with the model name that serves it. */
export type RunCheckpoint = RunCheckpointWire;
export type Model = ModelEntryWire;
export type Eval = EvalWire;
export type EvalRun = EvalRunWire;
export type EvalResult = EvalResultWire;
export type { RunEvaluation };
export type { RunStats, RunStatus } from "../../src/contract/runs.ts";

export function isLive(status: RunStatus | "DELETED"): boolean {
  return status !== "DELETED" && activeStatuses.includes(status);
}

/** Checks a key before keeping it: any authenticated read will do (with this key, not the signed-in one). */
export async function checkKey(key: string): Promise<void> {
  try {
    await new ConduitClient({ key }).listDatasets({ limit: 1 });
  } catch (error) {
    if (error instanceof ApiError && error.status === 401)
      throw new ApiError("That API key was not accepted.", 401, error.code);
    throw error;
  }
}
