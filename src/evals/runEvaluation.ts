import type { EvaluationSide, ModelTotals, RunEvaluation } from "../contract/evals.ts";
import type { RunEvalRun } from "../domain/evals.ts";

/** The name of the automatic before/after's judge grader (EvalService's `afterRunJudge`), whose scores are read here. */
export const AFTER_RUN_JUDGE = "judge";

/** Positive when `a` did better than `b`: exact matches, then the judge's score (when both have one), then similarity. */
function compare(a: EvaluationSide, b: EvaluationSide): number {
  if (a.exact !== b.exact) return a.exact - b.exact;
  if (a.judge !== undefined && b.judge !== undefined && a.judge !== b.judge) return a.judge - b.judge;
  return a.similarity - b.similarity;
}

function side(totals: ModelTotals | undefined, items: number): EvaluationSide | null {
  if (!totals) return null;
  const exact = totals.graders.find((g) => g.type === "exact_match");
  const similarity = totals.graders.find((g) => g.type === "similarity");
  const judge = totals.graders.find((g) => g.type === "score_model" && g.name === AFTER_RUN_JUDGE);
  return {
    model: totals.model,
    items,
    exact: exact?.passed ?? 0,
    similarity: Math.round((similarity?.meanScore ?? 0) * 1000) / 1000,
    ...(judge ? { judge: Math.round(judge.meanScore * 1000) / 1000 } : {}),
  };
}

/**
 * A fine-tuning run's before/after from the eval run made for it (models: the base, then the fine-tune): the
 * numbers, whether the fine-tune did better, and the line the run shows, e.g.
 * `base 0/20 → fine-tune 20/20 exact match (similarity 0.05 → 0.98): improved`, with `, judge 0.10 → 0.90` in the
 * parentheses when a judge graded it. Better means more exact matches, then (a tie) a higher judge score where
 * there is one, then a higher similarity.
 */
export function describeEvaluation(run: RunEvalRun): RunEvaluation {
  const items = run.models.length > 0 ? run.progress.total / run.models.length : 0;
  const base = side(run.results[0], items);
  const fineTuned = side(run.results[1], items);
  const completed = run.status === "COMPLETED" && base !== null && fineTuned !== null;
  const order = completed ? compare(fineTuned, base) : 0;
  const improved = completed ? order > 0 : null;
  const worse = completed && order < 0;
  const numbers =
    base && fineTuned
      ? `base ${base.exact}/${items} → fine-tune ${fineTuned.exact}/${items} exact match ` +
        `(similarity ${base.similarity.toFixed(2)} → ${fineTuned.similarity.toFixed(2)}` +
        (base.judge !== undefined && fineTuned.judge !== undefined
          ? `, judge ${base.judge.toFixed(2)} → ${fineTuned.judge.toFixed(2)})`
          : ")")
      : `${items} held-out pairs`;
  const summary = completed
    ? `${numbers}: ${improved ? "improved" : worse ? "worse than the base model" : "no better than the base model"}`
    : run.status === "FAILED"
      ? `${numbers}: failed (${run.error ?? "unknown error"})`
      : run.status === "CANCELLED"
        ? `${numbers}: cancelled`
        : `${numbers}: ${run.status === "QUEUED" ? "queued" : `${run.progress.completed}/${run.progress.total} answers`}`;
  return { evalId: run.evalId, evalRunId: run.id, status: run.status, base, fineTuned, improved, summary };
}
