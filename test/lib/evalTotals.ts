import type { ModelTotals } from "../../src/contract/evals.ts";

/** One model's totals in a before/after eval of 20 items: `exact` exact matches and a mean similarity. */
export function beforeAfterTotals(model: string, exact: number, similarity: number): ModelTotals {
  return {
    model,
    answered: 20,
    errored: 0,
    passed: exact,
    graders: [
      { name: "exact_match", type: "exact_match", passed: exact, failed: 20 - exact, meanScore: exact / 20 },
      { name: "similarity", type: "similarity", passed: 0, failed: 20, meanScore: similarity },
    ],
    promptTokens: 0,
    completionTokens: 0,
    meanLatencySeconds: 0,
  };
}
