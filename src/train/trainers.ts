/**
 * The trainers this build of Conduit has, keyed by name (`TRAINERS`, a run's `config.trainer`). Adding one is
 * a folder exporting a `TrainerBackend` (see `core/TrainerBackend.ts`), its name in `TRAINERS`
 * (`src/domain/runs.ts`) and its line here; the compiler names whatever else must know of it.
 */
import type { TrainerName } from "../domain/runs.ts";
import type { TrainerBackend } from "./core/TrainerBackend.ts";
import type { TrainerJob } from "./core/trainerJob.ts";
import { llamaCppTrainer } from "./native/llamaCppTrainer.ts";
import { torchTrainer } from "./torch/torchTrainer.ts";

/**
 * Every trainer, in the order `CONDUIT_TRAINER=auto` tries them: the first that is available and can train a
 * run gets it. The torch trainer comes first (faster, where it is installed); llama.cpp, which ships with
 * Conduit and trains what torch does not (full fine-tunes), last.
 */
const registry = {
  torch: torchTrainer,
  "llama.cpp": llamaCppTrainer,
} satisfies Record<TrainerName, TrainerBackend>;

/** A trainer's own job settings (`TrainerJob.options`), by its name. */
export type TrainerOptions<N extends TrainerName> =
  (typeof registry)[N] extends TrainerBackend<infer Options> ? Options : never;

/** The trainers by name, each with the options its jobs carry. */
export const trainers: { readonly [N in TrainerName]: TrainerBackend<TrainerOptions<N>> } = registry;

/** A job for each trainer, its options typed by its name. */
export type TrainerJobs = { [N in TrainerName]: TrainerJob<TrainerOptions<N>> & { trainer: N } };

/** A job for one of the trainers: what the trainer child process receives. */
export type AnyTrainerJob = TrainerJobs[TrainerName];

/** The trainers in the order `auto` tries them. */
export function trainersInOrder(): TrainerBackend[] {
  return Object.values(trainers);
}

/** Runs a job on its trainer (in the trainer child process). */
export function runJob<N extends TrainerName>(
  job: TrainerJobs[N],
  hooks: Parameters<TrainerBackend["run"]>[1],
) {
  const backend: TrainerBackend<TrainerOptions<N>> = trainers[job.trainer];
  return backend.run(job, hooks);
}
