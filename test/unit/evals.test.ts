import assert from "node:assert/strict";
import { test } from "node:test";
import {
  gradersOfCriteria,
  openAiGraderError,
  perModelUsage,
  resolveOpenAiItems,
  runRequest,
} from "../../src/api/openai/evalsWire.ts";
import { fuzzyMatch, grade, normalize, settleGraders, tokenF1 } from "../../src/evals/graders.ts";
import { describeEvaluation } from "../../src/evals/runEvaluation.ts";
import type { EvalRun } from "../../src/domain/evals.ts";
import { beforeAfterTotals } from "../lib/evalTotals.ts";

/** The OpenAI face's criteria as the eval service settles them, its errors in OpenAI's names (as `POST /v1/evals`). */
function settledCriteria(criteria: Parameters<typeof gradersOfCriteria>[0]) {
  const { graders, expectedField } = gradersOfCriteria(criteria);
  try {
    return { graders: settleGraders(graders), expectedField };
  } catch (error) {
    throw openAiGraderError(error);
  }
}

test("normalisation: case, whitespace, punctuation at the ends", () => {
  assert.equal(normalize("  Billing.\n", ["case", "whitespace", "punctuation"]), "billing");
  assert.equal(normalize(" a   b ", ["whitespace"]), "a b");
  assert.equal(normalize("«Yes!»", ["punctuation"]), "Yes");
  assert.equal(normalize("A.B", ["punctuation"]), "A.B");
  assert.equal(normalize(" A ", []), " A ");
});

test("similarity: token F1 and the character-level ratio", () => {
  assert.equal(tokenF1("4 July 2023", "4 July 2023"), 1);
  assert.equal(tokenF1("the cat sat", "cat sat down"), 2 / 3);
  assert.equal(tokenF1("Paris!", "paris"), 1);
  assert.equal(tokenF1("", "x"), 0);
  assert.equal(tokenF1("", ""), 1);
  assert.equal(fuzzyMatch("kitten", "sitting"), 1 - 3 / 7);
  assert.equal(fuzzyMatch(" same ", "same"), 1);
});

test("graders score answers: exact with and without normalisation, contains, regex, JSON schema, similarity", () => {
  const graders = settleGraders([
    { type: "exact_match" },
    { type: "exact_match", name: "loose", normalize: ["case", "whitespace", "punctuation"] },
    { type: "contains", normalize: ["case"] },
    { type: "regex", pattern: "^\\d+ [A-Z]", flags: "" },
    { type: "json_schema", schema: { type: "object", required: ["a"] } },
    { type: "similarity", passThreshold: 0.6 },
  ]);
  const scores = (answer: string, expected: string) => graders.map((g) => grade(g, answer, expected).score);
  assert.deepEqual(scores("4 July 2023", "4 July 2023"), [1, 1, 1, 1, 0, 1]);
  assert.deepEqual(scores(" 4 july 2023. ", "4 July 2023"), [0, 1, 1, 0, 0, 1]);
  assert.deepEqual(scores('{"a": 1}', "x"), [0, 0, 0, 0, 1, 0]);
  assert.equal(grade(graders[5]!, "July 2023", "4 July 2023").passed, true);
  assert.equal(grade(graders[5]!, "July", "4 July 2023").passed, false);
});

function evalRun(results: [number, number][], status: EvalRun["status"] = "COMPLETED"): EvalRun {
  return {
    id: "evalrun_1",
    evalId: "eval_1",
    userId: "u",
    name: "before/after",
    status,
    models: ["base", "ft_1"],
    items: Array.from({ length: 20 }, () => ({ messages: [], expected: "" })),
    config: { graders: [], systemPrompt: "", maxTokens: 16, parallel: 8 },
    progress: { completed: 40, total: 40, model: null },
    results: results.map(([exact, similarity], i) =>
      beforeAfterTotals(i === 0 ? "base" : "ft_1", exact, similarity),
    ),
    error: null,
    createdAt: "",
    updatedAt: "",
  };
}

test("a run's before/after says whether the fine-tune improved, and says so when it got worse", () => {
  const better = describeEvaluation(
    evalRun([
      [0, 0.05],
      [20, 0.98],
    ]),
  );
  assert.equal(better.improved, true);
  assert.equal(better.summary, "base 0/20 → fine-tune 20/20 exact match (similarity 0.05 → 0.98): improved");
  assert.deepEqual(better.base, { model: "base", items: 20, exact: 0, similarity: 0.05 });
  const worse = describeEvaluation(
    evalRun([
      [12, 0.7],
      [3, 0.4],
    ]),
  );
  assert.equal(worse.improved, false);
  assert.equal(
    worse.summary,
    "base 12/20 → fine-tune 3/20 exact match (similarity 0.70 → 0.40): worse than the base model",
  );
  const closer = describeEvaluation(
    evalRun([
      [0, 0.2],
      [0, 0.5],
    ]),
  );
  assert.equal(closer.improved, true);
  const same = describeEvaluation(
    evalRun([
      [5, 0.5],
      [5, 0.5],
    ]),
  );
  assert.equal(same.improved, false);
  assert.match(same.summary, /: no better than the base model$/);
  const running = describeEvaluation({
    ...evalRun([[0, 0]]),
    status: "RUNNING",
    progress: { completed: 7, total: 40, model: "base" },
  });
  assert.equal(running.improved, null);
  assert.equal(running.fineTuned, null);
  assert.equal(running.summary, "20 held-out pairs: 7/40 answers");
});

test("a before/after with a judge: its scores in the line, and a tie on exact matches goes to the judge", () => {
  const judged = (exact: [number, number], similarity: [number, number], judge: [number, number]) => {
    const run = evalRun([
      [exact[0], similarity[0]],
      [exact[1], similarity[1]],
    ]);
    for (const [i, totals] of run.results.entries())
      totals.graders.push({
        name: "judge",
        type: "score_model",
        passed: 0,
        failed: 20,
        meanScore: judge[i]!,
      });
    return describeEvaluation(run);
  };
  const better = judged([0, 0], [0.6, 0.5], [0.1, 0.8]);
  assert.equal(better.improved, true);
  assert.equal(
    better.summary,
    "base 0/20 → fine-tune 0/20 exact match (similarity 0.60 → 0.50, judge 0.10 → 0.80): improved",
  );
  assert.deepEqual(better.fineTuned, { model: "ft_1", items: 20, exact: 0, similarity: 0.5, judge: 0.8 });
  assert.equal(judged([0, 0], [0.2, 0.9], [0.8, 0.1]).improved, false);
  // Exact matches still come first, and equal judges fall back to similarity.
  assert.equal(judged([2, 5], [0.5, 0.5], [0.9, 0.1]).improved, true);
  assert.equal(judged([3, 3], [0.2, 0.4], [0.5, 0.5]).improved, true);
});

test("OpenAI's per_model_usage: each model's answers and its verdicts as a judge, one entry per model", () => {
  const base = beforeAfterTotals("base", 0, 0);
  Object.assign(base, {
    promptTokens: 100,
    completionTokens: 10,
    judgeUsage: [{ model: "judge", promptTokens: 300, completionTokens: 20, invocations: 20 }],
  });
  const tuned = beforeAfterTotals("ft_1", 0, 0);
  Object.assign(tuned, {
    promptTokens: 50,
    completionTokens: 5,
    judgeUsage: [
      { model: "judge", promptTokens: 200, completionTokens: 20, invocations: 20 },
      { model: "base", promptTokens: 40, completionTokens: 4, invocations: 2 },
    ],
  });
  const usage = (model: string) => perModelUsage([base, tuned]).find((u) => u.model_name === model);
  assert.deepEqual(
    perModelUsage([base, tuned]).map((u) => u.model_name),
    ["base", "ft_1", "judge"],
  );
  assert.deepEqual(usage("judge"), {
    model_name: "judge",
    invocation_count: 40,
    prompt_tokens: 500,
    completion_tokens: 40,
    total_tokens: 540,
    cached_tokens: 0,
  });
  assert.equal(usage("base")?.invocation_count, 22);
  assert.equal(usage("base")?.prompt_tokens, 140);
  assert.equal(usage("ft_1")?.total_tokens, 55);
});

test("OpenAI testing criteria become graders; what Conduit cannot honour is refused by field", () => {
  const { graders, expectedField } = settledCriteria([
    {
      type: "string_check",
      name: "exact",
      input: "{{sample.output_text}}",
      reference: "{{ item.answer }}",
      operation: "eq",
    },
    {
      type: "string_check",
      name: "has",
      input: "{{sample.output_text}}",
      reference: "July",
      operation: "ilike",
    },
    {
      type: "text_similarity",
      name: "close",
      input: "{{sample.output_text}}",
      reference: "{{item.answer}}",
      evaluation_metric: "fuzzy_match",
      pass_threshold: 0.8,
    },
  ]);
  assert.equal(expectedField, "answer");
  assert.deepEqual(graders, [
    { type: "exact_match", name: "exact", normalize: [] },
    { type: "contains", name: "has", value: "July", normalize: ["case"] },
    { type: "similarity", name: "close", metric: "fuzzy_match", passThreshold: 0.8 },
  ]);
  const refused = (criteria: Record<string, unknown>[]) => {
    try {
      settledCriteria(criteria);
    } catch (error) {
      return (error as { param: string }).param;
    }
    return "accepted";
  };
  const check = {
    type: "string_check",
    name: "x",
    input: "{{sample.output_text}}",
    reference: "{{item.a}}",
    operation: "eq",
  };
  assert.equal(refused([{ ...check, type: "python" }]), "testing_criteria[0].type");
  assert.equal(refused([{ ...check, operation: "ne" }]), "testing_criteria[0].operation");
  assert.equal(refused([{ ...check, input: "{{item.a}}" }]), "testing_criteria[0].input");
  assert.equal(
    refused([check, { ...check, name: "y", reference: "{{item.b}}" }]),
    "testing_criteria[1].reference",
  );
  assert.equal(refused([check, { ...check }]), "testing_criteria[1].name");

  const asked = runRequest({
    type: "completions",
    model: "tiny",
    source: { type: "file_content", content: [{ item: { q: "Capital of France?", answer: "Paris" } }] },
    input_messages: {
      type: "template",
      template: [
        { role: "developer", content: "Be brief." },
        { role: "user", content: "Q: {{item.q}}" },
      ],
    },
    sampling_params: { max_completion_tokens: 8 },
  });
  assert.equal(asked.maxTokens, 8);
  const [item] = resolveOpenAiItems(asked.items ?? [], asked.template, "answer");
  assert.deepEqual(item?.messages, [
    { role: "system", content: "Be brief." },
    { role: "user", content: "Q: Capital of France?" },
  ]);
  assert.equal(item?.expected, "Paris");
  assert.throws(() => runRequest({ type: "jsonl", source: {} }), { param: "data_source.type" });
  assert.throws(() => runRequest({ type: "completions", source: { type: "file_content", content: [] } }), {
    param: "data_source.model",
  });
});

test("a multi grader scores an answer by a formula of its graders' scores; a bad formula or part is a 400 naming its field", () => {
  const [multi] = settleGraders([
    {
      type: "multi",
      graders: {
        exact: { type: "exact_match" },
        close: { type: "similarity", metric: "token_f1" },
        json: { type: "json_schema", schema: { type: "object" } },
      },
      calculateOutput: "0.5 * exact + close / 2 - 0 * max(json, 1) ^ 2",
    },
  ]);
  assert.equal(multi?.type, "multi");
  assert.equal(multi?.name, "multi");
  assert.equal(multi?.type === "multi" && multi.passThreshold, 0.5);
  assert.deepEqual(grade(multi!, "the cat sat", "the cat sat"), { name: "multi", score: 1, passed: true });
  const partial = grade(multi!, "the cat", "the cat sat");
  assert.ok(Math.abs(partial.score - 0.4) < 1e-9, String(partial.score));
  assert.equal(partial.passed, false);

  const [divided] = settleGraders([
    { type: "multi", graders: { e: { type: "exact_match" } }, calculateOutput: "1 / e", passThreshold: 0 },
  ]);
  assert.deepEqual(grade(divided!, "a", "b"), { name: "multi", score: 0, passed: true });
  const [precedence] = settleGraders([
    { type: "multi", graders: { e: { type: "exact_match" } }, calculateOutput: "-2^2 + (1 + e) * 3" },
  ]);
  assert.equal(grade(precedence!, "a", "a").score, 2);

  const refused = (grader: Record<string, unknown>) => {
    try {
      settleGraders([grader as never]);
    } catch (error) {
      return (error as { param: string }).param;
    }
    return "accepted";
  };
  const parts = { e: { type: "exact_match" } };
  assert.equal(
    refused({ type: "multi", graders: parts, calculateOutput: "e +" }),
    "graders[0].calculateOutput",
  );
  assert.equal(
    refused({ type: "multi", graders: parts, calculateOutput: "f" }),
    "graders[0].calculateOutput",
  );
  assert.equal(
    refused({ type: "multi", graders: parts, calculateOutput: "pow(e)" }),
    "graders[0].calculateOutput",
  );
  assert.equal(
    refused({ type: "multi", graders: parts, calculateOutput: `${"(".repeat(40)}e${")".repeat(40)}` }),
    "graders[0].calculateOutput",
  );
  assert.equal(
    refused({ type: "multi", graders: { e: { type: "score_model" } }, calculateOutput: "e" }),
    "graders[0].graders.e.type",
  );
  assert.equal(
    refused({ type: "multi", graders: { "e-1": { type: "exact_match" } }, calculateOutput: "1" }),
    "graders[0].graders.e-1",
  );
  assert.equal(
    refused({ type: "multi", graders: { e: { type: "regex", pattern: "(?=a)" } }, calculateOutput: "e" }),
    "graders[0].graders.e.pattern",
  );
  assert.equal(refused({ type: "multi", graders: {}, calculateOutput: "1" }), "graders[0].graders");
});

test("OpenAI's multi criterion becomes a multi grader of its string checks and similarities; a bad part is named as OpenAI spells it", () => {
  const check = { type: "string_check", input: "{{sample.output_text}}", reference: "{{item.answer}}" };
  const similar = {
    type: "text_similarity",
    input: "{{sample.output_text}}",
    reference: "{{item.answer}}",
    evaluation_metric: "fuzzy_match",
    pass_threshold: 0.5,
  };
  const { graders, expectedField } = settledCriteria([
    {
      type: "multi",
      name: "blend",
      graders: { exact: { ...check, name: "ignored", operation: "eq" }, close: similar },
      calculate_output: "(exact + close) / 2",
    },
  ]);
  assert.equal(expectedField, "answer");
  assert.deepEqual(graders, [
    {
      type: "multi",
      name: "blend",
      graders: {
        exact: { type: "exact_match", name: "exact", normalize: [] },
        close: { type: "similarity", name: "close", metric: "fuzzy_match", passThreshold: 0.5 },
      },
      calculateOutput: "(exact + close) / 2",
      passThreshold: 0.5,
    },
  ]);
  assert.equal(grade(graders[0]!, "Paris", "Paris").score, 1);
  const refused = (criterion: Record<string, unknown>) => {
    try {
      settledCriteria([criterion]);
    } catch (error) {
      return (error as { param: string }).param;
    }
    return "accepted";
  };
  const multi = {
    type: "multi",
    graders: { exact: { ...check, operation: "eq" } },
    calculate_output: "exact",
  };
  assert.equal(refused(multi), "accepted");
  assert.equal(refused({ ...multi, calculate_output: "exact *" }), "testing_criteria[0].calculate_output");
  assert.equal(refused({ ...multi, calculate_output: undefined }), "testing_criteria[0].calculate_output");
  assert.equal(
    refused({ ...multi, graders: { exact: { ...check, operation: "ne" } } }),
    "testing_criteria[0].graders.exact.operation",
  );
  assert.equal(
    refused({ ...multi, graders: { judge: { type: "score_model" } } }),
    "testing_criteria[0].graders.judge.type",
  );
});
