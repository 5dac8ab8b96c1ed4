/**
 * What the API process and the trainer child process say to each other over the `child_process.fork` IPC
 * channel. One job per child: the parent sends `{type: "job"}`, may send `{type: "cancel"}`, and the child
 * answers with logs and progress, then exactly one of `done`, `cancelled` or `error`, and exits.
 */
import type { ExampleLoss, TrainerProgress, TrainingStats } from "./core/trainerJob.ts";
import type { AnyTrainerJob } from "./trainers.ts";

export type ParentMessage = { type: "job"; job: AnyTrainerJob } | { type: "cancel" };

export type ChildMessage =
  | { type: "log"; line: string }
  | ({ type: "progress" } & TrainerProgress)
  | {
      type: "done";
      outputPath: string;
      stats: TrainingStats;
      /**
       * Per-example loss with the written weights, in the order of `samples` and `evalSamples`; empty
       * lists when the job has a `lossesFile`.
       */
      examples: { train: ExampleLoss[]; eval: ExampleLoss[] };
    }
  /** `outOfSpace`: the disk (or quota) was full, so the job could not write its files. */
  | { type: "error"; message: string; outOfSpace?: boolean }
  | { type: "cancelled" };
