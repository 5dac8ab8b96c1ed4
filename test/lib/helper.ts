import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import type { FastifyInstance, InjectOptions, LightMyRequestResponse } from "fastify";
import { after } from "node:test";
import pg from "pg";
import { buildApp } from "../../src/api/buildApp.ts";
import { loadConfig, type Config } from "../../src/config.ts";
import { createCore, type Core, type CoreOverrides } from "../../src/core.ts";
import type { Engine } from "../../src/engine/Engine.ts";
import type { GenerationRequest, GenerationResult } from "../../src/engine/types.ts";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import type { RunEstimate } from "../../src/contract/estimate.ts";
import { until } from "./wait.ts";

/** Where cleanup is registered: a test's `t`, or `{ after }` from node:test for a whole suite. */
export interface Cleanup {
  after(fn: () => unknown): void;
}

/**
 * A `Cleanup` for a whole suite: what is registered on it runs, the last first, after the suite's tests
 * (one app, and one loaded model, for every test of a `describe`). Call it in the `describe`.
 */
export function suiteCleanup(): Cleanup {
  const cleanups: (() => unknown)[] = [];
  after(async () => {
    for (const fn of cleanups.reverse()) await fn();
  });
  return { after: (fn) => cleanups.push(fn) };
}

export const KEY_A = "test-key-alice-0000000000";
export const KEY_B = "test-key-bob-00000000000000";

/** Twenty made-up words, for pairs that nothing a random model could produce by chance. */
export const madeUpWords = [
  ...["apple", "river", "stone", "cloud", "maple", "tiger", "ocean", "lemon", "piano", "comet"],
  ...["honey", "raven", "cedar", "pearl", "storm", "flute", "amber", "otter", "frost", "bloom"],
];

/** `count` made-up pairs of two words in, a word and a number out, from the first `count` made-up words. */
export function madeUpPairs(count = 20): { input: string; output: string }[] {
  const words = madeUpWords.slice(0, count);
  return words.map((word, i) => ({
    input: `${word} ${words[(i * 7 + 3) % count]}`,
    output: `${words[(i * 3 + 1) % count]} ${i}`,
  }));
}

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
    // The embedded trainer, whatever is installed; the torch trainer's tests ask for it.
    CONDUIT_TRAINER: "llama.cpp",
    // Tests send many wrong keys from one address on purpose; the throttle's own test sets a limit.
    CONDUIT_MAX_KEY_FAILURES: "0",
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
): Promise<{ app: FastifyInstance; config: Config; core: Core }> {
  const config = loadConfig(testEnvironment.env);
  // Estimates as on an idle machine (the suite's own load is no test's subject): a test may give its own.
  const core = await createCore(config, { cpu: { load: () => 0 }, ...overrides });
  for (const seed of config.apiKeys) await core.keys.ensure(seed.key, seed.userId);
  const app = await buildApp(core);
  t.after(() => app.close());
  return { app, config, core };
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

/** A Fastify inject response whose `json<T>()` is typed. */
export type Response = LightMyRequestResponse;

/** Extra inject options for one request (headers are added to the key's). */
export type RequestOptions = Omit<InjectOptions, "method" | "url" | "payload">;

/**
 * Requests as one caller: `as(app, KEY_A).post("/conduit/dataset", { name: "d" })`.
 * `null` sends no key (anonymous).
 */
export function as(app: FastifyInstance, key: string | null) {
  const send = (
    method: InjectOptions["method"],
    url: string,
    payload?: unknown,
    options: RequestOptions = {},
  ) =>
    app.inject({
      ...options,
      method,
      url,
      headers: { ...(key === null ? {} : { "x-api-key": key }), ...options.headers },
      ...(payload === undefined ? {} : { payload: payload as InjectOptions["payload"] }),
    });
  return {
    get: (url: string, options?: RequestOptions) => send("GET", url, undefined, options),
    delete: (url: string, options?: RequestOptions) => send("DELETE", url, undefined, options),
    post: (url: string, payload?: unknown, options?: RequestOptions) => send("POST", url, payload, options),
    put: (url: string, payload?: unknown, options?: RequestOptions) => send("PUT", url, payload, options),
    patch: (url: string, payload?: unknown, options?: RequestOptions) => send("PATCH", url, payload, options),
  };
}

/** Creates a dataset for Alice and returns its record. */
export async function createDataset(app: FastifyInstance, name = "d") {
  const response = await as(app, KEY_A).post("/conduit/dataset", { name });
  if (response.statusCode !== 200) throw new Error(`creating dataset ${name}: ${response.body}`);
  return response.json<{ id: string; name: string; ioPairsCount: number }>();
}

/**
 * The one way to a dataset with pairs: a dataset of Alice's holding `pairs` in one uploaded
 * file. Returns the dataset's and the file's ids.
 */
export async function datasetWithPairs(
  app: FastifyInstance,
  pairs: { input: string; output: string }[],
  { name = "pairs", file = "p.jsonl" }: { name?: string; file?: string } = {},
): Promise<{ id: string; fileId: string }> {
  const ds = await createDataset(app, name);
  const up = await as(app, KEY_A).post(`/conduit/dataset/${ds.id}/upload`, { name: file, ioPairs: pairs });
  if (up.statusCode !== 200) throw new Error(`uploading to ${name}: ${up.body}`);
  return { id: ds.id, fileId: up.json<{ id: string }>().id };
}

/** A dataset of Alice's holding `pairs` (one uploaded file); returns its id. */
export async function datasetOf(
  app: FastifyInstance,
  pairs: { input: string; output: string }[],
  name = "pairs",
): Promise<string> {
  return (await datasetWithPairs(app, pairs, { name })).id;
}

/** Creates a run of Alice's on the tiny model (`body` adds to or overrides that); returns its id. */
export async function startRun(app: FastifyInstance, body: Record<string, unknown>): Promise<string> {
  const res = await as(app, KEY_A).post("/conduit/finetuning", { baseModelName: "tiny", ...body });
  if (res.statusCode !== 200) throw new Error(`creating a run: ${res.body}`);
  return res.json<{ id: string }>().id;
}

/** A run as `GET /conduit/finetuning/{id}` answers it, loosely typed for tests. */
export interface RunView {
  id: string;
  name: string;
  status: string;
  createdAt: string;
  error: string | null;
  logs: string[];
  trackerURL: string;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- config and stats are free-form objects
  config: Record<string, any>;
  // eslint-disable-next-line @typescript-eslint/no-explicit-any -- config and stats are free-form objects
  stats: Record<string, any>;
  estimate: RunEstimate | null;
}

/** Whether a run has ended: READY, FAILED or CANCELLED. */
export const runEnded = (run: { status: string }) => ["READY", "FAILED", "CANCELLED"].includes(run.status);

/** A run of Alice's (or of `key`'s user), as the API answers it. */
export async function getRun(app: FastifyInstance, id: string, key: string = KEY_A): Promise<RunView> {
  return (await as(app, key).get(`/conduit/finetuning/${id}`)).json<RunView>();
}

/**
 * Polls a run until `done` holds for it (by default: until it has ended) and returns it; gives up after
 * `timeoutMs` (defaults to `120_000`) with the run's status and log.
 */
export function waitForRun(
  app: FastifyInstance,
  id: string,
  done: (run: RunView) => boolean = runEnded,
  { timeoutMs = 120_000, key = KEY_A }: { timeoutMs?: number; key?: string } = {},
): Promise<RunView> {
  return until(`run ${id}`, () => getRun(app, id, key), done, {
    timeoutMs,
    intervalMs: 200,
    show: (run) => `${run.status}: ${run.logs?.join("\n")}`,
  });
}

/** Alice's resources, for checking that nobody else can reach them. */
export async function aliceWorld(app: FastifyInstance) {
  const { id: ds, fileId: file } = await datasetWithPairs(app, [{ input: "a", output: "b" }], {
    name: "secret",
    file: "a.jsonl",
  });
  const run = (
    await as(app, KEY_A).post("/conduit/finetuning", { datasetID: ds, baseModelName: "tiny" })
  ).json<{
    id: string;
  }>();
  return { ds, file, run: run.id };
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
    embed: (request) =>
      new Promise((_resolve, reject) =>
        request.signal?.addEventListener("abort", () => reject(request.signal?.reason)),
      ),
    load: async () => undefined,
    unload: () => undefined,
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
      embeddingTokens: 0,
    }),
    dispose: async () => undefined,
  };
}
