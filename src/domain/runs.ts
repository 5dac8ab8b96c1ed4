/**
 * A fine-tuning run as the domain knows it: what the store keeps, what training updates and what serving
 * reads. Training (`src/train`) and serving (`src/inference`) both import this module and neither imports
 * the other.
 */
import type { RunConfig, RunStats, RunStatus, TrainMethod } from "../contract/runs.ts";
import type { RunPlan } from "../contract/estimate.ts";

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
  /** The estimate made when the run was created; null for runs created before estimates (or none could be made). */
  estimate: RunPlan | null;
  createdAt: string;
  updatedAt: string;
}

/**
 * A run's method from its stored config. Runs created before LoRA existed have no `method`: they
 * trained every weight.
 */
export function methodOf(config: { method?: string }): TrainMethod {
  return config.method === "lora" ? "lora" : "full";
}
