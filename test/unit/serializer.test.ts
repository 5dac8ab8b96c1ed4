import assert from "node:assert/strict";
import { test } from "node:test";
import { Type } from "@sinclair/typebox";
import Fastify from "fastify";
import { registerSerializer } from "../../src/api/serializer.ts";
import { Run, RunSummary, sharedSchemas } from "../../src/contract/schemas.ts";

/** The response serializer on a bare Fastify app: what leaves is what the schema names. */

test("response bodies: a run's open config and stats come back whole; fields a schema does not name never leave", async () => {
  const app = Fastify();
  for (const schema of sharedSchemas) app.addSchema(schema);
  registerSerializer(app, sharedSchemas);
  const run = {
    ...Object.fromEntries(Object.keys(Run.properties).map((key) => [key, "x"])),
    ioPairsCount: 1,
    status: "READY",
    logs: ["a"],
    error: null,
    config: { lr: 0.001, loraTargets: ["attn_q"], steps: null, nested: { deep: [1, { two: 2 }] } },
    stats: { lossSeries: [[1, 2.5]], trainLoss: 0.1 },
    estimate: null,
    modelPath: "/secret/path.gguf",
  };
  app.get("/run", { schema: { response: { 200: Run } } }, async () => run);
  app.get("/runs", { schema: { response: { 200: Type.Array(Type.Ref(RunSummary)) } } }, async () => [run]);
  const one = (await app.inject({ method: "GET", url: "/run" })).json();
  assert.deepEqual(one.config, run.config);
  assert.deepEqual(one.stats, run.stats);
  assert.equal(one.modelPath, undefined);
  const [listed] = (await app.inject({ method: "GET", url: "/runs" })).json();
  assert.deepEqual(listed.config, run.config);
  assert.equal(listed.logs, undefined, "a summary has no logs");
  assert.equal(listed.modelPath, undefined);
  await app.close();
});
