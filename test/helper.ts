import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { FastifyInstance } from "fastify";
import pg from "pg";
import { buildApp } from "../src/api/buildApp.ts";
import { loadConfig, type Config } from "../src/config.ts";
import { createCore, type CoreOverrides } from "../src/core.ts";
import type { Engine } from "../src/engine/Engine.ts";
import type { GenerationRequest, GenerationResult } from "../src/engine/types.ts";
import { createTinyModel } from "../src/model/tinyModel.ts";

/** Where cleanup is registered: a test's `t`, or `{ after }` from node:test for a whole suite. */
export interface Cleanup {
  after(fn: () => unknown): void;
}

export const KEY_A = "test-key-alice-0000000000";
export const KEY_B = "test-key-bob-00000000000000";

/** Storage backends the tests run against: SQLite always, PostgreSQL when CONDUIT_TEST_DATABASE_URL is set. */
export function backends(): ("sqlite" | "postgres")[] {
  return process.env.CONDUIT_TEST_DATABASE_URL ? ["sqlite", "postgres"] : ["sqlite"];
}

/** A fresh PostgreSQL schema for one test, dropped after it. Returns a DATABASE_URL pointing at it. */
async function freshSchema(t: Cleanup): Promise<string> {
  const base = process.env.CONDUIT_TEST_DATABASE_URL;
  if (!base) throw new Error("CONDUIT_TEST_DATABASE_URL is not set");
  const schema = `t_${process.pid}_${Math.random().toString(36).slice(2, 10)}`;
  const client = new pg.Client({ connectionString: base });
  await client.connect();
  await client.query(`CREATE SCHEMA ${schema}`);
  await client.end();
  t.after(async () => {
    const c = new pg.Client({ connectionString: base });
    await c.connect();
    await c.query(`DROP SCHEMA ${schema} CASCADE`);
    await c.end();
  });
  const url = new URL(base);
  url.searchParams.set("options", `-c search_path=${schema}`);
  return url.toString();
}

let tinyModelFile: Promise<string> | undefined;

/** The generated tiny model (made once per test process), served as `tiny` in every test env. */
export function tinyModel(): Promise<string> {
  tinyModelFile ??= (async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-tiny-"));
    process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
    const file = path.join(dir, "tiny.gguf");
    await createTinyModel(file, { seed: 1 });
    return file;
  })();
  return tinyModelFile;
}

export interface TestEnv {
  dataDir: string;
  env: Record<string, string>;
}

/** A temp data dir (removed after the test) and the environment of a test server. */
export async function testEnv(
  t: Cleanup,
  backend: "sqlite" | "postgres" = "sqlite",
  extra: Record<string, string> = {},
): Promise<TestEnv> {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-test-"));
  t.after(() => fs.rmSync(dataDir, { recursive: true, force: true }));
  const env: Record<string, string> = {
    CONDUIT_DATA_DIR: dataDir,
    CONDUIT_API_KEYS: `${KEY_A}:alice,${KEY_B}:bob`,
    // Alice is the operator: she may read /metrics, bob may not.
    CONDUIT_METRICS_USERS: "alice",
    CONDUIT_LOG_LEVEL: "silent",
    // Tests that train start the scheduler themselves.
    CONDUIT_TRAIN_CONCURRENCY: "0",
    ...extra,
  };
  fs.mkdirSync(path.join(dataDir, "models"), { recursive: true });
  fs.copyFileSync(await tinyModel(), path.join(dataDir, "models", "tiny.gguf"));
  if (backend === "postgres") env.DATABASE_URL = await freshSchema(t);
  return { dataDir, env };
}

/** Builds the app on a test environment; closed after the test. */
export async function buildTestApp(
  t: Cleanup,
  testEnvironment: TestEnv,
  overrides: CoreOverrides = {},
): Promise<{ app: FastifyInstance; config: Config }> {
  const config = loadConfig(testEnvironment.env);
  const core = await createCore(config, overrides);
  for (const seed of config.apiKeys) await core.keys.ensure(seed.key, seed.userId);
  const app = await buildApp(core);
  // Tests reach into the core (e.g. to start the scheduler).
  app.decorate("conduit", core);
  t.after(() => app.close());
  return { app, config };
}

/** The usual case: a fresh app with users alice (KEY_A) and bob (KEY_B). */
export async function build(
  t: Cleanup,
  backend: "sqlite" | "postgres" = "sqlite",
  overrides: CoreOverrides = {},
) {
  return buildTestApp(t, await testEnv(t, backend), overrides);
}

export const asAlice = { "x-api-key": KEY_A };
export const asBob = { "x-api-key": KEY_B };

/** Creates a dataset for Alice and returns its record. */
export async function createDataset(app: FastifyInstance, name = "d") {
  const response = await app.inject({
    method: "POST",
    url: "/conduit/dataset",
    headers: asAlice,
    payload: { name },
  });
  if (response.statusCode !== 200) throw new Error(`creating dataset ${name}: ${response.body}`);
  return response.json() as { id: string; name: string; ioPairsCount: number };
}

/** A dataset of Alice's holding `pairs` (one uploaded file); returns its id. */
export async function datasetOf(
  app: FastifyInstance,
  pairs: { input: string; output: string }[],
  name = "pairs",
): Promise<string> {
  const ds = await createDataset(app, name);
  const up = await app.inject({
    method: "POST",
    url: `/conduit/dataset/${ds.id}/upload`,
    headers: asAlice,
    payload: { name: "p.jsonl", ioPairs: pairs },
  });
  if (up.statusCode !== 200) throw new Error(`uploading to ${name}: ${up.body}`);
  return ds.id;
}

/** Creates a run of Alice's on the tiny model (`body` adds to or overrides that); returns its id. */
export async function startRun(app: FastifyInstance, body: Record<string, unknown>): Promise<string> {
  const res = await app.inject({
    method: "POST",
    url: "/conduit/finetuning",
    headers: asAlice,
    payload: { baseModelName: "tiny", ...body },
  });
  if (res.statusCode !== 200) throw new Error(`creating a run: ${res.body}`);
  return res.json().id;
}

/** Alice's resources, for checking that nobody else can reach them. */
export async function aliceWorld(app: FastifyInstance) {
  const ds = await createDataset(app, "secret");
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

/** Streams one token every 20 ms until its request is aborted: a generation that outlasts any test. */
export function endlessEngine(): Engine {
  return {
    generate: (request: GenerationRequest) =>
      new Promise<GenerationResult>((_resolve, reject) => {
        const timer = setInterval(() => request.onText?.("x"), 20);
        request.signal?.addEventListener("abort", () => {
          clearInterval(timer);
          reject(request.signal?.reason);
        });
      }),
    load: async () => undefined,
    loaded: () => [],
    accelerator: async () => ({ setting: "off", backend: "cpu", devices: [], gpuLayers: 0 }),
    stats: () => ({
      queueDepth: 0,
      activeGenerations: 0,
      loadedModels: 0,
      loadedBases: 0,
      loadingModels: 0,
      cachedPromptTokens: 0,
      completedGenerations: 0,
      rejectedRequests: 0,
      promptTokens: 0,
      completionTokens: 0,
    }),
    dispose: async () => undefined,
  };
}
