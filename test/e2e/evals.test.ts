import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import OpenAI from "openai";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import type { Core } from "../../src/core.ts";
import type { EvalResultWire, EvalRunWire, RunEvaluation } from "../../src/contract/evals.ts";
import {
  as,
  asAlice,
  buildTestApp,
  datasetWithPairs,
  KEY_A,
  KEY_B,
  madeUpPairs,
  startRun,
  testEnv,
} from "../lib/helper.ts";

const pairs = madeUpPairs();

const TERMINAL = ["COMPLETED", "FAILED", "CANCELLED"];

async function until<T>(
  read: () => Promise<T>,
  done: (value: T) => boolean,
  what: string,
  ms = 360_000,
): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await read();
    if (done(value)) return value;
    if (Date.now() > deadline)
      throw new Error(`timed out waiting for ${what}: ${JSON.stringify(value).slice(0, 2000)}`);
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}

function evalRun(app: FastifyInstance, evalId: string, runId: string, key = KEY_A) {
  return until(
    async () => (await as(app, key).get(`/conduit/evals/${evalId}/runs/${runId}`)).json<EvalRunWire>(),
    (run) => TERMINAL.includes(run.status),
    `eval run ${runId}`,
  );
}

function graderTotals(run: EvalRunWire, model: string) {
  const totals = run.results.find((r) => r.model === model);
  assert.ok(totals, `totals of ${model} in ${JSON.stringify(run.results)}`);
  return Object.fromEntries(totals.graders.map((g) => [g.name, g]));
}

describe("evals: a run trained on pairs scores higher than its base on them", () => {
  let app: FastifyInstance;
  let core: Core;
  let runId: string;
  let validationFileId: string;
  // Cleanups registered while `before` runs, run once the suite is done (last first).
  const cleanups: (() => unknown)[] = [];
  const cleanup = { after: (fn: () => unknown) => void cleanups.unshift(fn) };
  after(async () => {
    for (const fn of cleanups) await fn();
  });

  before(async () => {
    const env = await testEnv(cleanup);
    // The tiny model 128 wide memorises 20 pairs in about 30 s (training.test.ts).
    await createTinyModel(path.join(env.dataDir, "models", "tiny128.gguf"), {
      seed: 1,
      embeddingLength: 128,
    });
    ({ app, core } = await buildTestApp(cleanup, env, { scheduler: { pollMs: 200, concurrency: 1 } }));
    core.scheduler.start();
    core.evals.start(core.runEvents);
    const training = await datasetWithPairs(app, pairs, { name: "train" });
    // The same pairs as the run's validation file: its eval split, which the automatic before/after scores.
    validationFileId = (await datasetWithPairs(app, pairs, { name: "held", file: "held.jsonl" })).fileId;
    runId = await startRun(app, {
      datasetID: training.id,
      validationFileID: validationFileId,
      baseModelName: "tiny128",
      method: "full",
      lr: 0.003,
      epochs: 200,
    });
  });

  test("the automatic before/after: base 0/20 → fine-tune most of 20, on the run and in its log", async () => {
    const run = await until(
      async () =>
        (await as(app, KEY_A).get(`/conduit/finetuning/${runId}`)).json<{
          status: string;
          logs: string[];
          evaluation?: RunEvaluation | null;
        }>(),
      (r) => ["FAILED", "CANCELLED"].includes(r.status) || TERMINAL.includes(r.evaluation?.status ?? ""),
      "the run's evaluation",
      600_000,
    );
    assert.equal(run.status, "READY", run.logs.join("\n"));
    const evaluation = run.evaluation;
    assert.ok(evaluation);
    assert.equal(evaluation.status, "COMPLETED", evaluation.summary);
    assert.equal(evaluation.base?.model, "tiny128");
    assert.equal(evaluation.fineTuned?.model, runId);
    assert.equal(evaluation.base?.items, 20);
    assert.equal(evaluation.base?.exact, 0);
    assert.ok((evaluation.fineTuned?.exact ?? 0) >= 15, evaluation.summary);
    assert.ok(
      (evaluation.fineTuned?.similarity ?? 0) > (evaluation.base?.similarity ?? 1),
      evaluation.summary,
    );
    assert.equal(evaluation.improved, true);
    assert.match(
      evaluation.summary,
      /^base 0\/20 → fine-tune \d+\/20 exact match \(similarity .*\): improved$/,
    );
    // The run's status line: its log says it once the eval has ended.
    const logged = await until(
      async () => (await as(app, KEY_A).get(`/conduit/finetuning/${runId}`)).json<{ logs: string[] }>().logs,
      (logs) => logs.some((line) => line.includes("evaluation: base 0/20 → fine-tune")),
      "the evaluation's log line",
    );
    assert.ok(logged.some((line) => line.includes("evaluation queued")));
    // The run list carries the same before/after; Bob's list has none of it.
    const listed = (await as(app, KEY_A).get("/conduit/finetuning")).json<
      { id: string; evaluation: RunEvaluation | null }[]
    >();
    assert.deepEqual(listed.find((r) => r.id === runId)?.evaluation, evaluation);
    const bobs = (await as(app, KEY_B).get("/conduit/finetuning")).json<{ evaluation: unknown }[]>();
    assert.ok(bobs.every((r) => r.evaluation === null));
    // The eval is an ordinary eval of Alice's, not Bob's.
    assert.equal((await as(app, KEY_A).get(`/conduit/evals/${evaluation.evalId}`)).statusCode, 200);
    assert.equal((await as(app, KEY_B).get(`/conduit/evals/${evaluation.evalId}`)).statusCode, 404);
  });

  test("through the Conduit API: every grader scores the fine-tune higher, with per-item results", async () => {
    const alice = as(app, KEY_A);
    const created = await alice.post("/conduit/evals", {
      name: "pairs",
      source: { type: "file", fileId: validationFileId },
      graders: [
        { type: "exact_match" },
        { type: "exact_match", name: "exact_loose", normalize: ["case", "whitespace", "punctuation"] },
        { type: "contains" },
        { type: "regex", pattern: "^[a-z]+ \\d+$" },
        { type: "similarity" },
        { type: "similarity", name: "fuzzy", metric: "fuzzy_match" },
      ],
    });
    assert.equal(created.statusCode, 200, created.body);
    const evalId = created.json<{ id: string }>().id;
    const started = await alice.post(`/conduit/evals/${evalId}/runs`, {
      models: ["tiny128", runId],
      maxTokens: 24,
      parallel: 8,
    });
    assert.equal(started.statusCode, 200, started.body);
    assert.equal(started.json<EvalRunWire>().status, "QUEUED");
    const run = await evalRun(app, evalId, started.json<EvalRunWire>().id);
    assert.equal(run.status, "COMPLETED", run.error ?? "");
    assert.deepEqual(run.progress, { completed: 40, total: 40, model: null });
    const base = graderTotals(run, "tiny128");
    const tuned = graderTotals(run, runId);
    for (const name of ["exact_match", "exact_loose", "contains", "regex", "similarity", "fuzzy"]) {
      assert.ok(
        (tuned[name]?.meanScore ?? 0) > (base[name]?.meanScore ?? 1),
        `${name}: fine-tune ${tuned[name]?.meanScore} vs base ${base[name]?.meanScore}`,
      );
    }
    assert.equal(base.exact_match?.passed, 0);

    const results = await alice.get(`/conduit/evals/${evalId}/runs/${run.id}/results?model=${runId}`);
    assert.equal(results.statusCode, 200, results.body);
    assert.equal(results.headers["x-total-count"], "20");
    const items = results.json<EvalResultWire[]>();
    assert.equal(items.length, 20);
    const first = items[0];
    assert.ok(first);
    assert.equal(first.input, pairs[0]?.input);
    assert.equal(first.expected, pairs[0]?.output);
    assert.equal(first.scores.length, 6);
    assert.ok(first.completionTokens > 0 && first.promptTokens > 0 && first.latencySeconds > 0);
    const right = items.filter((item) => item.answer.trim() === item.expected);
    assert.equal(right.length, tuned.exact_match?.passed);
    for (const item of right) assert.equal(item.scores[0]?.score, 1);
  });

  test("through the official openai client: evals, runs and output items", async () => {
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_A, maxRetries: 0 });
    const created = await client.evals.create({
      name: "pairs",
      data_source_config: {
        type: "custom",
        item_schema: {
          type: "object",
          properties: { question: { type: "string" }, answer: { type: "string" } },
        },
        include_sample_schema: true,
      },
      testing_criteria: [
        {
          type: "string_check",
          name: "exact",
          input: "{{sample.output_text}}",
          reference: "{{item.answer}}",
          operation: "eq",
        },
        {
          type: "text_similarity",
          name: "close",
          input: "{{sample.output_text}}",
          reference: "{{item.answer}}",
          evaluation_metric: "fuzzy_match",
          pass_threshold: 0.8,
        },
      ],
    });
    assert.equal(created.object, "eval");
    assert.equal((await client.evals.retrieve(created.id)).name, "pairs");
    assert.ok((await client.evals.list()).data.some((e) => e.id === created.id));

    const content = pairs.map((pair) => ({ item: { question: pair.input, answer: pair.output } }));
    const runOf = async (model: string) => {
      const run = await client.evals.runs.create(created.id, {
        name: model,
        data_source: {
          type: "completions",
          model,
          source: { type: "file_content", content },
          input_messages: { type: "template", template: [{ role: "user", content: "{{item.question}}" }] },
          sampling_params: { max_completion_tokens: 24 },
        },
      });
      assert.equal(run.status, "queued");
      return until(
        () => client.evals.runs.retrieve(run.id, { eval_id: created.id }),
        (r) => ["completed", "failed", "canceled"].includes(r.status),
        `openai eval run on ${model}`,
      );
    };
    const base = await runOf("tiny128");
    const tuned = await runOf(runId);
    assert.equal(tuned.status, "completed");
    assert.equal(tuned.result_counts.total, 20);
    const passedOf = (run: typeof base, name: string) =>
      run.per_testing_criteria_results.find((r) => r.testing_criteria === name)?.passed ?? -1;
    for (const name of ["exact", "close"])
      assert.ok(
        passedOf(tuned, name) > passedOf(base, name),
        `${name}: ${passedOf(tuned, name)} vs ${passedOf(base, name)}`,
      );
    assert.equal(tuned.per_model_usage[0]?.model_name, runId);
    assert.ok((tuned.per_model_usage[0]?.completion_tokens ?? 0) > 0);

    // Output items, paged with the client's cursor.
    const seen = [];
    for await (const item of client.evals.runs.outputItems.list(tuned.id, { eval_id: created.id, limit: 7 }))
      seen.push(item);
    assert.equal(seen.length, 20);
    assert.equal(new Set(seen.map((item) => item.id)).size, 20);
    const one = await client.evals.runs.outputItems.retrieve(seen[3]!.id, {
      eval_id: created.id,
      run_id: tuned.id,
    });
    assert.deepEqual(one.datasource_item, content[3]?.item);
    assert.equal(one.results.length, 2);
    assert.equal(one.sample.output[0]?.content?.trim() === pairs[3]?.output, one.results[0]?.passed);
    const passedItems = (
      await client.evals.runs.outputItems.list(tuned.id, { eval_id: created.id, status: "pass" })
    ).data;
    assert.equal(passedItems.length, tuned.result_counts.passed);

    // Bob sees none of it.
    const bob = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_B, maxRetries: 0 });
    await assert.rejects(
      bob.evals.retrieve(created.id),
      (error: unknown) => (error as { status?: number }).status === 404,
    );
    await assert.rejects(
      bob.evals.runs.retrieve(tuned.id, { eval_id: created.id }),
      (error: unknown) => (error as { status?: number }).status === 404,
    );
    assert.equal((await client.evals.delete(created.id)).deleted, true);
    await assert.rejects(
      client.evals.retrieve(created.id),
      (error: unknown) => (error as { status?: number }).status === 404,
    );
  });

  test("a fine-tune judges: a label_model grader whose model is the run", async () => {
    const alice = as(app, KEY_A);
    for (const judge of [runId]) {
      const created = await alice.post("/conduit/evals", {
        source: {
          type: "items",
          items: pairs.slice(0, 3).map((p) => ({ input: p.input, expected: p.output })),
        },
        graders: [
          {
            type: "label_model",
            model: judge,
            input: [{ role: "user", content: "{{item.input}} → {{sample.output_text}}" }],
            labels: ["right", "wrong"],
            passingLabels: ["right"],
          },
        ],
      });
      assert.equal(created.statusCode, 200, created.body);
      const evalId = created.json<{ id: string }>().id;
      const started = await alice.post(`/conduit/evals/${evalId}/runs`, {
        models: ["tiny128"],
        maxTokens: 8,
      });
      assert.equal(started.statusCode, 200, started.body);
      const run = await evalRun(app, evalId, started.json<EvalRunWire>().id);
      assert.equal(run.status, "COMPLETED", run.error ?? "");
      const results = (await alice.get(`/conduit/evals/${evalId}/runs/${run.id}/results`)).json<
        EvalResultWire[]
      >();
      assert.equal(results.length, 3);
      for (const result of results) {
        const [score] = result.scores;
        assert.equal(score?.error, undefined, JSON.stringify(score));
        assert.ok(["right", "wrong"].includes(score!.label!), JSON.stringify(score));
        assert.deepEqual(JSON.parse(score!.judgeAnswer!), { label: score!.label });
      }
    }
  });

  test("an eval run is cancelled: it stops, keeps what it scored, and a second cancel is a 409", async () => {
    const alice = as(app, KEY_A);
    const many = Array.from({ length: 300 }, (_, i) => ({ input: `question ${i}`, expected: `answer ${i}` }));
    const created = await alice.post("/conduit/evals", {
      source: { type: "items", items: many },
      graders: [{ type: "exact_match" }],
    });
    assert.equal(created.statusCode, 200, created.body);
    const evalId = created.json<{ id: string }>().id;
    const started = (
      await alice.post(`/conduit/evals/${evalId}/runs`, { models: ["tiny"], maxTokens: 64 })
    ).json<EvalRunWire>();
    await until(
      async () => (await alice.get(`/conduit/evals/${evalId}/runs/${started.id}`)).json<EvalRunWire>(),
      (run) => run.progress.completed > 0,
      "the first answers",
    );
    const cancelled = await alice.post(`/conduit/evals/${evalId}/runs/${started.id}/cancel`);
    assert.equal(cancelled.statusCode, 200, cancelled.body);
    assert.equal(cancelled.json<EvalRunWire>().status, "CANCELLED");
    const again = await alice.post(`/conduit/evals/${evalId}/runs/${started.id}/cancel`);
    assert.equal(again.statusCode, 409);
    // Nothing is answered after the cancel has been seen.
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const first = (await alice.get(`/conduit/evals/${evalId}/runs/${started.id}/results?limit=10000`)).json<
      unknown[]
    >().length;
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const later = (await alice.get(`/conduit/evals/${evalId}/runs/${started.id}/results?limit=10000`)).json<
      unknown[]
    >().length;
    assert.equal(later, first);
    assert.ok(first < 300, `${first} answers stored`);
    const run = (await alice.get(`/conduit/evals/${evalId}/runs/${started.id}`)).json<EvalRunWire>();
    assert.equal(run.status, "CANCELLED");
  });

  test("an eval run's events stream progress and end with its status", async () => {
    const alice = as(app, KEY_A);
    const created = await alice.post("/conduit/evals", {
      source: {
        type: "items",
        items: pairs.slice(0, 4).map((p) => ({ input: p.input, expected: p.output })),
      },
      graders: [{ type: "exact_match" }],
    });
    const evalId = created.json<{ id: string }>().id;
    const started = (
      await alice.post(`/conduit/evals/${evalId}/runs`, { models: [runId], maxTokens: 24 })
    ).json<EvalRunWire>();
    const stream = await app.inject({
      method: "GET",
      url: `/conduit/evals/${evalId}/runs/${started.id}/events`,
      headers: asAlice,
    });
    assert.equal(stream.statusCode, 200);
    assert.match(stream.headers["content-type"] as string, /text\/event-stream/);
    const events = stream.body.split("\n\n").filter((e) => e.trim() !== "");
    assert.ok(
      events.some((e) => e.startsWith("event: progress")),
      stream.body,
    );
    const last = events.at(-1) ?? "";
    assert.match(last, /^event: status\ndata: \{"status":"COMPLETED","error":null\}$/);
    assert.match(stream.body, /"completed":4,"total":4/);
    assert.equal(
      (await as(app, KEY_B).get(`/conduit/evals/${evalId}/runs/${started.id}/events`)).statusCode,
      404,
    );
  });

  test("tenancy: another user's eval, eval run, file, run or model is a 404", async () => {
    const alice = as(app, KEY_A);
    const bob = as(app, KEY_B);
    const created = await alice.post("/conduit/evals", {
      source: { type: "items", items: [{ input: "a", expected: "b" }] },
      graders: [{ type: "exact_match" }],
    });
    const evalId = created.json<{ id: string }>().id;
    const scenarios: [string, () => Promise<{ statusCode: number; body: string }>][] = [
      ["read", () => bob.get(`/conduit/evals/${evalId}`)],
      ["delete", () => bob.delete(`/conduit/evals/${evalId}`)],
      ["start a run", () => bob.post(`/conduit/evals/${evalId}/runs`, { models: ["tiny"] })],
      ["list runs", () => bob.get(`/conduit/evals/${evalId}/runs`)],
      ["openai read", () => bob.get(`/v1/evals/${evalId}`)],
      [
        "a file of Alice's",
        () =>
          bob.post("/conduit/evals", {
            source: { type: "file", fileId: validationFileId },
            graders: [{ type: "exact_match" }],
          }),
      ],
      [
        "a run of Alice's",
        () =>
          bob.post("/conduit/evals", { source: { type: "run", runId }, graders: [{ type: "exact_match" }] }),
      ],
    ];
    for (const [what, send] of scenarios) assert.equal((await send()).statusCode, 404, what);
    assert.ok(!(await bob.get("/conduit/evals")).json<{ id: string }[]>().some((e) => e.id === evalId));
    // Alice's fine-tune, named by Bob in his own eval.
    const own = await bob.post("/conduit/evals", {
      source: { type: "items", items: [{ input: "a", expected: "b" }] },
      graders: [{ type: "exact_match" }],
    });
    const bobs = own.json<{ id: string }>().id;
    const theirs = await bob.post(`/conduit/evals/${bobs}/runs`, { models: ["tiny", runId] });
    assert.equal(theirs.statusCode, 404, theirs.body);
    assert.equal(theirs.json<{ error: { param: string } }>().error.param, "models[1]");
  });

  test("a bad grader or criterion is a 400 naming its field", async () => {
    const alice = as(app, KEY_A);
    const source = { type: "items", items: [{ input: "a", expected: "b" }] };
    const cases: [unknown[], string][] = [
      [[{ type: "regex" }], "graders[0].pattern"],
      [[{ type: "exact_match" }, { type: "regex", pattern: "(" }], "graders[1].pattern"],
      [[{ type: "exact_match", normalize: ["caps"] }], "graders[0].normalize[0]"],
      [[{ type: "similarity", passThreshold: 2 }], "graders[0].passThreshold"],
      [[{ type: "similarity", metric: "bleu" }], "graders[0].metric"],
      [[{ type: "json_schema", schema: { type: "bogus" } }], "graders[0].schema"],
      [[{ type: "exact", normalize: [] }], "graders[0].type"],
      [[{ type: "contains", reference: "x" }], "graders[0].reference"],
      [[{ type: "exact_match" }, { type: "exact_match", name: "exact_match" }], "graders[1].name"],
    ];
    for (const [graders, param] of cases) {
      const response = await alice.post("/conduit/evals", { source, graders });
      assert.equal(response.statusCode, 400, `${JSON.stringify(graders)}: ${response.body}`);
      const error = response.json<{ error: { param: string; message: string } }>().error;
      assert.equal(error.param, param, error.message);
      assert.ok(error.message.includes(param), error.message);
    }
    const openai = await alice.post("/v1/evals", {
      data_source_config: { type: "custom", item_schema: { type: "object" } },
      testing_criteria: [
        {
          type: "string_check",
          name: "a",
          input: "{{sample.output_text}}",
          reference: "{{item.x}}",
          operation: "eq",
        },
        {
          type: "text_similarity",
          name: "b",
          input: "{{sample.output_text}}",
          reference: "{{item.x}}",
          evaluation_metric: "bleu",
          pass_threshold: 1,
        },
      ],
    });
    assert.equal(openai.statusCode, 400);
    assert.equal(
      openai.json<{ error: { param: string } }>().error.param,
      "testing_criteria[1].evaluation_metric",
    );
  });

  test("a run with a judge: the before/after has the judge's scores, and OpenAI's usage counts its tokens", async () => {
    const training = await datasetWithPairs(app, pairs.slice(0, 6), { name: "judged" });
    const missing = await as(app, KEY_A).post("/conduit/finetuning", {
      datasetID: training.id,
      validationFileID: validationFileId,
      baseModelName: "tiny128",
      judgeModel: "no-such-model",
    });
    assert.equal(missing.statusCode, 400, missing.body);
    assert.equal(missing.json().error.param, "judgeModel");
    assert.match(missing.json().error.message, /judge model "no-such-model" not found/);
    const judged = await startRun(app, {
      datasetID: training.id,
      validationFileID: validationFileId,
      baseModelName: "tiny128",
      epochs: 2,
      judgeModel: "tiny128",
    });
    const run = await until(
      async () =>
        (await as(app, KEY_A).get(`/conduit/finetuning/${judged}`)).json<{
          status: string;
          logs: string[];
          config: { judgeModel?: string };
          evaluation?: RunEvaluation | null;
        }>(),
      (r) => ["FAILED", "CANCELLED"].includes(r.status) || TERMINAL.includes(r.evaluation?.status ?? ""),
      "the judged run's evaluation",
      600_000,
    );
    assert.equal(run.status, "READY", run.logs.join("\n"));
    assert.equal(run.config.judgeModel, "tiny128");
    const evaluation = run.evaluation!;
    assert.equal(evaluation.status, "COMPLETED", evaluation.summary);
    for (const side of [evaluation.base, evaluation.fineTuned]) {
      assert.ok(side?.judge !== undefined && side.judge >= 0 && side.judge <= 1, JSON.stringify(side));
    }
    assert.match(evaluation.summary, /\(similarity \S+ → \S+, judge \d\.\d\d → \d\.\d\d\): /);
    assert.ok(
      run.logs.some((line) => /evaluation queued: .* judged by tiny128/.test(line)),
      run.logs.join("\n"),
    );
    // Each answer has the judge's verdict, with its tokens.
    const results = (
      await as(app, KEY_A).get(
        `/conduit/evals/${evaluation.evalId}/runs/${evaluation.evalRunId}/results?limit=100`,
      )
    ).json<EvalResultWire[]>();
    assert.equal(results.length, 40);
    const verdicts = results.map((r) => r.scores.find((s) => s.name === "judge"));
    assert.ok(verdicts.every((v) => v?.usage?.model === "tiny128" && v.usage.promptTokens > 0));
    // OpenAI's face: the judge's tokens count in per_model_usage, with tiny128's own answers (it is both).
    // The suite's server may already listen (the openai client's test above).
    const address = app.server.listening
      ? `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`
      : await app.listen({ port: 0, host: "127.0.0.1" });
    const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_A, maxRetries: 0 });
    const openAiRun = await client.evals.runs.retrieve(evaluation.evalRunId, { eval_id: evaluation.evalId });
    const usage = Object.fromEntries(openAiRun.per_model_usage.map((u) => [u.model_name, u]));
    assert.equal(usage[judged]?.invocation_count, 20);
    assert.equal(usage.tiny128?.invocation_count, 20 + 40);
    const answerTokens = results
      .filter((r) => r.model === "tiny128")
      .reduce((sum, r) => sum + r.promptTokens, 0);
    const judgeTokens = verdicts.reduce((sum, v) => sum + (v?.usage?.promptTokens ?? 0), 0);
    assert.equal(usage.tiny128?.prompt_tokens, answerTokens + judgeTokens);
  });
});
