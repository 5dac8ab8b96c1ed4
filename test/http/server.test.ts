import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { loadConfig } from "../../src/config.ts";
import { bootstrapKeys, createCore } from "../../src/core.ts";
import { startServer } from "../../src/server.ts";
import {
  aliceWorld,
  as,
  asAlice,
  backends,
  buildTestApp,
  endlessEngine,
  KEY_A,
  testEnv,
} from "../lib/helper.ts";
import { readUntil } from "../lib/wait.ts";

for (const backend of backends()) {
  test(`first start: one key for user "default", returned once; later starts create none (${backend})`, async (t) => {
    const env = await testEnv(t, backend, { CONDUIT_API_KEYS: "" });
    const config = loadConfig(env.env);
    const first = await createCore(config);
    const key = await bootstrapKeys(first);
    assert.match(key ?? "", /^cnd_/);
    const keys = await first.keys.list();
    assert.equal(keys.length, 1);
    assert.equal(keys[0]?.userId, "default");
    assert.equal((await first.keys.authenticate(key ?? ""))?.userId, "default");
    await first.close();

    const second = await createCore(config);
    t.after(() => second.close());
    assert.equal(await bootstrapKeys(second), undefined);
    assert.equal(await second.keys.count(), 1);
  });
}

test("/metrics: the first-start key reads it by default; CONDUIT_METRICS_USERS names others or *", async (t) => {
  const env = await testEnv(t, "sqlite", { CONDUIT_API_KEYS: "", CONDUIT_METRICS_USERS: "" });
  assert.deepEqual(loadConfig(env.env).metricsUsers, ["default"]);
  const { app, core } = await buildTestApp(t, env);
  const key = await bootstrapKeys(core);
  assert.equal((await app.inject({ url: "/metrics", headers: { "x-api-key": key ?? "" } })).statusCode, 200);
  const { key: carol } = await core.keys.create("carol");
  assert.equal((await app.inject({ url: "/metrics", headers: { "x-api-key": carol } })).statusCode, 403);

  assert.deepEqual(loadConfig({ ...env.env, CONDUIT_METRICS_USERS: " ops, carol " }).metricsUsers, [
    "ops",
    "carol",
  ]);
  assert.deepEqual(loadConfig({ ...env.env, CONDUIT_METRICS_USERS: "*" }).metricsUsers, ["*"]);
  assert.throws(
    () => loadConfig({ ...env.env, CONDUIT_METRICS_USERS: "ops,,carol" }),
    /CONDUIT_METRICS_USERS/,
  );
});

test("/metrics counts HTTP requests by method, route and status, and their latency by route", async (t) => {
  const { app } = await buildTestApp(t, await testEnv(t));
  for (let i = 0; i < 3; i++) assert.equal((await as(app, KEY_A).get("/conduit/dataset")).statusCode, 200);
  assert.equal((await as(app, KEY_A).get("/conduit/dataset/ds_nope")).statusCode, 404);
  assert.equal((await app.inject({ url: "/conduit/dataset" })).statusCode, 401);
  const text = (await as(app, KEY_A).get("/metrics")).body;
  const value = (line: string) => {
    const found = text.split("\n").find((l) => l.startsWith(`${line} `));
    assert.ok(found, `no line ${line} in:\n${text}`);
    return Number(found.slice(line.length + 1));
  };
  const requests = "conduit_http_requests_total";
  assert.equal(value(`${requests}{method="GET",route="/conduit/dataset",status="200"}`), 3);
  assert.equal(value(`${requests}{method="GET",route="/conduit/dataset",status="401"}`), 1);
  assert.equal(value(`${requests}{method="GET",route="/conduit/dataset/:dataset_id",status="404"}`), 1);
  // The histogram's buckets are cumulative, end in +Inf at the count, and its sum is the latencies' total.
  const latency = "conduit_http_request_duration_seconds";
  const labels = 'method="GET",route="/conduit/dataset"';
  const bounds = ["0.001", "0.005", "0.01", "0.05", "0.1", "0.5", "1", "2", "5", "10", "30", "60", "+Inf"];
  const buckets = bounds.map((le) => value(`${latency}_bucket{le="${le}",${labels}}`));
  assert.deepEqual(
    buckets,
    [...buckets].sort((a, b) => a - b),
  );
  assert.equal(buckets.at(-1), 4);
  assert.equal(value(`${latency}_count{${labels}}`), 4);
  assert.ok(value(`${latency}_sum{${labels}}`) > 0);
  assert.match(text, /^# TYPE conduit_http_request_duration_seconds histogram$/m);
  assert.match(text, /^# TYPE conduit_http_requests_total counter$/m);
});

test("keys from CONDUIT_API_KEYS count: no default key is made beside them", async (t) => {
  const env = await testEnv(t);
  const core = await createCore(loadConfig(env.env));
  t.after(() => core.close());
  assert.equal(await bootstrapKeys(core), undefined);
  assert.deepEqual((await core.keys.list()).map((k) => k.userId).sort(), ["alice", "bob"]);
});

test("only the server sweeps temp files, and only stale ones", async (t) => {
  const env = await testEnv(t);
  const tmp = path.join(env.dataDir, "blobs", ".tmp");
  fs.mkdirSync(tmp, { recursive: true });
  const stale = path.join(tmp, "stale-upload");
  const fresh = path.join(tmp, "upload-in-progress");
  fs.writeFileSync(stale, "left by a crash");
  fs.writeFileSync(fresh, "another server is writing this");
  const twoHoursAgo = new Date(Date.now() - 2 * 60 * 60 * 1000);
  fs.utimesSync(stale, twoHoursAgo, twoHoursAgo);

  // What `conduit keys ...` does: open the core on the same data dir.
  const cli = await createCore(loadConfig(env.env));
  await cli.close();
  assert.deepEqual(fs.readdirSync(tmp).sort(), ["stale-upload", "upload-in-progress"]);

  const server = await startServer(loadConfig({ ...env.env, CONDUIT_PORT: "0" }));
  t.after(() => server.close());
  assert.deepEqual(fs.readdirSync(tmp), ["upload-in-progress"]);
});

async function readToEnd(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<string> {
  return readUntil(reader, /(?!)/);
}

test("closing the server ends open event and generation streams at once", { timeout: 20_000 }, async (t) => {
  const env = await testEnv(t);
  const { app } = await buildTestApp(t, env, { engine: endlessEngine() });
  const run = { id: (await aliceWorld(app)).run };
  const base = await app.listen({ port: 0, host: "127.0.0.1" });

  const events = await fetch(`${base}/conduit/finetuning/${run.id}/events`, { headers: asAlice });
  const eventsReader = events.body!.getReader();
  assert.match(await readUntil(eventsReader, /"status":"QUEUED"/), /event: status/);
  const chat = await fetch(`${base}/conduit/v1/chat`, {
    method: "POST",
    headers: { ...asAlice, "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt: "hi", stream: true }),
  });
  const chatReader = chat.body!.getReader();
  assert.match(await readUntil(chatReader, /chat\.completion\.chunk/), /"content":"x"/);

  const started = Date.now();
  await app.close();
  const elapsed = Date.now() - started;
  assert.ok(elapsed < 2000, `close took ${elapsed} ms`);
  for (const reader of [eventsReader, chatReader]) {
    const rest = await readToEnd(reader);
    const last = rest.trim().split("\n\n").at(-1) ?? "";
    assert.match(last, /^data: \{"error":\{.*"code":"unavailable"\}\}$/, rest);
  }
});

test(
  "a shutdown while a run trains and a client follows it hands the run back to the queue",
  { timeout: 60_000 },
  async (t) => {
    const env = await testEnv(t);
    const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
    const ds = await core.datasets.create("alice", "d");
    await core.datasets.upload("alice", ds.id, {
      name: "a.jsonl",
      source: (await import("node:stream")).Readable.from(['{"input":"ping","output":"pong"}\n']),
    });
    const run = await core.runs.create("alice", { datasetID: ds.id, baseModelName: "tiny", epochs: 1000 });
    core.scheduler.start();
    const base = await app.listen({ port: 0, host: "127.0.0.1" });
    const events = await fetch(`${base}/conduit/finetuning/${run.id}/events`, { headers: asAlice });
    const reader = events.body!.getReader();
    await readUntil(reader, /"status":"RUNNING"/);

    const started = Date.now();
    await app.close();
    const elapsed = Date.now() - started;
    assert.ok(elapsed < 5000, `close took ${elapsed} ms`);
    assert.match(await readToEnd(reader), /"code":"unavailable"/);

    const after = await createCore(loadConfig(env.env));
    t.after(() => after.close());
    const requeued = await after.runs.get("alice", run.id);
    assert.equal(requeued.status, "QUEUED");
    assert.match(requeued.logs.at(-1) ?? "", /re-queued: the server shut down/);
  },
);
