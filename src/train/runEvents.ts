import { EventEmitter } from "node:events";
import type { Run } from "../domain/runs.ts";
import type { TrainerProgress } from "./core/trainerJob.ts";

/** How a run ended. */
export type RunEnd = "READY" | "FAILED" | "CANCELLED";

/**
 * What happens to runs, as this process sees it: the scheduler wakes up on `changed`; trackers
 * (MLflow) follow a run from `created` through `progress` to `ended`.
 */
export interface RunEvents {
  /** A run was created or cancelled; the scheduler wakes up. */
  changed: [runId: string];
  /** A run was created (QUEUED). */
  created: [run: Run];
  /** A trainer of this process reported progress on a run. */
  progress: [runId: string, progress: TrainerProgress];
  /** A run ended: READY or FAILED by this process's scheduler, CANCELLED by a user of this process. */
  ended: [runId: string, status: RunEnd];
  /** A run was deleted by a user of this process; what served its model file must let it go. */
  deleted: [run: Run];
}

/**
 * The process's run event bus: created once by the core and handed to who emits (the run service, the
 * scheduler) and who listens (the scheduler, trackers).
 */
export type RunEventBus = EventEmitter<RunEvents>;

export function createRunEventBus(): RunEventBus {
  return new EventEmitter<RunEvents>();
}
