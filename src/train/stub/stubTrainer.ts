/**
 * A trainer that is never available: the newcomer's exercise of adding a trainer (issue #41), the compiler
 * walking through every place that must know of it.
 */
import type { TrainerBackend } from "../core/TrainerBackend.ts";

/** The stub's settings for a job: none. */
export type StubOptions = Record<string, never>;

export const stubTrainer: TrainerBackend<StubOptions> = {
  name: "stub",
  setupCommand: null,
  status: () => Promise.resolve({ available: false, reason: "the stub trainer trains nothing" }),
  cannotTrain: () => undefined,
  loraTargets: ["output"],
  threads: (setting) => (setting === "auto" ? 1 : setting),
  prior: () => ({ tokensPerSecond: () => 1, overheadSeconds: () => 0, forwardShare: 1 }),
  jobOptions: () => Promise.resolve({}),
  run: () => Promise.reject(new Error("trainer: the stub trainer trains nothing")),
};
