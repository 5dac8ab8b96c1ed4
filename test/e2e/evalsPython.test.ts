import assert from "node:assert/strict";
import { test } from "node:test";
import { buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";
import { openAiPython, runPython, skipWithoutOpenAiPython } from "../lib/openAiPython.ts";

/** An eval with a score_model grader made, run and read by the official Python client, as OpenAI's guides write it. */

const python = openAiPython();

const script = `
import json, sys, time
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)

created = client.evals.create(
    name="graded by a model",
    data_source_config={
        "type": "custom",
        "item_schema": {"type": "object", "properties": {"question": {"type": "string"}}},
        "include_sample_schema": True,
    },
    testing_criteria=[{
        "type": "score_model",
        "name": "helpful",
        "model": "tiny",
        "input": [
            {"role": "system", "content": "Rate how helpful the answer is, from 1 to 7."},
            {"role": "user", "content": "Question: {{item.question}}\\nAnswer: {{sample.output_text}}"},
        ],
        "range": [1, 7],
        "pass_threshold": 4,
    }],
)
run = client.evals.runs.create(
    created.id,
    data_source={
        "type": "completions",
        "model": "tiny",
        "source": {"type": "file_content", "content": [{"item": {"question": "Why is the sky blue?"}},
                                                       {"item": {"question": "What is 2+2?"}}]},
        "input_messages": {"type": "template", "template": [{"role": "user", "content": "{{item.question}}"}]},
        "sampling_params": {"max_completion_tokens": 6},
    },
)
for _ in range(1200):
    run = client.evals.runs.retrieve(run.id, eval_id=created.id)
    if run.status in ("completed", "failed", "canceled"):
        break
    time.sleep(0.1)
items = list(client.evals.runs.output_items.list(run.id, eval_id=created.id))
print(json.dumps({
    "status": run.status,
    "total": run.result_counts.total,
    "criteria": [r.testing_criteria for r in run.per_testing_criteria_results],
    "usage": [[u.model_name, u.invocation_count] for u in run.per_model_usage],
    "items": [{"status": i.status, "results": [dict(r) for r in i.results]} for i in items],
}))
`;

test(
  "the official Python client: an eval with a score_model grader, run and its output items read",
  { skip: skipWithoutOpenAiPython(python) },
  async (t) => {
    const { app, core } = await buildTestApp(t, await testEnv(t));
    core.evals.start(core.runEvents);
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const result = await runPython(python!, script, [address, KEY_A]);
    assert.equal(result.status, 0, result.stderr);
    const out = JSON.parse(result.stdout) as {
      status: string;
      total: number;
      criteria: string[];
      usage: [string, number][];
      items: {
        status: string;
        results: { type: string; score: number; passed: boolean; sample: { model: string } }[];
      }[];
    };
    assert.equal(out.status, "completed");
    assert.equal(out.total, 2);
    assert.deepEqual(out.criteria, ["helpful"]);
    // tiny answered twice and judged each answer once.
    assert.deepEqual(out.usage, [["tiny", 4]]);
    assert.equal(out.items.length, 2);
    for (const item of out.items) {
      assert.notEqual(item.status, "error", JSON.stringify(item.results));
      const [helpful] = item.results;
      assert.equal(helpful!.type, "score_model");
      assert.equal(helpful!.sample.model, "tiny");
      assert.ok(helpful!.score >= 1 && helpful!.score <= 7, String(helpful!.score));
      assert.equal(helpful!.passed, helpful!.score >= 4);
    }
  },
);
