import assert from "node:assert/strict";
import { before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import OpenAI from "openai";
import type { EvalResultWire, EvalRunWire, GraderScore } from "../../src/contract/evals.ts";
import type { Core } from "../../src/core.ts";
import { as, build, KEY_A, KEY_B, suiteCleanup } from "../lib/helper.ts";
import { until } from "../lib/wait.ts";

/** score_model and label_model graders: the tiny model as judge, its answers held to the graders' JSON by a grammar. */

const judgeInput = [
  { role: "system", content: "Grade the answer." },
  {
    role: "user",
    content: "Question: {{item.input}}\nExpected: {{item.expected}}\nAnswer: {{sample.output_text}}",
  },
];

describe("model graders on the tiny model", () => {
  let app: FastifyInstance;
  let core: Core;
  const suite = suiteCleanup();
  before(async () => {
    ({ app, core } = await build(suite));
    core.evals.start(core.runEvents);
  });

  const runToEnd = async (evalId: string, key = KEY_A) => {
    const started = await as(app, key).post(`/conduit/evals/${evalId}/runs`, {
      models: ["tiny"],
      maxTokens: 6,
    });
    assert.equal(started.statusCode, 200, started.body);
    const runId = started.json<EvalRunWire>().id;
    const run = await until(
      "eval run",
      async () => (await as(app, key).get(`/conduit/evals/${evalId}/runs/${runId}`)).json<EvalRunWire>(),
      (r) => !["QUEUED", "RUNNING"].includes(r.status),
      { timeoutMs: 120_000, intervalMs: 100 },
    );
    assert.equal(run.status, "COMPLETED", run.error ?? "");
    const results = (await as(app, key).get(`/conduit/evals/${evalId}/runs/${runId}/results`)).json<
      EvalResultWire[]
    >();
    return { run, results };
  };

  test("each answer gets the judge's score or label, kept with its raw answer; greedy, so a second run agrees", async () => {
    const items = Array.from({ length: 6 }, (_, i) => ({ input: `question ${i}`, expected: `answer ${i}` }));
    const created = await as(app, KEY_A).post("/conduit/evals", {
      name: "judged",
      source: { type: "items", items },
      graders: [
        {
          type: "score_model",
          name: "quality",
          model: "tiny",
          input: judgeInput,
          range: [1, 5],
          passThreshold: 3,
        },
        {
          type: "label_model",
          name: "tone",
          model: "tiny",
          input: judgeInput,
          labels: ["polite", "rude", "neutral"],
          passingLabels: ["polite", "neutral"],
        },
        { type: "score_model", name: "fraction", model: "tiny", input: judgeInput, range: [-0.5, 2.5] },
      ],
    });
    assert.equal(created.statusCode, 200, created.body);
    const evalId = created.json<{ id: string }>().id;
    const first = await runToEnd(evalId);
    assert.equal(first.results.length, 6);
    for (const result of first.results) {
      const [quality, tone, fraction] = result.scores as [GraderScore, GraderScore, GraderScore];
      // Any number between the bounds, held there by the grammar.
      assert.equal(fraction.error, undefined, JSON.stringify(fraction));
      assert.ok(fraction.score >= -0.5 && fraction.score <= 2.5, JSON.stringify(fraction));
      assert.equal(fraction.passed, fraction.score >= 1);
      // The grammar makes every answer parse and stay in range: no grader errors.
      assert.equal(quality.error, undefined, JSON.stringify(quality));
      assert.deepEqual(JSON.parse(quality.judgeAnswer!), { score: quality.score });
      assert.ok(Number.isInteger(quality.score) && quality.score >= 1 && quality.score <= 5);
      assert.equal(quality.passed, quality.score >= 3);
      assert.equal(tone.error, undefined, JSON.stringify(tone));
      assert.deepEqual(JSON.parse(tone.judgeAnswer!), { label: tone.label });
      assert.ok(["polite", "rude", "neutral"].includes(tone.label!));
      assert.equal(tone.passed, tone.label !== "rude");
      assert.equal(tone.score, tone.passed ? 1 : 0);
    }
    const totals = first.run.results[0]!;
    const quality = totals.graders.find((g) => g.name === "quality")!;
    assert.equal(quality.type, "score_model");
    assert.equal(quality.passed, first.results.filter((r) => r.scores[0]!.passed).length);
    const mean = first.results.reduce((n, r) => n + r.scores[0]!.score, 0) / 6;
    assert.ok(Math.abs(quality.meanScore - mean) < 1e-9);

    const second = await runToEnd(evalId);
    assert.deepEqual(
      second.results.map((r) => r.scores.map((s) => s.judgeAnswer)),
      first.results.map((r) => r.scores.map((s) => s.judgeAnswer)),
      "a greedy judge gives the same answers",
    );
  });

  test("a judge model that does not exist, or is another user's, is a 400 at creation naming the field", async () => {
    const body = (model: string) => ({
      source: { type: "items", items: [{ input: "q", expected: "a" }] },
      graders: [{ type: "exact_match" }, { type: "score_model", model, input: judgeInput }],
    });
    const missing = await as(app, KEY_A).post("/conduit/evals", body("no-such-model"));
    assert.equal(missing.statusCode, 400, missing.body);
    assert.equal(missing.json().error.param, "graders[1].model");
    assert.match(missing.json().error.message, /judge model "no-such-model" not found/);
    const others = await as(app, KEY_B).post("/conduit/evals", body("ft:tiny::ft_nope"));
    assert.equal(others.statusCode, 400, others.body);
    assert.equal(others.json().error.param, "graders[1].model");
  });

  test("the official openai client: an eval with a score_model grader, its output items with the judge's answer", async () => {
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_A, maxRetries: 0 });
    const created = await client.evals.create({
      name: "graded by a model",
      data_source_config: {
        type: "custom",
        item_schema: { type: "object", properties: { question: { type: "string" } } },
        include_sample_schema: true,
      },
      testing_criteria: [
        {
          type: "score_model",
          name: "helpful",
          model: "tiny",
          input: [
            { role: "system", content: "Rate how helpful the answer is, from 1 to 7." },
            { role: "user", content: "Question: {{item.question}}\nAnswer: {{sample.output_text}}" },
          ],
          range: [1, 7],
          pass_threshold: 4,
        },
        {
          type: "label_model",
          name: "on_topic",
          model: "tiny",
          input: [{ role: "user", content: "{{item.question}} / {{sample.output_text}}" }],
          labels: ["yes", "no"],
          passing_labels: ["yes"],
        },
      ],
    });
    const run = await client.evals.runs.create(created.id, {
      data_source: {
        type: "completions",
        model: "tiny",
        source: {
          type: "file_content",
          content: [{ item: { question: "Why is the sky blue?" } }, { item: { question: "What is 2+2?" } }],
        },
        input_messages: { type: "template", template: [{ role: "user", content: "{{item.question}}" }] },
        sampling_params: { max_completion_tokens: 6 },
      },
    });
    const done = await until(
      "openai eval run",
      () => client.evals.runs.retrieve(run.id, { eval_id: created.id }),
      (r) => ["completed", "failed", "canceled"].includes(r.status),
      { timeoutMs: 120_000, intervalMs: 100 },
    );
    assert.equal(done.status, "completed");
    assert.equal(done.result_counts.total, 2);
    assert.deepEqual(
      done.per_testing_criteria_results.map((r) => r.testing_criteria),
      ["helpful", "on_topic"],
    );
    // tiny answered twice and judged each answer twice: one entry, both counted.
    assert.deepEqual(
      done.per_model_usage.map((u) => [u.model_name, u.invocation_count]),
      [["tiny", 2 + 4]],
    );
    const items = [];
    for await (const item of client.evals.runs.outputItems.list(run.id, { eval_id: created.id }))
      items.push(item);
    assert.equal(items.length, 2);
    for (const item of items) {
      assert.notEqual(item.status, "error", JSON.stringify(item.results));
      const [helpful, onTopic] = item.results as unknown as (Record<string, unknown> & {
        score: number;
        passed: boolean;
        sample: { output: { content: string }[]; model: string; usage: { prompt_tokens: number } };
      })[];
      assert.equal(helpful!.type, "score_model");
      assert.equal(helpful!.sample.model, "tiny");
      assert.ok(helpful!.sample.usage.prompt_tokens > 0, JSON.stringify(helpful!.sample));
      assert.deepEqual(JSON.parse(helpful!.sample.output[0]!.content), { score: helpful!.score });
      assert.equal(helpful!.passed, helpful!.score >= 4);
      assert.ok(["yes", "no"].includes(onTopic!.label as string));
    }

    await assert.rejects(
      client.evals.create({
        name: "bad judge",
        data_source_config: { type: "custom", item_schema: { type: "object" } },
        testing_criteria: [
          {
            type: "score_model",
            name: "x",
            model: "gpt-4o",
            input: [{ role: "user", content: "{{sample.output_text}}" }],
          },
        ],
      }),
      (e: InstanceType<typeof OpenAI.BadRequestError>) => {
        assert.equal(e.status, 400);
        assert.equal(e.param, "testing_criteria[0].model");
        return true;
      },
    );
  });
});
