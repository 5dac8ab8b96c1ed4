/**
 * Hostile load (issue #28): how `/healthz` and another client's chat fare while the server is under each of
 *   - `keys`: 1,000 requests with wrong API keys, 50 at a time, from 127.0.0.2;
 *   - `wrongThenValid`: round after round from an address of its own (127.0.1.N), 20 wrong keys (the limit), then
 *     a valid key of another user from the same address (it must be served), then one more wrong key (429);
 *   - `slow`: 200 uploads trickled a few bytes a second (slow bodies);
 *   - `followers`: 300 followers of a running run (its events stream), plus 20 past the per-user cap;
 *   - `enum`: chat requests whose `response_format` is a 100,000-value enum, one at a time;
 *   - `redos`: eval runs whose regex graders backtrack catastrophically in JavaScript (`(a+)+$`,
 *     `^([\s\S]+)+\u0000$`: any 34-character answer held a backtracking engine for a minute);
 *   - `fuzzy`: eval runs scoring answers by `fuzzy_match` against 100,000-character references;
 *   - `evalFollowers`: 32 followers (the per-user cap) of a running eval run, against the same eval run with
 *     none (its answers per second in both);
 *   - `database`: a second server on a PostgreSQL server of the bench's own (`initdb`; as root it runs as the
 *     `postgres` user), whose every connection is ended (`pg_terminate_backend`) 3 s in, which is stopped 8 s
 *     in and started again 14 s in; the chat's 503s meanwhile are counted, and a run and a dataset made before
 *     are checked after;
 * against a baseline with no load and one with the run training and nobody following it (the trainer's share
 * of the CPU, which the followers scenario also pays).
 *
 * A `conduit serve` of its own on a temp data dir, on loopback: the tiny generated model serves the chat, the
 * real stories260K (`../shared/models`, else the tiny model) trains the run, which is cancelled at the end.
 * The hostile clients run in a child process (bench/lib/hostileLoad.ts); this process probes `/healthz`
 * every 50 ms and sends a small chat (8 tokens) every 200 ms with a key of another user, and reads the
 * server's CPU time and RSS from /proc. Each scenario is bounded (`--seconds`, at most 60), and waits for
 * `/healthz` to settle before it starts.
 *
 *   node --import tsx bench/hostile.ts [--seconds 30]
 *        [--only baseline,keys,wrongThenValid,slow,training,followers,enum,redos,fuzzy,evalFollowers,database]
 *        [--followers 300]
 *
 * With DATABASE_URL set, the server runs on that PostgreSQL database, in a schema of its own dropped at the end.
 * The server's stream cap (`CONDUIT_MAX_STREAMS_PER_USER`) is set to `--followers`, so that all of them open
 * (a run is followed by its owner only) and the 20 beyond it show the cap's 429. Wrong keys come from
 * 127.0.0.2 because the key throttle counts per address: from 127.0.0.1 the chat client would be refused too.
 */
import { fork } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import pg from "pg";
import { createTinyModel } from "../src/model/tinyModel.ts";
import { BENCH_KEY, call, startConduit, type RunningServer } from "./lib/conduitServer.ts";
import type { LoadResult, Scenario } from "./lib/hostileLoad.ts";
import { repoRoot } from "./lib/reference.ts";
import { privatePostgres } from "../test/lib/privatePostgres.ts";

// In the order they run; each is a `measure` of its own in the chain below.
const SCENARIOS = [
  "baseline",
  "keys",
  "wrongThenValid",
  "slow",
  "training",
  "followers",
  "enum",
  "redos",
  "fuzzy",
  "evalFollowers",
  "database",
] as const;
type Name = (typeof SCENARIOS)[number];

const { values } = parseArgs({
  options: {
    seconds: { type: "string", default: "30" },
    only: { type: "string", default: SCENARIOS.join(",") },
    followers: { type: "string", default: "300" },
  },
});
const seconds = Math.min(60, Number(values.seconds));
const only = new Set(values.only.split(",") as Name[]);
const followerCount = Number(values.followers);
const CHAT_KEY = "bench-chat-key-000000000000";
/** The key of a user behind the same address as a key guesser (`wrongThenValid`). */
const NAT_KEY = "bench-nat-key-0000000000000";
const PROBE_MS = 50;
const CHAT_PAUSE_MS = 200;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-hostile-"));
const tiny = path.join(dir, "tiny.gguf");
await createTinyModel(tiny);
const stories = path.join(repoRoot, "..", "shared", "models", "stories260Ktok512.gguf");
const trainModel = fs.existsSync(stories) ? stories : tiny;
// On PostgreSQL (DATABASE_URL), a schema of its own, dropped at the end.
let databaseUrl: string | undefined;
let dropSchema = async () => undefined as unknown;
if (process.env.DATABASE_URL) {
  const schema = `bench_hostile_${process.pid}`;
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
    await client.connect();
    await client.query(sql);
    await client.end();
  };
  await admin(`CREATE SCHEMA ${schema}`);
  dropSchema = () => admin(`DROP SCHEMA ${schema} CASCADE`);
  const url = new URL(process.env.DATABASE_URL);
  url.searchParams.set("options", `-c search_path=${schema}`);
  databaseUrl = url.toString();
}
const server = await startConduit(
  { tiny, trainee: trainModel },
  {
    ...(databaseUrl ? { DATABASE_URL: databaseUrl } : {}),
    CONDUIT_API_KEYS: `${BENCH_KEY}:bench,${CHAT_KEY}:chat,${NAT_KEY}:nat`,
    CONDUIT_DEFAULT_MODEL: "tiny",
    CONDUIT_MAX_STREAMS_PER_USER: String(followerCount),
    // The followers and the probes come from one address.
    CONDUIT_CONNECTIONS_PER_IP: String(followerCount + 64),
  },
);
process.on("exit", () => {
  server.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** The server's CPU seconds so far (user + system, without its trainer child) and its RSS in MB. */
function serverUsage(pid = server.child.pid!): { cpu: number; rss: number } {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
  const status = fs.readFileSync(`/proc/${pid}/status`, "utf8");
  return {
    // utime and stime, in clock ticks of 1/100 s (Linux's USER_HZ).
    cpu: (Number(stat[11]) + Number(stat[12])) / 100,
    rss: Number(/VmRSS:\s+(\d+)/.exec(status)?.[1]) / 1024,
  };
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function timed(work: () => Promise<Response>): Promise<{ ms: number; status: number | string }> {
  const start = performance.now();
  try {
    const response = await work();
    await response.arrayBuffer();
    return { ms: performance.now() - start, status: response.status };
  } catch (error) {
    return { ms: performance.now() - start, status: (error as Error).name };
  }
}

const healthz = (target: RunningServer = server) =>
  timed(() => fetch(`${target.url}/healthz`, { signal: AbortSignal.timeout(60_000) }));
const chat = (target: RunningServer = server) =>
  timed(() =>
    fetch(`${target.url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${CHAT_KEY}`, "content-type": "application/json" },
      body: JSON.stringify({ messages: [{ role: "user", content: "Hello" }], max_tokens: 8 }),
      signal: AbortSignal.timeout(60_000),
    }),
  );

/** Waits until 10 probes in a row answer within 50 ms (at most 30 s); returns the seconds it took. */
async function settle(target: RunningServer): Promise<number> {
  const start = Date.now();
  for (let good = 0; good < 10 && Date.now() - start < 30_000;) {
    good = (await healthz(target)).ms < 50 ? good + 1 : 0;
    await sleep(PROBE_MS);
  }
  return (Date.now() - start) / 1000;
}

const percentile = (sorted: number[], p: number) =>
  sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!;

interface Row {
  name: string;
  probes: number;
  p50: number;
  p99: number;
  max: number;
  chats: number;
  chatP50: number;
  chatP99: number;
  chatFailed: number;
  /** The slowest failed chat (a prompt 503 during a database outage), ms. */
  chatFailedMax: number;
  cpu: number;
  rssStart: number;
  rssPeak: number;
  load: string;
}
const rows: Row[] = [];

/**
 * Probes and chats while `load` runs (or for `seconds` when there is none): a scenario of the hostile clients'
 * process, or work of this process's own (eval runs, a database outage) that returns a note on what it did.
 */
async function measure(
  name: string,
  load?: Scenario | (() => Promise<string>),
  target: RunningServer = server,
): Promise<void> {
  const settled = await settle(target);
  const usage = () => serverUsage(target.child.pid!);
  const before = usage();
  let rssPeak = before.rss;
  const started = performance.now();
  let done = false;
  let result: LoadResult | undefined;
  let note = "";
  const finished =
    typeof load === "function"
      ? load().then((text) => void (note = text))
      : load
        ? new Promise<void>((resolve, reject) => {
            const child = fork(new URL("./lib/hostileLoad.ts", import.meta.url), {
              execArgv: ["--import", "tsx"],
              stdio: "inherit",
            });
            child.once("message", (message) => (result = message as LoadResult));
            child.once("exit", (code) =>
              result ? resolve() : reject(new Error(`the load process exited with ${code}`)),
            );
            child.send(load);
          })
        : sleep(seconds * 1000);
  void finished.finally(() => (done = true));
  const probes: number[] = [];
  /** The slowest probe, and when it began (seconds into the scenario). */
  let worst = { ms: 0, at: 0 };
  const chats: number[] = [];
  let chatFailed = 0;
  let chatFailedMax = 0;
  await Promise.all([
    (async () => {
      while (!done) {
        const next = performance.now() + PROBE_MS;
        const { ms } = await healthz(target);
        if (ms > worst.ms) worst = { ms, at: (next - PROBE_MS - started) / 1000 };
        probes.push(ms);
        rssPeak = Math.max(rssPeak, usage().rss);
        await sleep(Math.max(0, next - performance.now()));
      }
    })(),
    (async () => {
      while (!done) {
        const { ms, status } = await chat(target);
        if (status === 200) chats.push(ms);
        else {
          chatFailed++;
          chatFailedMax = Math.max(chatFailedMax, ms);
        }
        await sleep(CHAT_PAUSE_MS);
      }
    })(),
    finished,
  ]);
  const after = usage();
  const elapsed = (performance.now() - started) / 1000;
  probes.sort((a, b) => a - b);
  chats.sort((a, b) => a - b);
  const row: Row = {
    name,
    probes: probes.length,
    p50: percentile(probes, 0.5),
    p99: percentile(probes, 0.99),
    max: probes.at(-1) ?? NaN,
    chats: chats.length,
    chatP50: percentile(chats, 0.5),
    chatP99: percentile(chats, 0.99),
    chatFailed,
    chatFailedMax,
    cpu: (after.cpu - before.cpu) / elapsed,
    rssStart: before.rss,
    rssPeak,
    load: result
      ? [
          ...Object.entries(result.statuses).map(([status, n]) => `${n}×${status}`),
          ...Object.entries(result.notes).map(([key, value]) => `${key} ${value}`),
        ].join(", ")
      : note,
  };
  rows.push(row);
  console.log(
    `${name}: settled in ${settled.toFixed(1)} s; healthz p50 ${row.p50.toFixed(1)} ms, p99 ${row.p99.toFixed(1)}, ` +
      `max ${row.max.toFixed(1)} at ${worst.at.toFixed(1)} s (${row.probes} probes); chat p50 ${row.chatP50.toFixed(0)} ms, ` +
      `p99 ${row.chatP99.toFixed(0)} (${row.chats} ok, ${chatFailed} failed${chatFailed ? `, slowest ${chatFailedMax.toFixed(0)} ms` : ""}); server ${row.cpu.toFixed(2)} cores, ` +
      `RSS ${row.rssStart.toFixed(0)} → ${row.rssPeak.toFixed(0)} MB${row.load ? `; ${row.load}` : ""}`,
  );
}

const base = { url: server.url, seconds };
// Loads the chat model before anything is measured.
await chat();
if (only.has("baseline")) await measure("baseline");
if (only.has("keys"))
  await measure("1,000 wrong keys", {
    ...base,
    kind: "keys",
    total: 1000,
    concurrency: 50,
    from: "127.0.0.2",
  });
if (only.has("wrongThenValid"))
  await measure("20 wrong keys, then a valid one, from one address", {
    ...base,
    kind: "wrongThenValid",
    key: NAT_KEY,
    wrong: 20,
  });
if (only.has("slow")) {
  const dataset = await call<{ id: string }>(server, "POST", "/conduit/dataset", { name: "slow" });
  await measure("200 slow bodies", {
    ...base,
    // Long enough for the server's cut (30 s at under 1 KiB/s) to show.
    seconds: Math.max(seconds, 40),
    kind: "slow",
    key: BENCH_KEY,
    count: 200,
    datasetId: dataset.id,
  });
}
if (only.has("training") || only.has("followers")) {
  const dataset = await call<{ id: string }>(server, "POST", "/conduit/dataset", { name: "train" });
  const pairs = Array.from({ length: 200 }, (_, i) => ({
    input: `Once upon a time there was a cat number ${i}.`,
    output: `The cat number ${i} liked to play in the sun.`,
  }));
  await call(server, "POST", `/conduit/dataset/${dataset.id}/upload`, { name: "p.jsonl", ioPairs: pairs });
  // Steps enough to stay RUNNING through both scenarios; cancelled afterwards.
  const run = await call<{ id: string }>(server, "POST", "/conduit/finetuning", {
    datasetID: dataset.id,
    baseModelName: "trainee",
    epochs: 1000,
    steps: 1_000_000,
    lr: 0.0005,
    loraRank: 4,
  });
  for (;;) {
    const state = await call<{ status: string; stats: { step?: number }; logs: string[] }>(
      server,
      "GET",
      `/conduit/finetuning/${run.id}`,
    );
    if (state.status === "RUNNING" && (state.stats.step ?? 0) > 0) break;
    if (state.status !== "QUEUED" && state.status !== "RUNNING")
      throw new Error(`the run is ${state.status}:\n${state.logs.join("\n")}`);
    await sleep(500);
  }
  if (only.has("training")) await measure("training, no followers");
  if (only.has("followers"))
    await measure(`${followerCount} followers of the run`, {
      ...base,
      kind: "followers",
      key: BENCH_KEY,
      path: `/conduit/finetuning/${run.id}/events`,
      count: followerCount,
      beyond: 20,
    });
  const state = await call<{ status: string; stats: { step?: number } }>(
    server,
    "GET",
    `/conduit/finetuning/${run.id}`,
  );
  console.log(`the run was ${state.status} at step ${state.stats.step}; cancelling it`);
  await call(server, "POST", `/conduit/finetuning/${run.id}/cancel`);
}

if (only.has("enum"))
  await measure("100,000-value enum", {
    ...base,
    kind: "enum",
    key: BENCH_KEY,
    concurrency: 1,
    values: 100_000,
  });
/** An eval of the bench user's on `items`, with `graders`; returns its id. */
async function makeEval(items: { input: string; expected: string }[], graders: unknown[]): Promise<string> {
  return (
    await call<{ id: string }>(server, "POST", "/conduit/evals", {
      source: { type: "items", items },
      graders,
    })
  ).id;
}

interface EvalRunState {
  id: string;
  status: string;
  error: string | null;
  progress: { completed: number; total: number };
}

/** Starts a run of an eval on the tiny model. */
const startEvalRun = (evalId: string, maxTokens: number) =>
  call<EvalRunState>(server, "POST", `/conduit/evals/${evalId}/runs`, {
    models: ["tiny"],
    maxTokens,
    parallel: 8,
  });
const evalRunState = (evalId: string, runId: string) =>
  call<EvalRunState>(server, "GET", `/conduit/evals/${evalId}/runs/${runId}`);

/** Runs the eval again and again for `seconds`; a note of the answers scored, and the grader errors among them. */
function evalRunsFor(evalId: string, maxTokens: number) {
  return async () => {
    const deadline = Date.now() + seconds * 1000;
    let runs = 0;
    let answers = 0;
    let graderErrors = 0;
    let failed = "";
    while (Date.now() < deadline) {
      const run = await startEvalRun(evalId, maxTokens);
      let state = run;
      while (!["COMPLETED", "FAILED", "CANCELLED"].includes(state.status)) {
        await sleep(250);
        state = await evalRunState(evalId, run.id);
        if (Date.now() > deadline + 30_000) break;
      }
      if (state.status !== "COMPLETED") failed = `${state.status} ${state.error ?? ""}`;
      runs++;
      answers += state.progress.completed;
      const results = await call<{ scores: { error?: string }[] }[]>(
        server,
        "GET",
        `/conduit/evals/${evalId}/runs/${run.id}/results?limit=10000`,
      );
      graderErrors += results.filter((r) => r.scores.some((score) => score.error !== undefined)).length;
    }
    return `${runs} eval runs, ${answers} answers scored, ${graderErrors} with a grader error${failed ? `; last not completed: ${failed}` : ""}`;
  };
}

if (only.has("redos")) {
  const items = Array.from({ length: 64 }, (_, i) => ({ input: `Say something ${i}`, expected: "a" }));
  const evalId = await makeEval(items, [
    { type: "regex", pattern: "^([\\s\\S]+)+\\u0000$" },
    { type: "regex", name: "as", pattern: "(a+)+$" },
  ]);
  await measure("ReDoS regex graders", evalRunsFor(evalId, 48));
}
if (only.has("fuzzy")) {
  const reference = "the quick brown fox jumps over the lazy dog ".repeat(2300).slice(0, 100_000);
  const items = Array.from({ length: 4 }, (_, i) => ({
    input: `Tell me a long story ${i}`,
    expected: reference,
  }));
  const evalId = await makeEval(items, [{ type: "similarity", metric: "fuzzy_match" }]);
  await measure("fuzzy_match, 100,000-character references", evalRunsFor(evalId, 256));
}
if (only.has("evalFollowers")) {
  const items = Array.from({ length: 5000 }, (_, i) => ({ input: `Question ${i}`, expected: "answer" }));
  const evalId = await makeEval(items, [{ type: "exact_match" }]);
  // 5,000 answers of up to 64 tokens: it runs through both windows.
  const run = await startEvalRun(evalId, 64);
  /** The eval run's answers per second while `work` runs. */
  const rate = (work: () => Promise<string>) => async () => {
    const start = (await evalRunState(evalId, run.id)).progress.completed;
    const began = performance.now();
    const text = await work();
    const done = (await evalRunState(evalId, run.id)).progress.completed;
    return `${text}${text ? "; " : ""}the eval answered ${((done - start) / ((performance.now() - began) / 1000)).toFixed(1)}/s`;
  };
  await measure(
    "eval running, no followers",
    rate(async () => (await sleep(seconds * 1000), "")),
  );
  const path = `/conduit/evals/${evalId}/runs/${run.id}/events`;
  await measure(
    "32 followers of the eval run",
    rate(
      () =>
        new Promise<string>((resolve, reject) => {
          const child = fork(new URL("./lib/hostileLoad.ts", import.meta.url), {
            execArgv: ["--import", "tsx"],
            stdio: "inherit",
          });
          let result: LoadResult | undefined;
          child.once("message", (message) => (result = message as LoadResult));
          child.once("exit", (code) =>
            result
              ? resolve(
                  [
                    ...Object.entries(result.statuses).map(([status, n]) => `${n}×${status}`),
                    ...Object.entries(result.notes).map(([key, value]) => `${key} ${value}`),
                  ].join(", "),
                )
              : reject(new Error(`the load process exited with ${code}`)),
          );
          child.send({
            ...base,
            kind: "followers",
            key: BENCH_KEY,
            path,
            count: 32,
            beyond: 0,
          } satisfies Scenario);
        }),
    ),
  );
  await call(server, "POST", `/conduit/evals/${evalId}/runs/${run.id}/cancel`).catch(() => undefined);
}
if (only.has("database")) {
  const cleanups: (() => unknown)[] = [];
  const postgres = await privatePostgres({ after: (fn) => cleanups.push(fn) });
  if (typeof postgres === "string") console.log(`database: skipped (${postgres})`);
  else {
    const other = await startConduit(
      { tiny, trainee: tiny },
      {
        DATABASE_URL: postgres.url,
        CONDUIT_API_KEYS: `${BENCH_KEY}:bench,${CHAT_KEY}:chat`,
        CONDUIT_DEFAULT_MODEL: "tiny",
      },
    );
    await chat(other);
    // What must still be there after: a dataset with its pairs, and a run that trains through the outage.
    const dataset = await call<{ id: string }>(other, "POST", "/conduit/dataset", { name: "kept" });
    const pairs = Array.from({ length: 20 }, (_, i) => ({ input: `in ${i}`, output: `out ${i}` }));
    await call(other, "POST", `/conduit/dataset/${dataset.id}/upload`, { name: "p.jsonl", ioPairs: pairs });
    const run = await call<{ id: string }>(other, "POST", "/conduit/finetuning", {
      datasetID: dataset.id,
      baseModelName: "trainee",
      epochs: 200,
    });
    await measure(
      "PostgreSQL: every connection ended, then a restart",
      async () => {
        await sleep(3000);
        const ended = await postgres.terminateAll();
        await sleep(5000);
        await postgres.stop();
        await sleep(6000);
        await postgres.start();
        await sleep(Math.max(0, seconds * 1000 - 14_000));
        let state = await call<{ status: string; logs: string[] }>(
          other,
          "GET",
          `/conduit/finetuning/${run.id}`,
        );
        for (
          const deadline = Date.now() + 300_000;
          !["READY", "FAILED", "CANCELLED"].includes(state.status);
        ) {
          if (Date.now() > deadline) break;
          await sleep(500);
          state = await call(other, "GET", `/conduit/finetuning/${run.id}`);
        }
        const attempts = state.logs.filter((line) => line.includes("training started on")).length;
        const kept = await call<{ ioPairsCount: number }>(other, "GET", `/conduit/dataset/${dataset.id}`);
        return `${ended} connections ended; after: the run ${state.status} in ${attempts} attempt(s), the dataset's ${kept.ioPairsCount} pairs kept`;
      },
      other,
    );
    other.stop();
    for (const cleanup of cleanups.reverse()) await cleanup();
  }
}

const ms = (value: number) => (Number.isNaN(value) ? "–" : value.toFixed(value < 10 ? 1 : 0));
console.log(
  `\n| scenario | /healthz p50 / p99 / max (ms) | chat p50 / p99 (ms), failed (slowest) | server CPU (cores) | server RSS (MB) | the load's answers |`,
);
console.log("|---|---|---|---|---|---|");
for (const row of rows)
  console.log(
    `| ${row.name} | ${ms(row.p50)} / ${ms(row.p99)} / ${ms(row.max)} | ${ms(row.chatP50)} / ${ms(row.chatP99)}, ` +
      `${row.chatFailed}${row.chatFailed ? ` (${ms(row.chatFailedMax)})` : ""} | ${row.cpu.toFixed(2)} | ${row.rssStart.toFixed(0)} → ${row.rssPeak.toFixed(0)} | ${row.load} |`,
  );
// A server still busy with a request may take long to stop: 10 s, then SIGKILL.
server.stop();
const killer = setTimeout(() => server.child.kill("SIGKILL"), 10_000);
if (server.child.exitCode === null && server.child.signalCode === null)
  await new Promise((resolve) => server.child.once("exit", resolve));
clearTimeout(killer);
await dropSchema();
process.exit(0);
