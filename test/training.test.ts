import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { createTinyModel } from "../src/model/tinyModel.ts";
import { asAlice, buildTestApp, testEnv, type TestEnv } from "./helper.ts";

/** Twenty made-up pairs: nothing a random model could produce by chance. */
const words = [
  "apple",
  "river",
  "stone",
  "cloud",
  "maple",
  "tiger",
  "ocean",
  "lemon",
  "piano",
  "comet",
  "honey",
  "raven",
  "cedar",
  "pearl",
  "storm",
  "flute",
  "amber",
  "otter",
  "frost",
  "bloom",
];
const pairs = words.map((word, i) => ({
  input: `${word} ${words[(i * 7 + 3) % 20]}`,
  output: `${words[(i * 3 + 1) % 20]} ${i}`,
}));

async function datasetOf(app: FastifyInstance, items: { input: string; output: string }[]): Promise<string> {
  const ds = (
    await app.inject({ method: "POST", url: "/conduit/dataset", headers: asAlice, payload: { name: "memo" } })
  ).json();
  const up = await app.inject({
    method: "POST",
    url: `/conduit/dataset/${ds.id}/upload`,
    headers: asAlice,
    payload: { name: "p.jsonl", ioPairs: items },
  });
  assert.equal(up.statusCode, 200, up.body);
  return ds.id;
}

async function startRun(app: FastifyInstance, body: Record<string, unknown>): Promise<string> {
  const res = await app.inject({
    method: "POST",
    url: "/conduit/finetuning",
    headers: asAlice,
    payload: { baseModelName: "tiny", ...body },
  });
  assert.equal(res.statusCode, 200, res.body);
  return res.json().id;
}

/** A run as the tests read it (loosely typed: stats and config are free-form objects). */
interface RunView {
  status: string;
  logs: string[];
  error: string | null;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- stats is a free-form object
  stats: Record<string, any>;
}

async function waitFor(
  app: FastifyInstance,
  id: string,
  done: (run: RunView) => boolean,
  timeoutMs = 120_000,
): Promise<RunView> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const run = (await app.inject({ url: `/conduit/finetuning/${id}`, headers: asAlice })).json() as RunView;
    if (done(run)) return run;
    if (Date.now() > deadline) throw new Error(`timed out; run is ${run.status}: ${run.logs?.join("\n")}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function trainingApp(t: { after(fn: () => unknown): void }, env?: TestEnv) {
  const { app } = await buildTestApp(t, env ?? (await testEnv(t)), {
    scheduler: { pollMs: 200, concurrency: 1 },
  });
  return app;
}

function startScheduler(app: FastifyInstance) {
  (app as unknown as { conduit: { scheduler: { start(): void } } }).conduit.scheduler.start();
}

describe("fine-tuning runs on the tiny model", () => {
  test("full fine-tuning memorises 20 IO pairs: greedy inference through the API reproduces at least 18", async (t) => {
    const env = await testEnv(t);
    // The default tiny model (64 wide) memorises too slowly for a test; 128 wide does it in ~30 s.
    await createTinyModel(path.join(env.dataDir, "models", "tiny128.gguf"), {
      seed: 1,
      embeddingLength: 128,
    });
    const app = await trainingApp(t, env);
    startScheduler(app);
    const datasetID = await datasetOf(app, pairs);
    const id = await startRun(app, {
      datasetID,
      baseModelName: "tiny128",
      method: "full",
      lr: 0.003,
      epochs: 200,
    });
    const run = await waitFor(app, id, (r) => ["READY", "FAILED", "CANCELLED"].includes(r.status));
    assert.equal(run.status, "READY", run.logs.join("\n"));
    assert.ok(run.stats.step > 0 && run.stats.step === run.stats.totalSteps);
    assert.ok(Array.isArray(run.stats.lossSeries) && run.stats.lossSeries.length > 1);
    const first = run.stats.lossSeries[0].trainLoss;
    const last = run.stats.lossSeries.at(-1).trainLoss;

    assert.ok(last < first / 4, `loss fell from ${first} to ${last}`);

    let exact = 0;
    let learned = pairs[0]!;
    for (const pair of pairs) {
      const res = await app.inject({
        method: "POST",
        url: `/conduit/finetuning/${id}/inference`,
        headers: asAlice,
        // The seed's run fields are accepted alongside the chat fields.
        // The seed's default penalties (1.0) would push a greedy answer off repeated letters.
        payload: {
          prompt: pair.input,
          temperature: 0,
          presence_penalty: 0,
          frequency_penalty: 0,
          max_tokens: 24,
          datasetID,
          lr: 1,
        },
      });
      assert.equal(res.statusCode, 200, res.body);
      if (res.json().response === pair.output) {
        exact++;
        learned = pair;
      } else
        console.log(`missed: ${pair.input} -> ${JSON.stringify(res.json().response)} (want ${pair.output})`);
    }
    assert.ok(exact >= 18, `${exact}/20 reproduced exactly`);

    // The served model keeps its base's context (llama.cpp's save writes the training window),
    // so the seed's default max_tokens of 256 works.
    const defaults = await app.inject({
      method: "POST",
      url: `/conduit/finetuning/${id}/inference`,
      headers: asAlice,
      payload: { prompt: learned.input },
    });
    assert.equal(defaults.statusCode, 200, defaults.body);

    // The run id is a model everywhere else too.
    const chat = await app.inject({
      method: "POST",
      url: "/conduit/v1/chat",
      headers: asAlice,
      payload: {
        model: id,
        prompt: learned.input,
        temperature: 0,
        presence_penalty: 0,
        frequency_penalty: 0,
        max_tokens: 24,
      },
    });
    assert.equal(chat.json().choices[0].text, learned.output);
    const models = (await app.inject({ url: "/v1/models", headers: asAlice })).json();
    assert.ok(models.data.some((m: { id: string }) => m.id === id));

    // Deleting a READY run removes its model.
    const modelDir = path.join(env.dataDir, "blobs", "runs", id);
    assert.ok(fs.existsSync(path.join(modelDir, "model.gguf")));
    assert.equal(
      (await app.inject({ method: "DELETE", url: `/conduit/finetuning/${id}`, headers: asAlice })).statusCode,
      200,
    );
    assert.equal(fs.existsSync(modelDir), false);
    const gone = await app.inject({
      method: "POST",
      url: "/conduit/v1/chat",
      headers: asAlice,
      payload: { model: id, prompt: "x" },
    });
    assert.equal(gone.statusCode, 404);
  });
});

describe("run lifecycle with a real trainer", () => {
  test("cancel mid-run stops the trainer within seconds and removes partial artifacts", async (t) => {
    const env = await testEnv(t);
    const app = await trainingApp(t, env);
    startScheduler(app);
    const datasetID = await datasetOf(app, pairs);
    const id = await startRun(app, { datasetID, epochs: 1000 });
    await waitFor(app, id, (r) => r.status === "RUNNING" && r.stats.step > 2, 60_000);
    const cancelledAt = Date.now();
    const res = await app.inject({
      method: "POST",
      url: `/conduit/finetuning/${id}/cancel`,
      headers: asAlice,
    });
    assert.deepEqual(res.json(), { message: "SUCCESS" });
    const run = await waitFor(
      app,
      id,
      (r) => r.logs.some((l: string) => l.includes("partial artifacts removed")),
      30_000,
    );
    assert.equal(run.status, "CANCELLED");
    assert.ok(Date.now() - cancelledAt < 15_000, "stopped within seconds");
    assert.equal(fs.existsSync(path.join(env.dataDir, "blobs", "runs", id)), false);
    const inference = await app.inject({
      method: "POST",
      url: `/conduit/finetuning/${id}/inference`,
      headers: asAlice,
      payload: { prompt: "x" },
    });
    assert.equal(inference.statusCode, 409);
    assert.equal(
      (await app.inject({ method: "POST", url: `/conduit/finetuning/${id}/cancel`, headers: asAlice }))
        .statusCode,
      409,
    );
  });

  test("deleting a running run cancels it and removes it", async (t) => {
    const env = await testEnv(t);
    const app = await trainingApp(t, env);
    startScheduler(app);
    const id = await startRun(app, { datasetID: await datasetOf(app, pairs), epochs: 1000 });
    await waitFor(app, id, (r) => r.status === "RUNNING" && r.stats.step > 0, 60_000);
    assert.equal(
      (await app.inject({ method: "DELETE", url: `/conduit/finetuning/${id}`, headers: asAlice })).statusCode,
      200,
    );
    assert.equal((await app.inject({ url: `/conduit/finetuning/${id}`, headers: asAlice })).statusCode, 404);
    const deadline = Date.now() + 20_000;
    while (fs.existsSync(path.join(env.dataDir, "blobs", "runs", id)) && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 200));
    assert.equal(fs.existsSync(path.join(env.dataDir, "blobs", "runs", id)), false, "its files are gone");
  });

  test("after a server crash the run is re-queued, trains again and ends READY", async (t) => {
    const env = await testEnv(t);
    const app = await trainingApp(t, env);
    const id = await startRun(app, { datasetID: await datasetOf(app, pairs.slice(0, 4)), epochs: 2 });
    // A worker that claimed the run and died: its lease has run out.
    const core = (
      app as unknown as { conduit: { runRepository: { claimNext(o: string, ms: number): Promise<unknown> } } }
    ).conduit;
    await core.runRepository.claimNext("crashed-worker", -1);
    assert.equal(
      (await app.inject({ url: `/conduit/finetuning/${id}`, headers: asAlice })).json().status,
      "RUNNING",
    );
    startScheduler(app);
    const run = await waitFor(app, id, (r) => ["READY", "FAILED"].includes(r.status));
    assert.equal(run.status, "READY", run.logs.join("\n"));
    assert.ok(run.logs.some((l: string) => l.includes("re-queued")));
    assert.ok(run.logs.some((l: string) => l.includes("attempt 2")));
  });

  test("a trainer that crashes fails the run with its reason", async (t) => {
    const env = await testEnv(t);
    fs.writeFileSync(
      path.join(env.dataDir, "models", "broken.gguf"),
      Buffer.concat([Buffer.from("GGUF"), Buffer.alloc(64, 7)]),
    );
    const app = await trainingApp(t, env);
    startScheduler(app);
    const id = await startRun(app, {
      datasetID: await datasetOf(app, pairs.slice(0, 2)),
      baseModelName: "broken",
    });
    const run = await waitFor(app, id, (r) => ["READY", "FAILED"].includes(r.status), 60_000);
    assert.equal(run.status, "FAILED");
    assert.ok(run.error && run.error.length > 0);
    assert.ok(run.logs.at(-1)?.includes("run failed:"), run.logs.join("\n"));
  });

  test("the events stream follows a run live until it ends", async (t) => {
    const app = await trainingApp(t);
    startScheduler(app);
    const id = await startRun(app, { datasetID: await datasetOf(app, pairs.slice(0, 6)), epochs: 6 });
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const response = await fetch(`${address}/conduit/finetuning/${id}/events`, { headers: asAlice });
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type") ?? "", /^text\/event-stream/);
    const body = await response.text();
    const events = body
      .split("\n\n")
      .filter((b) => b.trim())
      .map((b) => ({
        event: b.match(/^event: (.*)$/m)?.[1],
        data: JSON.parse(b.match(/^data: (.*)$/m)?.[1] ?? "null"),
      }));
    assert.ok(events.some((e) => e.event === "log" && e.data.line.includes("run queued")));
    assert.ok(events.filter((e) => e.event === "stats" && typeof e.data.step === "number").length >= 1);
    const statuses = events.filter((e) => e.event === "status").map((e) => e.data.status);
    assert.equal(statuses.at(-1), "READY");
    assert.ok(statuses.includes("RUNNING") || statuses[0] === "QUEUED");
    const missing = await fetch(`${address}/conduit/finetuning/ft_missing/events`, { headers: asAlice });
    assert.equal(missing.status, 404);
  });
});
