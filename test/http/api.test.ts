import assert from "node:assert/strict";
import { test } from "node:test";
import {
  aliceWorld,
  asAlice,
  asBob,
  backends,
  build,
  buildTestApp,
  createDataset,
  KEY_A,
  testEnv,
  as,
  KEY_B,
} from "../lib/helper.ts";
import { runScenarios } from "../lib/scenario.ts";
import path from "node:path";
import Sqlite from "better-sqlite3";
import pg from "pg";
import type { CoreOverrides } from "../../src/core.ts";
import { trainers } from "../../src/train/trainers.ts";

const models: CoreOverrides = {};

function endpoints(w: { ds: string; file: string; run: string }) {
  return [
    { method: "GET", url: `/conduit/dataset/${w.ds}` },
    { method: "PATCH", url: `/conduit/dataset/${w.ds}`, payload: { name: "mine" } },
    { method: "GET", url: `/conduit/dataset/${w.ds}/files` },
    {
      method: "POST",
      url: `/conduit/dataset/${w.ds}/upload`,
      payload: { name: "x.jsonl", ioPairs: [{ input: "a", output: "b" }] },
    },
    { method: "GET", url: `/conduit/dataset/${w.ds}/file/${w.file}` },
    { method: "GET", url: `/conduit/dataset/${w.ds}/file/${w.file}/pairs` },
    { method: "DELETE", url: `/conduit/dataset/${w.ds}/file/${w.file}` },
    { method: "DELETE", url: `/conduit/dataset/${w.ds}` },
    { method: "POST", url: "/conduit/finetuning", payload: { datasetID: w.ds, baseModelName: "tiny" } },
    { method: "POST", url: "/conduit/finetuning", payload: { datasetName: "secret", baseModelName: "tiny" } },
    { method: "GET", url: `/conduit/finetuning/${w.run}` },
    { method: "GET", url: `/conduit/finetuning/${w.run}/events` },
    { method: "POST", url: `/conduit/finetuning/${w.run}/inference`, payload: { prompt: "hi" } },
    ...generationWithRun(w.run),
    { method: "GET", url: `/conduit/finetuning/${w.run}/artifact` },
    { method: "POST", url: `/conduit/finetuning/${w.run}/cancel` },
    { method: "DELETE", url: `/conduit/finetuning/${w.run}` },
  ] as const;
}

/** Every generation endpoint, naming a run as the model. */
function generationWithRun(run: string) {
  const messages = [{ role: "user", content: "hi" }];
  return [
    { method: "POST", url: "/conduit/v1/chat", payload: { model: run, prompt: "hi" } },
    { method: "POST", url: "/conduit/v1/completions", payload: { model: run, messages } },
    { method: "POST", url: "/v1/chat/completions", payload: { model: run, messages } },
    { method: "POST", url: "/v1/completions", payload: { model: run, prompt: "hi" } },
    { method: "POST", url: "/v1/responses", payload: { model: run, input: "hi" } },
    { method: "POST", url: "/v1/embeddings", payload: { model: run, input: "hi" } },
    { method: "POST", url: "/conduit/v1/embeddings", payload: { model: run, input: "hi" } },
  ] as const;
}

for (const backend of backends()) {
  test(`tenancy: another user's ids answer 404 on every endpoint (${backend})`, async (t) => {
    const { app } = await build(t, backend, models);
    const world = await aliceWorld(app);
    await runScenarios(
      t,
      app,
      endpoints(world).map((e) => ({
        name: `${e.method} ${e.url} as bob`,
        method: e.method,
        url: e.url,
        key: KEY_B,
        ...("payload" in e ? { body: e.payload } : {}),
        status: 404,
        contains: ['"type":"not_found_error"'],
      })),
    );
    // Naming another user's run as the model reads exactly like naming no run at all.
    const nobody = "ft_01AAAAAAAAAAAAAAAAAAAAAAAA";
    assert.equal(nobody.length, world.run.length, "an id of the same shape, so the bodies compare");
    const generation = generationWithRun(world.run);
    for (const [i, e] of generationWithRun(nobody).entries()) {
      const payload = generation[i]?.payload;
      const unknown = await app.inject({ method: e.method, url: e.url, headers: asBob, payload: e.payload });
      const alices = await app.inject({ method: e.method, url: e.url, headers: asBob, payload });
      assert.equal(alices.json().error.code, "model_not_found", alices.body);
      assert.equal(alices.body.replaceAll(world.run, nobody), unknown.body, e.url);
      const owner = await app.inject({ method: e.method, url: e.url, headers: asAlice, payload });
      assert.equal(owner.statusCode, 409, `the owner is told the run is not READY: ${owner.body}`);
    }
    assert.deepEqual((await as(app, KEY_B).get("/conduit/dataset")).json(), []);
    assert.deepEqual((await as(app, KEY_B).get("/conduit/finetuning")).json(), []);
    // Alice still has everything, untouched.
    const ds = (await as(app, KEY_A).get(`/conduit/dataset/${world.ds}`)).json();
    assert.equal(ds.name, "secret");
    assert.equal(ds.ioPairsCount, 1);
    assert.equal((await as(app, KEY_A).get(`/conduit/finetuning/${world.run}`)).json().status, "QUEUED");
  });

  test(`auth: every endpoint needs a valid key, in any of the accepted headers (${backend})`, async (t) => {
    const { app } = await build(t, backend, models);
    const world = await aliceWorld(app);
    const list = [
      ...endpoints(world),
      { method: "GET", url: "/conduit/dataset" },
      { method: "GET", url: "/conduit/finetuning" },
    ];
    for (const headers of [
      {},
      { "x-api-key": "wrong-key-123" },
      { authorization: "Token wrong" },
      { authorization: KEY_A },
      { authorization: `Basic ${KEY_A}` },
    ]) {
      for (const e of list) {
        const res = await app.inject({
          method: e.method,
          url: e.url,
          headers,
          ...("payload" in e ? { payload: e.payload } : {}),
        });
        assert.equal(res.statusCode, 401, `${e.method} ${e.url} with ${JSON.stringify(headers)}`);
        assert.equal(res.json().error.code, "unauthorized");
      }
    }
    for (const headers of [
      { "x-api-key": KEY_A },
      { authorization: `Token ${KEY_A}` },
      { authorization: `Bearer ${KEY_A}` },
    ]) {
      const res = await app.inject({ url: "/conduit/dataset", headers });
      assert.equal(res.statusCode, 200, JSON.stringify(headers));
    }
    const unknownRoute = await as(app, KEY_A).get("/conduit/nothing");
    assert.equal(unknownRoute.statusCode, 404);
    assert.equal(unknownRoute.json().error.code, "not_found");
  });

  test(`a revoked key fails on the next request, revoked here or by another process (${backend})`, async (t) => {
    const environment = await testEnv(t, backend);
    const { app, config, core } = await buildTestApp(t, environment);
    const list = () => as(app, KEY_A).get("/conduit/dataset");
    const queriesOf = async (request: () => Promise<{ statusCode: number }>) => {
      const before = core.db.queries();
      assert.equal((await request()).statusCode, 200);
      return core.db.queries() - before;
    };
    // On SQLite a key that passed is remembered: the next check reads no table. PostgreSQL reads it each time.
    const first = await queriesOf(list);
    assert.equal(await queriesOf(list), backend === "sqlite" ? first - 1 : first);

    // Another process deletes alice's key behind this server's back (its own connection, as `conduit keys
    // revoke` on the same database would).
    if (backend === "sqlite") {
      const other = new Sqlite(path.join(environment.dataDir, "conduit.db"));
      other.prepare("DELETE FROM api_keys WHERE user_id = 'alice'").run();
      other.close();
    } else {
      const other = new pg.Client({ connectionString: config.databaseUrl });
      await other.connect();
      await other.query("DELETE FROM api_keys WHERE user_id = 'alice'");
      await other.end();
    }
    assert.equal((await list()).statusCode, 401, "revoked by another process");

    // Bob's key, remembered, then revoked through this server's own repository.
    assert.equal((await as(app, KEY_B).get("/conduit/dataset")).statusCode, 200);
    assert.equal(await core.keys.revoke(KEY_B), true);
    assert.equal((await as(app, KEY_B).get("/conduit/dataset")).statusCode, 401, "revoked here");
    // A key added afterwards works at once.
    const { key } = await core.keys.create("carol");
    assert.equal((await as(app, key).get("/conduit/dataset")).statusCode, 200);
  });

  test(`a run read is answered from memory only until anything is committed, here or by another process (${backend})`, async (t) => {
    const environment = await testEnv(t, backend);
    const { app, config, core } = await buildTestApp(t, environment);
    const { run } = await aliceWorld(app);
    const read = async () => {
      const before = core.db.queries();
      const response = await as(app, KEY_A).get(`/conduit/finetuning/${run}`);
      assert.equal(response.statusCode, 200);
      return {
        queries: core.db.queries() - before,
        run: response.json<{ status: string; logs: string[] }>(),
      };
    };
    await read();
    // Nothing committed since: SQLite answers the key check, the run and its evaluation (none) from memory;
    // PostgreSQL reads all three, the evaluation in one point read.
    assert.equal((await read()).queries, backend === "sqlite" ? 0 : 3);

    // This server's own write shows on the next read.
    await core.runRepository.appendLog(run, "written here");
    assert.match((await read()).run.logs.at(-1) ?? "", / written here$/);

    // So does another process's, behind this server's back.
    const statement = "UPDATE runs SET status = 'FAILED', error = 'failed elsewhere' WHERE id = ";
    if (backend === "sqlite") {
      const other = new Sqlite(path.join(environment.dataDir, "conduit.db"));
      other.prepare(`${statement}?`).run(run);
      other.close();
    } else {
      const other = new pg.Client({ connectionString: config.databaseUrl });
      await other.connect();
      await other.query(`${statement}$1`, [run]);
      await other.end();
    }
    const after = await read();
    assert.equal(after.run.status, "FAILED");
    assert.ok(after.queries > 0, "read again after another process's commit");
    // Bob is refused it as before, remembered or not.
    assert.equal((await as(app, KEY_B).get(`/conduit/finetuning/${run}`)).statusCode, 404);
  });
}

/** Values that pass a plain type check but that a database refuses or mis-stores. */
function badInputs(w: { ds: string; file: string; run: string }) {
  const pairs = [{ input: "a", output: "b" }];
  const run = { datasetID: w.ds, baseModelName: "tiny" };
  return [
    { method: "POST", url: "/conduit/dataset", payload: { name: "a\u0000b" }, param: "name" },
    { method: "POST", url: "/conduit/dataset", payload: { name: "tab\there" }, param: "name" },
    { method: "PATCH", url: `/conduit/dataset/${w.ds}`, payload: { name: "x\u001b[2J" }, param: "name" },
    { method: "GET", url: "/conduit/dataset?offset=1e30", param: "offset" },
    { method: "GET", url: `/conduit/dataset/${w.ds}/files?offset=1000000001`, param: "offset" },
    { method: "GET", url: `/conduit/dataset/${w.ds}/file/${w.file}/pairs?offset=1e30`, param: "offset" },
    { method: "GET", url: "/conduit/finetuning?offset=1e30", param: "offset" },
    { method: "GET", url: "/conduit/dataset/ds_%00", param: "dataset_id" },
    { method: "GET", url: `/conduit/dataset/${w.ds}/file/file_%00`, param: "file_id" },
    { method: "GET", url: "/conduit/finetuning/ft_%00", param: "finetune_id" },
    {
      method: "POST",
      url: `/conduit/dataset/${w.ds}/upload`,
      payload: { name: "a\u0000.jsonl", ioPairs: pairs },
      param: "name",
    },
    {
      method: "POST",
      url: `/conduit/dataset/${w.ds}/upload?name=a%00.jsonl`,
      headers: { "content-type": "application/jsonl" },
      payload: '{"input":"a","output":"b"}\n',
      param: "name",
    },
    { method: "POST", url: "/conduit/finetuning", payload: { ...run, steps: 10_000_000 }, param: "steps" },
    { method: "POST", url: "/conduit/finetuning", payload: { ...run, name: "r\u0000" }, param: "name" },
    {
      method: "POST",
      url: "/conduit/finetuning",
      payload: { ...run, systemPrompt: "Be brief.\u0000" },
      param: "systemPrompt",
    },
    {
      method: "POST",
      url: "/conduit/finetuning",
      payload: { ...run, trackerProject: "p\u0000" },
      param: "trackerProject",
    },
    {
      method: "POST",
      url: "/conduit/finetuning",
      payload: { ...run, trackerEntity: "e\n" },
      param: "trackerEntity",
    },
    {
      method: "POST",
      url: "/conduit/finetuning",
      payload: { datasetName: "secret\u0000", baseModelName: "tiny" },
      param: "datasetName",
    },
    {
      method: "POST",
      url: "/conduit/finetuning",
      payload: { datasetID: "ds_\u0000", baseModelName: "tiny" },
      param: "datasetID",
    },
    {
      method: "POST",
      url: "/conduit/finetuning",
      payload: { datasetID: w.ds, baseModelName: "tiny\u0000" },
      param: "baseModelName",
    },
    {
      method: "POST",
      url: "/conduit/v1/chat",
      payload: { model: "ft_\u0000", prompt: "hi" },
      param: "model",
    },
    {
      method: "POST",
      url: "/v1/chat/completions",
      payload: { model: "ft_\u0000", messages: [{ role: "user", content: "hi" }] },
      param: "model",
    },
  ] as const;
}

for (const backend of backends()) {
  test(`control characters and out-of-range numbers are 400 naming the field (${backend})`, async (t) => {
    const { app } = await build(t, backend, models);
    const world = await aliceWorld(app);
    for (const e of badInputs(world)) {
      const res = await app.inject({
        method: e.method,
        url: e.url,
        headers: { ...asAlice, ...("headers" in e ? e.headers : {}) },
        ...("payload" in e ? { payload: e.payload } : {}),
      });
      const label = `${e.method} ${e.url} ${JSON.stringify("payload" in e ? e.payload : "")}`;
      assert.equal(res.statusCode, 400, `${label} → ${res.statusCode} ${res.body}`);
      assert.equal(res.json().error.code, "invalid_request", label);
      assert.equal(res.json().error.param, e.param, `${label} → ${res.body}`);
    }
    const named = await as(app, KEY_A).post("/conduit/dataset", { name: "x\u0000" });
    assert.match(named.json().error.message, /"name" must not contain control characters/);
    const prompt = await as(app, KEY_A).post("/conduit/finetuning", {
      datasetID: world.ds,
      baseModelName: "tiny",
      systemPrompt: "line one\nline two",
    });
    assert.equal(prompt.statusCode, 200, "a system prompt may span lines");
    assert.deepEqual(
      (await as(app, KEY_A).get("/conduit/dataset")).json().map((d: { name: string }) => d.name),
      ["secret"],
    );
    assert.equal((await as(app, KEY_A).get("/conduit/finetuning")).json().length, 2);
    const files = await as(app, KEY_A).get(`/conduit/dataset/${world.ds}/files`);
    assert.equal(files.json().length, 1);
  });
}

test("health, OpenAPI document and docs page need no key", async (t) => {
  const { app } = await build(t);
  const health = await app.inject({ url: "/healthz" });
  assert.equal(health.statusCode, 200);
  assert.equal(health.json().database, "sqlite");
  assert.ok(health.json().disk.freeBytes > 0);
  // CONDUIT_GPU defaults to auto: a GPU when one works here, else the CPU, and /healthz says which.
  const { accelerator } = health.json();
  assert.equal(accelerator.setting, "auto");
  assert.ok(["cpu", "cuda", "vulkan", "metal"].includes(accelerator.backend), accelerator.backend);
  assert.equal(accelerator.devices.length === 0, accelerator.backend === "cpu");
  assert.equal(accelerator.gpuMemory === undefined, accelerator.backend === "cpu");
  // Every trainer of the registry has its block, described in the OpenAPI document; llama.cpp ships with Conduit.
  const { trainers: trainerHealth } = health.json();
  assert.deepEqual(Object.keys(trainerHealth).sort(), ["setting", ...Object.keys(trainers)].sort());
  assert.equal(trainerHealth["llama.cpp"].available, true);
  assert.equal(typeof trainerHealth.torch.available, "boolean");
  const spec = await app.inject({ url: "/openapi.json" });
  assert.equal(spec.statusCode, 200);
  const doc = spec.json();
  assert.equal(doc.openapi.startsWith("3."), true);
  for (const path of [
    "/conduit/dataset",
    "/conduit/dataset/{dataset_id}/upload",
    "/conduit/finetuning/{finetune_id}/cancel",
  ])
    assert.ok(doc.paths[path], `${path} documented`);
  const docs = await app.inject({ url: "/docs/" });
  assert.equal(docs.statusCode, 200);
  assert.match(docs.body, /swagger/i);
});

test("a 5xx body never carries internal text", async (t) => {
  const { app } = await build(t);
  app.get("/boom", async () => {
    throw new Error("secret database password in stack");
  });
  const res = await as(app, KEY_A).get("/boom");
  assert.equal(res.statusCode, 500);
  assert.deepEqual(res.json(), {
    error: { message: "internal server error", type: "server_error", param: null, code: "internal_error" },
  });
});

if (backends().includes("postgres"))
  test("two installs in two schemas of one PostgreSQL database each migrate their own", async (t) => {
    // Kysely finds its migration tables in any schema unless told which: the second install would skip
    // creating its own and fail ('relation "kysely_migration_lock" does not exist').
    const first = await buildTestApp(t, await testEnv(t, "postgres"), models);
    const second = await buildTestApp(t, await testEnv(t, "postgres"), models);
    for (const { app } of [first, second]) assert.equal((await createDataset(app, "x")).name, "x");
  });

for (const backend of backends()) {
  test(`data survives a restart (${backend})`, async (t) => {
    const env = await testEnv(t, backend);
    const first = await buildTestApp(t, env, models);
    const world = await aliceWorld(first.app);
    await first.app.close();
    const second = await buildTestApp(t, env, models);
    const ds = (await as(second.app, KEY_A).get(`/conduit/dataset/${world.ds}`)).json();
    assert.equal(ds.ioPairsCount, 1);
    const pairs = (
      await as(second.app, KEY_A).get(`/conduit/dataset/${world.ds}/file/${world.file}/pairs`)
    ).json();
    assert.deepEqual(pairs, [{ input: "a", output: "b", line: 1 }]);
    const run = (await as(second.app, KEY_A).get(`/conduit/finetuning/${world.run}`)).json();
    assert.equal(run.status, "QUEUED");
  });
}
