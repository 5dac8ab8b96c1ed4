import assert from "node:assert/strict";
import { test } from "node:test";
import type { FastifyInstance } from "fastify";
import { asAlice, asBob, backends, build, buildTestApp, KEY_A, testEnv } from "./helper.ts";
import type { CoreOverrides } from "../src/core.ts";

const models: CoreOverrides = {};

/** Alice's resources, for checking that nobody else can reach them. */
async function aliceWorld(app: FastifyInstance) {
  const ds = (
    await app.inject({
      method: "POST",
      url: "/conduit/dataset",
      headers: asAlice,
      payload: { name: "secret" },
    })
  ).json();
  const file = (
    await app.inject({
      method: "POST",
      url: `/conduit/dataset/${ds.id}/upload`,
      headers: asAlice,
      payload: { name: "a.jsonl", ioPairs: [{ input: "a", output: "b" }] },
    })
  ).json();
  const run = (
    await app.inject({
      method: "POST",
      url: "/conduit/finetuning",
      headers: asAlice,
      payload: { datasetID: ds.id, baseModelName: "tiny" },
    })
  ).json();
  return { ds: ds.id as string, file: file.id as string, run: run.id as string };
}

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
    { method: "GET", url: `/conduit/finetuning/${w.run}` },
    { method: "POST", url: `/conduit/finetuning/${w.run}/cancel` },
    { method: "DELETE", url: `/conduit/finetuning/${w.run}` },
  ] as const;
}

for (const backend of backends()) {
  test(`tenancy: another user's ids answer 404 on every endpoint (${backend})`, async (t) => {
    const { app } = await build(t, backend, models);
    const world = await aliceWorld(app);
    for (const e of endpoints(world)) {
      const res = await app.inject({
        method: e.method,
        url: e.url,
        headers: asBob,
        ...("payload" in e ? { payload: e.payload } : {}),
      });
      assert.equal(res.statusCode, 404, `${e.method} ${e.url} as bob → ${res.statusCode} ${res.body}`);
      assert.equal(res.json().error.type, "not_found_error");
    }
    assert.deepEqual((await app.inject({ url: "/conduit/dataset", headers: asBob })).json(), []);
    assert.deepEqual((await app.inject({ url: "/conduit/finetuning", headers: asBob })).json(), []);
    // Alice still has everything, untouched.
    const ds = (await app.inject({ url: `/conduit/dataset/${world.ds}`, headers: asAlice })).json();
    assert.equal(ds.name, "secret");
    assert.equal(ds.ioPairsCount, 1);
    assert.equal(
      (await app.inject({ url: `/conduit/finetuning/${world.run}`, headers: asAlice })).json().status,
      "QUEUED",
    );
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
    const unknownRoute = await app.inject({ url: "/conduit/nothing", headers: asAlice });
    assert.equal(unknownRoute.statusCode, 404);
    assert.equal(unknownRoute.json().error.code, "not_found");
  });
}

test("health, OpenAPI document and docs page need no key", async (t) => {
  const { app } = await build(t);
  const health = await app.inject({ url: "/healthz" });
  assert.deepEqual(health.json(), { status: "ok", database: "sqlite" });
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
  const res = await app.inject({ url: "/boom", headers: asAlice });
  assert.equal(res.statusCode, 500);
  assert.deepEqual(res.json(), {
    error: { message: "internal server error", type: "server_error", param: null, code: "internal_error" },
  });
});

for (const backend of backends()) {
  test(`data survives a restart (${backend})`, async (t) => {
    const env = await testEnv(t, backend);
    const first = await buildTestApp(t, env, models);
    const world = await aliceWorld(first.app);
    await first.app.close();
    const second = await buildTestApp(t, env, models);
    const ds = (await second.app.inject({ url: `/conduit/dataset/${world.ds}`, headers: asAlice })).json();
    assert.equal(ds.ioPairsCount, 1);
    const pairs = (
      await second.app.inject({
        url: `/conduit/dataset/${world.ds}/file/${world.file}/pairs`,
        headers: asAlice,
      })
    ).json();
    assert.deepEqual(pairs, [{ input: "a", output: "b", line: 1 }]);
    const run = (
      await second.app.inject({ url: `/conduit/finetuning/${world.run}`, headers: asAlice })
    ).json();
    assert.equal(run.status, "QUEUED");
  });
}
