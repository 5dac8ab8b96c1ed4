import type { SamplingOptions } from "../../src/engine/types.ts";

/** Greedy sampling without penalties: the same answer every time. */
export const greedy = (maxTokens: number, extra: Partial<SamplingOptions> = {}): SamplingOptions => ({
  maxTokens,
  temperature: 0,
  topK: 40,
  topP: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
  ...extra,
});
