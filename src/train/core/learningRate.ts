import type { LearningRateSchedule } from "./trainerJob.ts";

/**
 * The learning rate for optimizer step `step` (0-based) of `totalSteps`. Warm-up ramps linearly to
 * `base`; a decay runs over the remaining steps towards `base * minFraction`, evaluated so that the
 * last step still has a positive rate (ggml-opt asserts `alpha > 0`).
 */
export function learningRateAt(
  base: number,
  schedule: LearningRateSchedule,
  step: number,
  totalSteps: number,
): number {
  const warmup = Math.max(0, Math.floor(schedule.warmupSteps));
  if (step < warmup) return (base * (step + 1)) / (warmup + 1);
  if (schedule.kind === "constant") return base;
  const decaySteps = Math.max(1, totalSteps - warmup);
  const progress = Math.min(1, (step - warmup) / decaySteps);
  const shape = schedule.kind === "linear" ? 1 - progress : 0.5 * (1 + Math.cos(Math.PI * progress));
  const floor = base * Math.min(1, Math.max(0, schedule.minFraction));
  return Math.max(floor + (base - floor) * shape, Number.MIN_VALUE);
}
