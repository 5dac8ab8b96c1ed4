/**
 * Preference tuning (`"method": "dpo"`) at a run's creation, without training: what is refused and why (the
 * llama.cpp trainer, a dataset of plain pairs, settings without `dpo`, a run to start from that is not a READY
 * supervised LoRA run), and a bad preference file at upload. Training is test/e2e/dpo.test.ts's.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { as, build, createDataset, KEY_A, KEY_B } from "../lib/helper.ts";
import { runScenarios } from "../lib/scenario.ts";

const preference = {
  input: { messages: [{ role: "user", content: "Hi" }] },
  preferred_output: [{ role: "assistant", content: "Hello!" }],
  non_preferred_output: [{ role: "assistant", content: "Go away." }],
};

test("a DPO run is refused at creation, naming the field: the llama.cpp trainer, plain pairs, stray settings", async (t) => {
  // The test server's trainer is llama.cpp (testEnv's CONDUIT_TRAINER).
  const { app, core } = await build(t);
  const alice = as(app, KEY_A);
  const preferences = await createDataset(app, "preferences");
  const up = await alice.post(`/conduit/dataset/${preferences.id}/upload`, {
    name: "p.jsonl",
    content: [preference, { input: "Hey", preferred: "Hello there.", non_preferred: "What?" }]
      .map((line) => JSON.stringify(line))
      .join("\n"),
  });
  assert.equal(up.statusCode, 200, up.body);
  assert.equal(up.json<{ ioPairsCount: number }>().ioPairsCount, 2);
  const preview = await alice.get(
    `/conduit/dataset/${preferences.id}/file/${up.json<{ id: string }>().id}/pairs`,
  );
  assert.deepEqual(
    preview
      .json<{ input: string; output: string; rejected: string }[]>()
      .map((p) => [p.input, p.output, p.rejected]),
    [
      ["Hi", "Hello!", "Go away."],
      ["Hey", "Hello there.", "What?"],
    ],
  );
  const pairs = await createDataset(app, "pairs");
  await alice.post(`/conduit/dataset/${pairs.id}/upload`, {
    name: "a.jsonl",
    ioPairs: [{ input: "a", output: "b" }],
  });
  const supervised = await alice.post("/conduit/finetuning", {
    datasetID: preferences.id,
    baseModelName: "tiny",
  });
  assert.equal(supervised.statusCode, 200, supervised.body);
  const queuedId = supervised.json<{ id: string }>().id;
  const full = await alice.post("/conduit/finetuning", {
    datasetID: pairs.id,
    baseModelName: "tiny",
    method: "full",
  });
  const fullId = full.json<{ id: string }>().id;
  const repo = core.runRepository;
  assert.equal((await repo.claimNext("w", 60_000))?.id, queuedId);
  assert.equal((await repo.claimNext("w", 60_000))?.id, fullId);
  assert.ok(await repo.finish(fullId, "w", { status: "READY", modelPath: "/m.gguf" }));

  const url = "/conduit/finetuning";
  const dpo = { datasetID: preferences.id, baseModelName: "tiny", method: "dpo" };
  await runScenarios(t, app, [
    {
      name: "the llama.cpp trainer has no DPO loss",
      method: "POST",
      url,
      body: dpo,
      status: 400,
      error: { code: "invalid_request", param: "method" },
      contains: ['the llama.cpp trainer cannot do preference tuning (\\"method\\": \\"dpo\\")'],
    },
    {
      name: "a dataset of plain pairs",
      method: "POST",
      url,
      body: { ...dpo, datasetID: pairs.id },
      status: 400,
      error: { code: "invalid_request", param: "datasetID" },
      contains: [/line 1 of its file has no non-preferred answer/],
    },
    {
      name: "beta without dpo",
      method: "POST",
      url,
      body: { datasetID: preferences.id, baseModelName: "tiny", beta: 0.5 },
      status: 400,
      error: { param: "beta" },
      contains: ['needs \\"method\\": \\"dpo\\"'],
    },
    {
      name: "fromRunID without dpo",
      method: "POST",
      url,
      body: { datasetID: preferences.id, fromRunID: fullId },
      status: 400,
      error: { param: "fromRunID" },
    },
    {
      name: "beta out of range",
      method: "POST",
      url,
      body: { ...dpo, beta: 0 },
      status: 400,
      error: { param: "beta" },
    },
    {
      name: "a run to start from that does not exist",
      method: "POST",
      url,
      body: { ...dpo, fromRunID: "ft_missing" },
      status: 404,
      error: { param: "fromRunID" },
    },
    {
      name: "another user's run to start from",
      method: "POST",
      url,
      key: KEY_B,
      body: { ...dpo, fromRunID: queuedId },
      status: 404,
      error: { param: "fromRunID" },
    },
    {
      name: "a run to start from that is not READY",
      method: "POST",
      url,
      body: { ...dpo, fromRunID: queuedId },
      status: 400,
      error: { param: "fromRunID" },
      contains: [`run ${queuedId} is RUNNING, not READY`],
    },
    {
      name: "a full run to start from",
      method: "POST",
      url,
      body: { ...dpo, fromRunID: fullId },
      status: 400,
      error: { param: "fromRunID" },
      contains: ["trained every weight"],
    },
  ]);
});

test("a preference file with a missing side or an empty answer is refused at upload, naming the line and field", async (t) => {
  const { app } = await build(t);
  const ds = await createDataset(app, "preferences");
  const url = `/conduit/dataset/${ds.id}/upload`;
  const line = (change: Record<string, unknown>) => JSON.stringify({ ...preference, ...change });
  await runScenarios(t, app, [
    {
      method: "POST",
      url,
      body: { name: "p.jsonl", content: `${line({})}\n${line({ non_preferred_output: undefined })}` },
      status: 400,
      error: { code: "invalid_file", param: "file" },
      contains: ['p.jsonl: line 2: missing \\"non_preferred_output\\"'],
    },
    {
      method: "POST",
      url,
      body: {
        name: "p.jsonl",
        content: line({ preferred_output: [{ role: "assistant", content: "" }] }),
      },
      status: 400,
      error: { code: "invalid_file", param: "file" },
      contains: ["p.jsonl: line 1: preferred_output[0].content is empty"],
    },
    {
      method: "POST",
      url,
      body: { name: "p.csv", content: "input,preferred,non_preferred\nHi,,No\n" },
      status: 400,
      error: { code: "invalid_file", param: "file" },
      contains: ['p.csv: line 2: \\"preferred\\" is empty'],
    },
  ]);
});
