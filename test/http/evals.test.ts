import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import type { EvalResultWire, EvalRunWire } from "../../src/contract/evals.ts";
import { as, backends, build, buildTestApp, KEY_A, KEY_B, testEnv } from "../lib/helper.ts";
import { runScenarios, type ApiScenario } from "../lib/scenario.ts";

/** Evals on each storage backend, with the tiny model answering (no training): the store and both API faces. */
for (const backend of backends())
  describe(`evals on ${backend}`, () => {
    test("an eval of inline items scores a model item by item; the OpenAI face lists it; Bob sees nothing", async (t) => {
      const { app, core } = await build(t, backend);
      core.evals.start(core.runEvents);
      const alice = as(app, KEY_A);
      const items = Array.from({ length: 12 }, (_, i) => ({
        input: `question ${i}`,
        expected: `answer ${i}`,
      }));
      const created = await alice.post("/conduit/evals", {
        name: "inline",
        source: { type: "items", items },
        graders: [
          { type: "exact_match" },
          { type: "regex", pattern: "." },
          { type: "json_schema", schema: { type: "object" } },
          { type: "contains", value: "zzz-never" },
          {
            type: "multi",
            graders: { any: { type: "regex", pattern: "." }, exact: { type: "exact_match" } },
            calculateOutput: "any - exact",
            passThreshold: 1,
          },
        ],
      });
      assert.equal(created.statusCode, 200, created.body);
      const evalId = created.json<{ id: string; itemCount: number }>().id;
      assert.equal(created.json<{ itemCount: number }>().itemCount, 12);
      const started = await alice.post(`/conduit/evals/${evalId}/runs`, {
        models: ["tiny"],
        maxTokens: 4,
        parallel: 4,
      });
      assert.equal(started.statusCode, 200, started.body);
      const runId = started.json<EvalRunWire>().id;
      let run: EvalRunWire;
      for (;;) {
        run = (await alice.get(`/conduit/evals/${evalId}/runs/${runId}`)).json<EvalRunWire>();
        if (!["QUEUED", "RUNNING"].includes(run.status)) break;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.equal(run.status, "COMPLETED", run.error ?? "");
      const totals = run.results[0];
      assert.ok(totals);
      assert.equal(totals.answered, 12);
      const byName = Object.fromEntries(totals.graders.map((g) => [g.name, g]));
      // The tiny model's answers are noise: never the expected text, never a JSON object, never "zzz-never".
      assert.equal(byName.exact_match?.passed, 0);
      assert.equal(byName.json_schema?.passed, 0);
      assert.equal(byName.contains?.passed, 0);
      const results = (await alice.get(`/conduit/evals/${evalId}/runs/${runId}/results`)).json<
        EvalResultWire[]
      >();
      assert.equal(results.length, 12);
      assert.deepEqual(
        results.map((r) => r.item),
        [...Array(12).keys()],
      );
      // The regex grader's count is what the answers say.
      assert.equal(byName.regex?.passed, results.filter((r) => /./.test(r.answer)).length);
      // The multi grader's formula of the same regex and the exact match (never) passes where the regex does.
      assert.equal(byName.multi?.passed, byName.regex?.passed);
      assert.equal((await alice.post(`/conduit/evals/${evalId}/runs/${runId}/cancel`)).statusCode, 409);

      const listed = await alice.get("/v1/evals");
      assert.equal(listed.statusCode, 200, listed.body);
      assert.deepEqual(
        listed.json<{ data: { id: string }[] }>().data.map((e) => e.id),
        [evalId],
      );
      const outputItems = await alice.get(`/v1/evals/${evalId}/runs/${runId}/output_items?limit=5`);
      assert.equal(outputItems.statusCode, 200, outputItems.body);
      const page = outputItems.json<{ data: { id: string; status: string }[]; has_more: boolean }>();
      assert.equal(page.data.length, 5);
      assert.equal(page.has_more, true);
      assert.ok(page.data.every((item) => item.status === "fail"));

      const bob = as(app, KEY_B);
      assert.equal((await bob.get(`/conduit/evals/${evalId}/runs/${runId}/results`)).statusCode, 404);
      assert.equal((await bob.get(`/v1/evals/${evalId}/runs/${runId}/output_items`)).statusCode, 404);
      assert.equal((await bob.delete(`/conduit/evals/${evalId}/runs/${runId}`)).statusCode, 404);
      assert.equal((await bob.get("/v1/evals")).json<{ data: unknown[] }>().data.length, 0);

      assert.equal((await alice.delete(`/conduit/evals/${evalId}`)).statusCode, 200);
      const goneRun = await alice.get(`/conduit/evals/${evalId}/runs/${runId}`);
      assert.equal(goneRun.statusCode, 404);
      assert.equal(goneRun.json().error.param, "run_id");
      for (const url of [`/conduit/evals/${evalId}`, `/v1/evals/${evalId}`]) {
        const gone = await alice.get(url);
        assert.equal(gone.statusCode, 404, url);
        assert.equal(gone.json().error.param, "eval_id", url);
      }
    });

    test("x-total-count of a run's results counts the answers there are, of the model asked for; a cancel answers the run", async (t) => {
      const env = await testEnv(t, backend);
      fs.copyFileSync(
        path.join(env.dataDir, "models", "tiny.gguf"),
        path.join(env.dataDir, "models", "tiny2.gguf"),
      );
      const { app, core } = await buildTestApp(t, env);
      const alice = as(app, KEY_A);
      const items = Array.from({ length: 3 }, (_, i) => ({ input: `q${i}`, expected: `a${i}` }));
      const created = await alice.post("/conduit/evals", {
        source: { type: "items", items },
        graders: [{ type: "exact_match" }],
      });
      const evalId = created.json<{ id: string }>().id;
      const started = await alice.post(`/conduit/evals/${evalId}/runs`, {
        models: ["tiny", "tiny2"],
        maxTokens: 2,
      });
      const runId = started.json<EvalRunWire>().id;
      const count = async (query = "") => {
        const response = await alice.get(`/conduit/evals/${evalId}/runs/${runId}/results${query}`);
        assert.equal(response.statusCode, 200, response.body);
        return [Number(response.headers["x-total-count"]), response.json<unknown[]>().length];
      };
      // Queued: nothing answered yet.
      assert.deepEqual(await count(), [0, 0]);
      // A cancel answers the run, cancelled (docs/api.md, docs/evals.md).
      const other = await alice.post(`/conduit/evals/${evalId}/runs`, { models: ["tiny"] });
      const cancelled = await alice.post(
        `/conduit/evals/${evalId}/runs/${other.json<EvalRunWire>().id}/cancel`,
      );
      assert.equal(cancelled.statusCode, 200, cancelled.body);
      assert.equal(cancelled.json<EvalRunWire>().status, "CANCELLED");
      core.evals.start(core.runEvents);
      for (;;) {
        const run = (await alice.get(`/conduit/evals/${evalId}/runs/${runId}`)).json<EvalRunWire>();
        if (!["QUEUED", "RUNNING"].includes(run.status)) break;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      assert.deepEqual(await count(), [6, 6]);
      assert.deepEqual(await count("?model=tiny2"), [3, 3]);
      assert.deepEqual(await count("?model=tiny2&limit=1&offset=1"), [3, 1]);
    });

    test("a source's 400 names the field and bound of the kind its type says, not the first kind's", async (t) => {
      const { app } = await build(t, backend);
      const alice = as(app, KEY_A);
      const item = { input: "q", expected: "a" };
      const cases: [unknown, string, RegExp][] = [
        [{ type: "items", items: [] }, "source.items", /must NOT have fewer than 1 items/],
        [
          { type: "items", items: Array.from({ length: 5001 }, () => item) },
          "source.items",
          /must NOT have more than 5000 items/,
        ],
        [
          { type: "items", items: [item, { input: "q", expected: "x".repeat(100_001) }] },
          "source.items.1.expected",
          /must NOT have more than 100000 characters/,
        ],
        [{ type: "run" }, "source.runId", /is required/],
        [{ type: "file" }, "source.fileId", /is required/],
        // A tag that names no kind: the first kind's issue, as before.
        [{ type: "nope" }, "source.fileId", /is required/],
      ];
      const created = await alice.post("/conduit/evals", { graders: [{ type: "exact_match" }] });
      const evalId = created.json<{ id: string }>().id;
      await runScenarios(
        t,
        app,
        cases.flatMap(([source, param, message]): ApiScenario[] =>
          (
            [
              ["/conduit/evals", { source, graders: [{ type: "exact_match" }] }],
              [`/conduit/evals/${evalId}/runs`, { source, models: ["tiny"] }],
            ] as const
          ).map(([url, body]) => ({
            name: `${url} ${JSON.stringify(source).slice(0, 80)} → 400 ${param}`,
            method: "POST",
            url,
            body,
            status: 400,
            error: { param, message },
          })),
        ),
      );
    });

    test("a model that is not there, a source without items and a run that is not READY are refused by name", async (t) => {
      const { app } = await build(t, backend);
      const alice = as(app, KEY_A);
      const created = await alice.post("/conduit/evals", { graders: [{ type: "similarity" }] });
      assert.equal(created.statusCode, 200, created.body);
      const evalId = created.json<{ id: string }>().id;
      const noSource = await alice.post(`/conduit/evals/${evalId}/runs`, { models: ["tiny"] });
      assert.equal(noSource.statusCode, 400);
      assert.equal(noSource.json<{ error: { param: string } }>().error.param, "source");
      const noModel = await alice.post(`/conduit/evals/${evalId}/runs`, {
        models: ["tiny", "nope"],
        source: { type: "items", items: [{ input: "a", expected: "b" }] },
      });
      assert.equal(noModel.statusCode, 404);
      assert.equal(noModel.json<{ error: { param: string } }>().error.param, "models[1]");
      const both = await alice.post(`/conduit/evals/${evalId}/runs`, {
        models: ["tiny"],
        source: {
          type: "items",
          items: [{ input: "a", messages: [{ role: "user", content: "a" }], expected: "b" }],
        },
      });
      assert.equal(both.statusCode, 400);
      assert.equal(both.json<{ error: { param: string } }>().error.param, "source.items[0]");
      // A file that is not there is blamed on the source on the Conduit face, on its id on OpenAI's.
      const noFile = await alice.post("/conduit/evals", {
        graders: [{ type: "similarity" }],
        source: { type: "file", fileId: "file-not-there" },
      });
      assert.equal(noFile.statusCode, 404, noFile.body);
      assert.equal(noFile.json<{ error: { param: string } }>().error.param, "source");
      const openAiEval = await alice.post("/v1/evals", {
        data_source_config: { type: "custom", item_schema: { type: "object" }, include_sample_schema: true },
        testing_criteria: [
          {
            type: "string_check",
            name: "same",
            input: "{{sample.output_text}}",
            reference: "{{item.expected}}",
            operation: "eq",
          },
        ],
      });
      assert.equal(openAiEval.statusCode, 200, openAiEval.body);
      const noOpenAiFile = await alice.post(`/v1/evals/${openAiEval.json<{ id: string }>().id}/runs`, {
        data_source: {
          type: "completions",
          model: "tiny",
          source: { type: "file_id", id: "file-not-there" },
          input_messages: { type: "template", template: [{ role: "user", content: "{{item.input}}" }] },
        },
      });
      assert.equal(noOpenAiFile.statusCode, 404, noOpenAiFile.body);
      assert.equal(noOpenAiFile.json<{ error: { param: string } }>().error.param, "data_source.source.id");
    });
  });
