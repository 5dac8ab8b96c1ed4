import assert from "node:assert/strict";
import { test } from "node:test";
import { judgeLimits, type ModelGrader } from "../../src/contract/evals.ts";
import { settleGraders } from "../../src/evals/graders.ts";
import { judgePrompt, judgeSchema, readVerdict } from "../../src/evals/judge.ts";
import { gradersOfCriteria, openAiGraderError } from "../../src/api/openai/evalsWire.ts";
import { ConduitError } from "../../src/errors.ts";
import { unsupportedJsonSchema } from "../../src/engine/grammars.ts";

/** The OpenAI face's criteria as the eval service settles them, its errors in OpenAI's names (as `POST /v1/evals`). */
function settledCriteria(criteria: Parameters<typeof gradersOfCriteria>[0]) {
  const { graders, expectedField } = gradersOfCriteria(criteria);
  try {
    return { graders: settleGraders(graders), expectedField };
  } catch (error) {
    throw openAiGraderError(error);
  }
}

const input = [
  { role: "system" as const, content: "You grade answers." },
  {
    role: "user" as const,
    content:
      "Q: {{item.input}}\nExpected: {{ item.expected }}\nTags: {{item.meta.tags}}\nAnswer: {{sample.output_text}}",
  },
];

const [score, label] = settleGraders([
  { type: "score_model", model: "tiny", input, range: [1, 7] },
  { type: "label_model", model: "tiny", input, labels: ["good", "bad", "good"], passingLabels: ["good"] },
]) as [ModelGrader, ModelGrader];

test("model graders settle greedy with a short answer; a score threshold defaults to the range's middle", () => {
  assert.deepEqual(score, {
    type: "score_model",
    name: "score_model",
    range: [1, 7],
    passThreshold: 4,
    model: "tiny",
    input,
    temperature: 0,
    maxTokens: judgeLimits.defaultMaxTokens,
  });
  assert.equal(label.type, "label_model");
  assert.deepEqual(label.type === "label_model" && label.labels, ["good", "bad"]);
  // A label model's answer has room for its longest label.
  assert.equal(label.maxTokens, judgeLimits.defaultMaxTokens + "good".length);
});

test("a bad model grader is a 400 naming its field", () => {
  const cases: [Record<string, unknown>, string][] = [
    [{ type: "score_model", input }, "graders[0].model"],
    [{ type: "score_model", model: "tiny", input: [] }, "graders[0].input"],
    [{ type: "score_model", model: "tiny", input, range: [3, 3] }, "graders[0].range"],
    [
      { type: "score_model", model: "tiny", input, range: [0, 1], passThreshold: 2 },
      "graders[0].passThreshold",
    ],
    [
      { type: "score_model", model: "tiny", input, maxTokens: judgeLimits.maxTokens + 1 },
      "graders[0].maxTokens",
    ],
    [
      { type: "label_model", model: "tiny", input, labels: ["a"], passingLabels: ["b"] },
      "graders[0].passingLabels[0]",
    ],
    [{ type: "label_model", model: "tiny", input, labels: ["a"] }, "graders[0].passingLabels"],
    [
      {
        type: "label_model",
        model: "tiny",
        input: [{ role: "user", content: "x".repeat(judgeLimits.maxTemplateChars + 1) }],
        labels: ["a"],
        passingLabels: ["a"],
      },
      "graders[0].input[0].content",
    ],
  ];
  for (const [grader, param] of cases)
    assert.throws(
      () => settleGraders([grader as never]),
      (e: ConduitError) => e.param === param,
      `${JSON.stringify(grader).slice(0, 120)} → ${param}`,
    );
});

test("the judge's prompt: item fields, nested ones as text or JSON, the answer; each value cut at its bound", () => {
  const prompt = judgePrompt(score, {
    item: { input: "2+2?", expected: "4", meta: { tags: ["math", 1] } },
    sample: { output_text: "four" },
  });
  assert.ok("messages" in prompt);
  assert.equal(prompt.messages[0]!.content, "You grade answers.");
  assert.equal(prompt.messages[1]!.content, 'Q: 2+2?\nExpected: 4\nTags: ["math",1]\nAnswer: four');

  const long = "y".repeat(judgeLimits.maxValueChars + 500);
  const cut = judgePrompt(score, { item: { input: long }, sample: { output_text: "" } });
  assert.ok("messages" in cut);
  assert.ok(cut.messages[1]!.content.includes("y".repeat(judgeLimits.maxValueChars)));
  assert.ok(!cut.messages[1]!.content.includes("y".repeat(judgeLimits.maxValueChars + 1)));

  // Many placeholders each at the value bound: over the prompt's bound, an error rather than a huge prompt.
  const many = { ...score, input: [{ role: "user" as const, content: "{{sample.output_text}}".repeat(6) }] };
  const over = judgePrompt(many, { item: {}, sample: { output_text: long } });
  assert.ok("error" in over && /at most 100000/.test(over.error), JSON.stringify(over).slice(0, 200));
});

test("the judge's answer is held to a schema: an integer range as an enum, labels as an enum", () => {
  assert.deepEqual(judgeSchema(score), {
    type: "object",
    properties: { score: { enum: [1, 2, 3, 4, 5, 6, 7] } },
    required: ["score"],
    additionalProperties: false,
  });
  const fractional = settleGraders([
    { type: "score_model", model: "m", input, range: [0, 0.5] },
  ])[0] as ModelGrader;
  assert.deepEqual(judgeSchema(fractional).properties, {
    score: { type: "number", minimum: 0, maximum: 0.5 },
  });
  // Every schema the judge gets is one the grammar takes.
  for (const grader of [score, label, fractional])
    assert.equal(unsupportedJsonSchema(judgeSchema(grader)), undefined);
  assert.deepEqual(judgeSchema(label).properties, { label: { enum: ["good", "bad"] } });
});

test("the verdict: a score in range passes at the threshold; a label passes when it is a passing one", () => {
  assert.deepEqual(readVerdict(score, '{"score": 5}'), {
    name: "score_model",
    score: 5,
    passed: true,
    judgeAnswer: '{"score": 5}',
  });
  assert.equal(readVerdict(score, '{"score": 3}').passed, false);
  assert.match(readVerdict(score, '{"score": 9}').error ?? "", /outside \[1, 7\]/);
  assert.match(readVerdict(score, '{"sco').error ?? "", /not complete JSON/);
  assert.deepEqual(readVerdict(label, '{"label":"good"}'), {
    name: "label_model",
    score: 1,
    passed: true,
    label: "good",
    judgeAnswer: '{"label":"good"}',
  });
  const bad = readVerdict(label, '{"label":"bad"}');
  assert.equal(bad.passed, false);
  assert.equal(bad.label, "bad");
});

test("OpenAI's score_model and label_model criteria become model graders; a bad field is named as OpenAI spells it", () => {
  const { graders, expectedField } = settledCriteria([
    {
      type: "score_model",
      name: "helpful",
      model: "tiny",
      input: [
        { role: "developer", content: "Score 1 to 7." },
        {
          role: "user",
          content: [{ type: "input_text", text: "{{item.question}} → {{sample.output_text}}" }],
        },
      ],
      range: [1, 7],
      pass_threshold: 5,
      sampling_params: { temperature: 0, max_completions_tokens: 16 },
    },
    {
      type: "label_model",
      name: "tone",
      model: "tiny",
      input: [{ role: "user", content: "{{sample.output_text}}" }],
      labels: ["polite", "rude"],
      passing_labels: ["polite"],
    },
  ]);
  assert.equal(expectedField, null);
  assert.deepEqual(graders[0], {
    type: "score_model",
    name: "helpful",
    range: [1, 7],
    passThreshold: 5,
    model: "tiny",
    input: [
      { role: "system", content: "Score 1 to 7." },
      { role: "user", content: "{{item.question}} → {{sample.output_text}}" },
    ],
    temperature: 0,
    maxTokens: 16,
  });
  assert.equal(graders[1]?.type, "label_model");

  const judge = { model: "tiny", input: [{ role: "user", content: "x" }] };
  const cases: [Record<string, unknown>, string][] = [
    [{ type: "score_model", ...judge, pass_threshold: 3 }, "testing_criteria[0].pass_threshold"],
    [
      { type: "label_model", ...judge, labels: ["a"], passing_labels: ["b"] },
      "testing_criteria[0].passing_labels[0]",
    ],
    [
      { type: "score_model", ...judge, sampling_params: { max_completions_tokens: 0 } },
      "testing_criteria[0].sampling_params.max_completions_tokens",
    ],
    [
      { type: "score_model", ...judge, sampling_params: { reasoning_effort: "low" } },
      "testing_criteria[0].sampling_params.reasoning_effort",
    ],
    [
      { type: "score_model", model: "tiny", input: [{ role: "tool", content: "x" }] },
      "testing_criteria[0].input[0].role",
    ],
    [{ type: "score_model", input: judge.input }, "testing_criteria[0].model"],
  ];
  for (const [criterion, param] of cases)
    assert.throws(
      () => settledCriteria([criterion]),
      (e: ConduitError) => {
        assert.equal(e.param, param, e.message);
        return true;
      },
    );
});
