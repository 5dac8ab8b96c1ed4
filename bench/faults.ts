/**
 * Fault script: kills a real `conduit serve` with SIGKILL at random moments while it receives uploads,
 * trains and streams generations, restarts it on the same data dir, and checks after every restart,
 * straight against the SQLite database and the data dir, that nothing is inconsistent:
 *
 * - the database passes `PRAGMA integrity_check` and `foreign_key_check`;
 * - every file record has its blob, of the recorded size, with the recorded number of pairs;
 * - no blob under `blobs/files` lacks a record;
 * - every dataset's `ioPairsCount` is the sum of its files', every run's the count of its dataset;
 * - no run stays RUNNING once its lease has expired (the restarted scheduler re-queues or fails it);
 * - a READY run has its model file and no `work`/`checkpoint` directory; no directory is left of a
 *   FAILED, CANCELLED or deleted run, no `work` directory of a QUEUED one (the start sweep);
 * - no temp file survives the start sweep (`blobs/.tmp`, `*.tmp-<pid>` files of ended runs);
 * - the trainer child process does not outlive the killed server.
 *
 * The server is dead between a kill and its restart, so the script moves the modification time of
 * temp files an hour and a minute back before restarting: the restart is then "an hour later", when
 * the start sweep must treat them as a crash's leftovers (younger ones may be another server's
 * uploads in progress, so it keeps those). Nothing else is touched.
 *
 *   node --import tsx bench/faults.ts [--rounds 50] [--seed 1] [--max-kill-ms 8000]
 *
 * Prints one line per round and a summary: rounds, kills by phase (what was under way at the kill),
 * inconsistencies found (each named). Exits 1 if any was found.
 *
 * `--fault overwrite` leaves the server up and overwrites the model it serves instead, as an operator updating
 * a model does, each round in one of three ways: copied over in place (`cp`: truncated, then written in 64 KiB
 * pieces with pauses, so requests arrive while it is half written), truncated at a random length and a
 * complete file copied back a moment later (a copy that was interrupted, then redone), or a complete file
 * renamed over it (`mv`, the safe way). Each round swaps between two generated models of different shapes,
 * also served under their own ids for reference, while streams run, a request loop probes the model and LoRA
 * runs train on it. Counted as an inconsistency, besides the checks above: the server dying (a crash), an
 * answer that is neither version's, a request or stream cut while the server is up, any status but 200 or
 * `503 unavailable` (a file that does not load), an answer after the round from the version that is no longer
 * on disk, a model listing whose `size_bytes` is not the file's size.
 *
 *   node --import tsx bench/faults.ts --fault overwrite [--rounds 50] [--seed 1]
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import readline from "node:readline";
import { parseArgs } from "node:util";
import SqliteDatabase from "better-sqlite3";
import { createTinyModel } from "../src/model/tinyModel.ts";
import { BENCH_KEY, freePort, waitFor } from "./lib/conduitServer.ts";
import { repoRoot } from "./lib/reference.ts";

const { values } = parseArgs({
  options: {
    rounds: { type: "string", default: "50" },
    seed: { type: "string", default: "1" },
    "max-kill-ms": { type: "string", default: "8000" },
    fault: { type: "string", default: "kill" },
  },
});
const fault = values.fault;
if (fault !== "kill" && fault !== "overwrite") throw new Error(`--fault is kill or overwrite, not ${fault}`);
const rounds = Number(values.rounds);
const maxKillMs = Number(values["max-kill-ms"]);

// A small deterministic generator, so a seed replays the same schedule (timings still vary).
let state = Number(values.seed) >>> 0 || 1;
function random(): number {
  state ^= state << 13;
  state ^= state >>> 17;
  state ^= state << 5;
  return (state >>> 0) / 2 ** 32;
}
const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)] as T;

/** The scheduler's defaults (`src/train/Scheduler.ts`): a lease lasts 30 s, the queue is polled every 2 s. */
const LEASE_MS = 30_000;
const POLL_MS = 2_000;
/** Settle time after a restart before checking: one poll and a margin, so the first ticks have run. */
const SETTLE_MS = POLL_MS + 1_500;
/** The sweep interval the server runs with here. */
const SWEEP_MS = 3_000;

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-faults-"));
const blobsDir = path.join(dataDir, "blobs");
fs.mkdirSync(path.join(dataDir, "models"));
const modelFile = path.join(dataDir, "models", "tiny.gguf");
await createTinyModel(modelFile);
/** The overwrite rounds' versions of `tiny`: the generated model and a smaller one of another shape. */
const versions: Buffer[] = [];
if (fault === "overwrite") {
  const other = path.join(dataDir, "models", "tiny-v1.gguf");
  await createTinyModel(other, { seed: 2, embeddingLength: 32, blockCount: 1 });
  fs.copyFileSync(modelFile, path.join(dataDir, "models", "tiny-v0.gguf"));
  versions.push(fs.readFileSync(modelFile), fs.readFileSync(other));
}
const port = await freePort();
const url = `http://127.0.0.1:${port}`;
const auth = { authorization: `Bearer ${BENCH_KEY}` };

// Uploads: JSONL payloads of a few sizes, each with a known pair count (the size tells them apart).
function jsonl(pairs: number, width: number): Buffer {
  const lines: string[] = [];
  for (let i = 0; i < pairs; i++)
    lines.push(JSON.stringify({ input: `question ${i} ${"x".repeat(width)}`, output: `answer ${i}` }));
  return Buffer.from(lines.join("\n") + "\n");
}
const payloads = [jsonl(20_000, 200), jsonl(60_000, 250), jsonl(100_000, 280)].map((body) => ({
  body,
  pairs: body.toString().split("\n").filter(Boolean).length,
}));
const pairsBySize = new Map(payloads.map((p) => [p.body.length, p.pairs]));
const trainingPairs = jsonl(40, 10);
pairsBySize.set(trainingPairs.length, 40);

let server: ChildProcess | undefined;
/** What the server's log said (overwrite rounds): reloads of a changed model file, failed loads of one. */
const logged = { reloads: 0, failedLoads: 0 };
async function startServer(): Promise<ChildProcess> {
  const child = spawn(process.execPath, [path.join(repoRoot, "bin", "conduit.js"), "serve"], {
    env: {
      ...process.env,
      CONDUIT_DATA_DIR: dataDir,
      CONDUIT_PORT: String(port),
      CONDUIT_API_KEYS: `${BENCH_KEY}:bench`,
      CONDUIT_DEFAULT_MODEL: "tiny",
      // The overwrite rounds count the engine's reloads, logged at info.
      CONDUIT_LOG_LEVEL: fault === "overwrite" ? "info" : "warn",
      // Periodic sweeps run during the rounds too, not only the one at start.
      CONDUIT_SWEEP_INTERVAL_MS: String(SWEEP_MS),
    },
    stdio: ["ignore", fault === "overwrite" ? "pipe" : "ignore", "pipe"],
  });
  const log: string[] = [];
  child.stderr?.on("data", (chunk: Buffer) => log.push(chunk.toString()));
  if (child.stdout)
    readline.createInterface({ input: child.stdout }).on("line", (line) => {
      if (line.includes("loading the file again")) logged.reloads++;
      else if (line.includes("loading model 'tiny' failed")) logged.failedLoads++;
    });
  try {
    await waitFor(`${url}/healthz`, child, "conduit serve");
  } catch (error) {
    child.kill("SIGKILL");
    throw new Error(`${(error as Error).message}; its log ends:\n${log.join("").slice(-2000)}`);
  }
  return child;
}

/** Restarts the server; a start that fails is an inconsistency (the data dir must always open), retried twice. */
async function restart(round: number): Promise<ChildProcess> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startServer();
    } catch (error) {
      report(round, `the server did not start after the kill: ${(error as Error).message}`);
      if (attempt === 3) throw error;
    }
  }
}

async function api<T>(method: string, route: string, body?: unknown): Promise<T> {
  const response = await fetch(`${url}${route}`, {
    method,
    headers: body === undefined ? auth : { ...auth, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${route}: ${response.status} ${text}`);
  return JSON.parse(text) as T;
}

function upload(datasetId: string, name: string, body: Buffer, signal?: AbortSignal) {
  return fetch(`${url}/conduit/dataset/${datasetId}/upload?name=${name}`, {
    method: "POST",
    headers: { ...auth, "content-type": "application/jsonl" },
    body: new Uint8Array(body),
    signal,
  });
}

/** Child pids of a process (the trainer is the server's only child). */
function childrenOf(pid: number): number[] {
  try {
    return fs
      .readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8")
      .trim()
      .split(/\s+/)
      .filter(Boolean)
      .map(Number);
  } catch {
    return [];
  }
}
const alive = (pid: number) => fs.existsSync(`/proc/${pid}`) && !/^State:\s+Z/m.test(procStatus(pid));
function procStatus(pid: number): string {
  try {
    return fs.readFileSync(`/proc/${pid}/status`, "utf8");
  } catch {
    return "";
  }
}

function walk(dir: string): string[] {
  const out: string[] = [];
  for (const entry of fs.readdirSync(dir, { withFileTypes: true })) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory()) out.push(...walk(full));
    else out.push(full);
  }
  return out;
}

const time = (text: string | null) => (text === null ? NaN : Date.parse(`${text.replace(" ", "T")}Z`));

/** Checks the database and the data dir; returns what is wrong, one line each. */
function check(serverUpSince: number): string[] {
  const problems: string[] = [];
  const db = new SqliteDatabase(path.join(dataDir, "conduit.db"), { readonly: true, fileMustExist: true });
  try {
    const integrity = db.pragma("integrity_check", { simple: true });
    if (integrity !== "ok") problems.push(`integrity_check: ${String(integrity)}`);
    const foreign = db.pragma("foreign_key_check") as unknown[];
    if (foreign.length > 0) problems.push(`foreign_key_check: ${JSON.stringify(foreign)}`);

    const files = db.prepare("SELECT id, dataset_id, blob, size, io_pairs_count FROM files").all() as {
      id: string;
      dataset_id: string;
      blob: string;
      size: number;
      io_pairs_count: number;
    }[];
    const blobsInDb = new Set(files.map((f) => f.blob));
    for (const file of files) {
      const stat = fs.statSync(path.join(blobsDir, file.blob), { throwIfNoEntry: false });
      if (!stat) problems.push(`file ${file.id}: no blob at ${file.blob}`);
      else if (stat.size !== file.size)
        problems.push(`file ${file.id}: blob is ${stat.size} bytes, record says ${file.size}`);
      const expected = pairsBySize.get(file.size);
      if (expected !== file.io_pairs_count)
        problems.push(`file ${file.id}: ioPairsCount ${file.io_pairs_count}, the upload had ${expected}`);
    }
    const filesDir = path.join(blobsDir, "files");
    if (fs.existsSync(filesDir))
      for (const blob of walk(filesDir)) {
        const key = path.relative(blobsDir, blob);
        if (!blobsInDb.has(key)) problems.push(`blob ${key} has no file record`);
      }

    const datasets = db
      .prepare(
        "SELECT d.id, d.io_pairs_count AS counted, COALESCE(SUM(f.io_pairs_count), 0) AS summed " +
          "FROM datasets d LEFT JOIN files f ON f.dataset_id = d.id GROUP BY d.id",
      )
      .all() as { id: string; counted: number; summed: number }[];
    for (const d of datasets)
      if (d.counted !== d.summed)
        problems.push(`dataset ${d.id}: ioPairsCount ${d.counted}, its files hold ${d.summed}`);

    const runs = db
      .prepare(
        "SELECT r.id, r.status, r.updated_at, r.lease_expires_at, r.model_path, r.io_pairs_count, d.io_pairs_count AS dataset_pairs " +
          "FROM runs r LEFT JOIN datasets d ON d.id = r.dataset_id",
      )
      .all() as {
      id: string;
      status: string;
      updated_at: string;
      lease_expires_at: string | null;
      model_path: string | null;
      io_pairs_count: number;
      dataset_pairs: number | null;
    }[];
    const now = Date.now();
    for (const run of runs) {
      if (run.dataset_pairs !== null && run.io_pairs_count !== run.dataset_pairs)
        problems.push(
          `run ${run.id}: ioPairsCount ${run.io_pairs_count}, its dataset has ${run.dataset_pairs}`,
        );
      const expired = time(run.lease_expires_at);
      // The restarted scheduler's first tick (at listen) re-queues every lease that had expired by then;
      // later ones within a poll. Anything expired for longer than that, with the server up, is stuck.
      if (
        run.status === "RUNNING" &&
        (Number.isNaN(expired) || (expired < serverUpSince && now - expired > POLL_MS + 1_000))
      )
        problems.push(`run ${run.id}: RUNNING with a lease that expired ${now - expired} ms ago`);
      const dir = path.join(blobsDir, "runs", run.id);
      if (run.status === "READY") {
        if (!run.model_path || !fs.existsSync(run.model_path))
          problems.push(`run ${run.id}: READY without its model file ${run.model_path}`);
        for (const leftover of ["work", "checkpoint"])
          if (fs.existsSync(path.join(dir, leftover)))
            problems.push(`run ${run.id}: READY with its ${leftover} directory`);
        if (fs.existsSync(dir))
          for (const file of walk(dir))
            if (/\.tmp-\d+$/.test(file))
              problems.push(`run ${run.id}: temp file ${path.relative(dir, file)}`);
      }
      if (run.status === "QUEUED" && fs.existsSync(path.join(dir, "work")))
        problems.push(`run ${run.id}: QUEUED with a work directory after the start sweep`);
    }
    // A run that ended before the last sweep (at start, then every SWEEP_MS) has no directory left.
    const byId = new Map(runs.map((r) => [r.id, r]));
    const runsDir = path.join(blobsDir, "runs");
    if (fs.existsSync(runsDir))
      for (const id of fs.readdirSync(runsDir)) {
        const run = byId.get(id);
        const ended = run === undefined || run.status === "FAILED" || run.status === "CANCELLED";
        if (ended && (run === undefined || now - time(run.updated_at) > SWEEP_MS + 1_000))
          problems.push(`runs/${id}: directory of a ${run?.status ?? "deleted"} run`);
      }
    const temp = fs.existsSync(path.join(blobsDir, ".tmp"))
      ? fs.readdirSync(path.join(blobsDir, ".tmp"))
      : [];
    if (temp.length > 0) problems.push(`blobs/.tmp: ${temp.length} leftovers after the start sweep`);
  } finally {
    db.close();
  }
  return problems;
}

/**
 * Moves the modification time of temp files and of dataset file blobs (and their directories) an hour
 * and a minute back: "the restart is an hour later". Returns how many temp files the kill left.
 */
function ageLeftovers(): number {
  const then = new Date(Date.now() - 61 * 60_000);
  const temp = path.join(blobsDir, ".tmp");
  const names = fs.existsSync(temp) ? fs.readdirSync(temp) : [];
  for (const name of names) fs.utimesSync(path.join(temp, name), then, then);
  const files = path.join(blobsDir, "files");
  if (fs.existsSync(files))
    for (const dir of fs.readdirSync(files)) {
      for (const name of fs.readdirSync(path.join(files, dir)))
        fs.utimesSync(path.join(files, dir, name), then, then);
      fs.utimesSync(path.join(files, dir), then, then);
    }
  return names.length;
}

// Setup: a training dataset (uploads never go to it, so its runs' ioPairsCount stays right) and three
// upload datasets.
server = await startServer();
const training = await api<{ id: string }>("POST", "/conduit/dataset", { name: "training" });
if (!(await upload(training.id, "train.jsonl", trainingPairs)).ok) throw new Error("training upload failed");
const uploadSets: string[] = [];
for (let i = 0; i < 3; i++)
  uploadSets.push((await api<{ id: string }>("POST", "/conduit/dataset", { name: `up${i}` })).id);

const kills: Record<string, number> = { upload: 0, training: 0, generation: 0, deleting: 0, idle: 0 };
const inconsistencies: { round: number; problem: string }[] = [];
/** Records a problem once, in the round it was first seen (a leftover stays until something removes it). */
function report(round: number, problem: string): void {
  if (!inconsistencies.some((i) => i.problem === problem)) inconsistencies.push({ round, problem });
}
const outcomes = { uploadsDone: 0, uploadsCut: 0, runsCreated: 0, streamsCut: 0, streamsDone: 0 };
let orphanTrainers = 0;
const started = performance.now();

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** One round of the kill fault: a workload, a SIGKILL at a random moment, a restart. */
async function killRound(round: number): Promise<void> {
  // The workload: uploads, maybe a run, maybe a delete, generation streams; none awaited before the kill.
  const inFlight = { upload: 0, generation: 0, deleting: 0 };
  const track = (kind: keyof typeof inFlight, work: Promise<unknown>) => {
    inFlight[kind]++;
    void work.finally(() => inFlight[kind]--).catch(() => undefined);
  };
  for (let i = 0, n = 1 + Math.floor(random() * 2); i < n; i++) {
    const payload = pick(payloads);
    track(
      "upload",
      upload(pick(uploadSets), `r${round}-${i}.jsonl`, payload.body).then(
        async (response) => {
          await response.text();
          outcomes.uploadsDone++;
        },
        () => outcomes.uploadsCut++,
      ),
    );
  }
  if (random() < 0.6)
    await api("POST", "/conduit/finetuning", {
      datasetID: training.id,
      baseModelName: "tiny",
      epochs: 4,
    }).then(
      () => outcomes.runsCreated++,
      () => undefined,
    );
  if (random() < 0.4) {
    // Delete a file (keeps the upload datasets small), or an ended run.
    const work = (async () => {
      const ds = pick(uploadSets);
      const files = await api<{ id: string }[]>("GET", `/conduit/dataset/${ds}/files`);
      const oldest = files.at(-1);
      if (files.length > 2 && oldest) await api("DELETE", `/conduit/dataset/${ds}/file/${oldest.id}`);
      const runs = await api<{ id: string; status: string }[]>("GET", "/conduit/finetuning?limit=1000");
      const ended = runs.filter((r) => r.status === "READY" || r.status === "FAILED");
      if (ended.length > 3) await api("DELETE", `/conduit/finetuning/${pick(ended).id}`);
    })();
    track("deleting", work);
  }
  for (let i = 0, n = Math.floor(random() * 3); i < n; i++)
    track(
      "generation",
      fetch(`${url}/v1/chat/completions`, {
        method: "POST",
        headers: { ...auth, "content-type": "application/json" },
        body: JSON.stringify({
          model: "tiny",
          messages: [{ role: "user", content: `round ${round}` }],
          max_tokens: 400,
          stream: true,
        }),
      }).then(
        async (response) => {
          await response.text();
          outcomes.streamsDone++;
        },
        () => outcomes.streamsCut++,
      ),
    );

  await sleep(100 + random() * maxKillMs);
  const pid = server!.pid!;
  const trainers = childrenOf(pid);
  const phases = [
    ...(inFlight.upload > 0 ? ["upload"] : []),
    ...(trainers.length > 0 ? ["training"] : []),
    ...(inFlight.generation > 0 ? ["generation"] : []),
    ...(inFlight.deleting > 0 ? ["deleting"] : []),
  ];
  if (phases.length === 0) phases.push("idle");
  for (const phase of phases) kills[phase] = (kills[phase] ?? 0) + 1;
  const exited = new Promise((resolve) => server!.once("exit", resolve));
  server!.kill("SIGKILL");
  await exited;
  // The trainer must notice its parent is gone and stop (it would otherwise write into a re-queued run).
  const deadline = Date.now() + 10_000;
  while (trainers.some(alive) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  for (const trainer of trainers.filter(alive)) {
    orphanTrainers++;
    report(round, `trainer ${trainer} outlived the killed server by 10 s`);
    process.kill(trainer, "SIGKILL");
  }
  const aged = ageLeftovers();
  console.log(
    `round ${round}: killed during ${phases.join("+")}; ${aged} temp files left by the kill; ` +
      `${inconsistencies.filter((i) => i.round === round).length} inconsistencies at its start`,
  );
  server = await restart(round);
}

// ---- The overwrite fault ----
const overwrites: Record<string, number> = { cp: 0, truncate: 0, rename: 0 };
const probes = { answered: [0, 0], refused: 0, listings: 0 };
const streams = { done: 0, refused: 0, endedWithError: 0 };
const crashes: string[] = [];
let truncatedRefused = 0;
const rss = { startMiB: 0, maxMiB: 0, endMiB: 0 };
/** What each version answers (greedy, the same prompt), asked under its own id. */
const answers: string[] = [];
/** Which version is in `tiny.gguf` now. */
let onDisk = 0;

const serverUp = () => server !== undefined && server.exitCode === null && server.signalCode === null;

async function complete(model: string): Promise<{ status: number; text?: string; code?: string }> {
  const response = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { ...auth, "content-type": "application/json" },
    body: JSON.stringify({ model, prompt: "Once upon a time", max_tokens: 16, temperature: 0 }),
  });
  const body = (await response.json()) as { choices?: { text: string }[]; error?: { code: string } };
  return { status: response.status, text: body.choices?.[0]?.text, code: body.error?.code };
}

function rssMiB(pid: number): number {
  return Number(/^VmRSS:\s+(\d+) kB/m.exec(procStatus(pid))?.[1] ?? 0) / 1024;
}

/** `GET /v1/models`, which reads every model file's header: a half-written one must not fail it. */
async function listModels(): Promise<{ data: { id: string; size_bytes: number | null }[] }> {
  const listed = await api<{ data: { id: string; size_bytes: number | null }[] }>("GET", "/v1/models");
  probes.listings++;
  return listed;
}

/** A request's outcome while the file may be anything: either version's answer, or a 503 for a file that does not load. */
function checkProbe(round: number, outcome: { status: number; text?: string; code?: string }): void {
  const version = outcome.status === 200 ? answers.indexOf(outcome.text ?? "") : -1;
  if (version !== -1) probes.answered[version]!++;
  else if (outcome.status === 503 && outcome.code === "unavailable") probes.refused++;
  else report(round, `a request answered ${outcome.status} ${outcome.code ?? JSON.stringify(outcome.text)}`);
}

/** A streamed chat on `tiny`: it must end with `[DONE]` or an error event, or be refused with a 503. */
async function stream(round: number): Promise<void> {
  let status: number;
  let text: string;
  try {
    const response = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { ...auth, "content-type": "application/json" },
      body: JSON.stringify({
        model: "tiny",
        messages: [{ role: "user", content: `round ${round}` }],
        max_tokens: 300,
        stream: true,
      }),
    });
    status = response.status;
    text = await response.text();
  } catch (error) {
    // A server that died says so on exit, a moment after its connections failed.
    await Promise.race([once(server!, "exit"), sleep(2000)]);
    if (serverUp()) report(round, `a stream was cut with the server up: ${(error as Error).message}`);
    return;
  }
  if (status === 503) streams.refused++;
  else if (status !== 200) report(round, `a stream answered ${status}: ${text.slice(0, 200)}`);
  else if (/data: \[DONE\]\s*$/.test(text)) streams.done++;
  else if (/data: \{"error"[^\n]*\s*$/.test(text)) streams.endedWithError++;
  else report(round, `a stream ended without [DONE] or an error event: ...${text.slice(-200)}`);
}

/** Puts version `target` in place of `tiny.gguf` the way `kind` does. */
async function overwrite(round: number, kind: string, target: number): Promise<void> {
  const bytes = versions[target]!;
  if (kind === "cp") {
    // Like `cp`: the same file truncated, then written a piece at a time (a big model takes seconds).
    const fd = fs.openSync(modelFile, "w");
    try {
      for (let at = 0; at < bytes.length; at += 65_536) {
        fs.writeSync(fd, bytes, at, Math.min(65_536, bytes.length - at));
        await sleep(random() * 20);
      }
    } finally {
      fs.closeSync(fd);
    }
  } else if (kind === "truncate") {
    // A copy cut short, then done again. A request meanwhile must be refused, not answered by the old weights.
    fs.truncateSync(modelFile, Math.floor(random() * fs.statSync(modelFile).size));
    const meanwhile = await complete("tiny").catch((error: Error) => ({ status: 0, code: error.message }));
    if (meanwhile.status !== 503 || meanwhile.code !== "unavailable")
      report(round, `a truncated model file was answered ${meanwhile.status} ${meanwhile.code ?? ""}`);
    else truncatedRefused++;
    await sleep(100 + random() * 500);
    fs.writeFileSync(modelFile, bytes);
  } else {
    // The safe way: a complete file renamed over the old one. Its name does not end in .gguf: not a model.
    fs.writeFileSync(`${modelFile}.tmp`, bytes);
    fs.renameSync(`${modelFile}.tmp`, modelFile);
  }
}

/** One round of the overwrite fault: streams, maybe a run, a request loop, and `tiny.gguf` replaced under them. */
async function overwriteRound(round: number): Promise<void> {
  const work: Promise<unknown>[] = [];
  for (let i = 0, n = Math.floor(random() * 3); i < n; i++) work.push(stream(round));
  if (random() < 0.3)
    await api("POST", "/conduit/finetuning", {
      datasetID: training.id,
      baseModelName: "tiny",
      epochs: 2,
    }).then(
      () => outcomes.runsCreated++,
      (error: Error) => report(round, `a run was refused: ${error.message}`),
    );
  let probing = true;
  // Requests for the model and listings of the models directory, one after another, while the file changes.
  const prober = (async () => {
    for (let i = 0; probing && serverUp(); i++)
      await (
        i % 4 === 3 ? listModels() : complete("tiny").then((outcome) => checkProbe(round, outcome))
      ).catch(async (error: Error) => {
        await Promise.race([once(server!, "exit"), sleep(2000)]);
        if (serverUp()) report(round, `a request failed with the server up: ${error.message}`);
      });
  })();
  await sleep(50 + random() * 450);
  const kind = pick(["cp", "truncate", "rename"]);
  overwrites[kind]!++;
  const target = 1 - onDisk;
  await overwrite(round, kind, target);
  onDisk = target;
  probing = false;
  await prober;
  await Promise.all(work);

  // The file is complete now: the next request is answered by it, and the listing shows it.
  try {
    const after = await complete("tiny");
    if (after.status !== 200 || after.text !== answers[onDisk])
      report(
        round,
        `after a ${kind} to version ${onDisk}: ${after.status} ${JSON.stringify(after.text)}` +
          (after.text === answers[1 - onDisk] ? " (the old version's answer)" : ""),
      );
    const listed = await listModels();
    const size = listed.data.find((m) => m.id === "tiny")?.size_bytes;
    if (size !== versions[onDisk]!.length)
      report(round, `GET /v1/models says tiny has ${size} bytes, the file ${versions[onDisk]!.length}`);
    rss.maxMiB = Math.max(rss.maxMiB, rssMiB(server!.pid!));
  } catch (error) {
    // A server that died says so on exit, a moment after its connections failed.
    await Promise.race([once(server!, "exit"), sleep(2000)]);
    if (serverUp()) report(round, `after a ${kind}: ${(error as Error).message}`);
  }
  if (!serverUp()) {
    const how = server!.signalCode ?? `exit code ${server!.exitCode}`;
    crashes.push(`round ${round}: ${how} during a ${kind}`);
    report(round, `the server died (${how}) during a ${kind}`);
    server = await restart(round);
  }
  console.log(
    `round ${round}: ${kind} to version ${onDisk}; ` +
      `${inconsistencies.filter((i) => i.round === round).length} inconsistencies`,
  );
}

if (fault === "overwrite") {
  answers.push((await complete("tiny-v0")).text ?? "", (await complete("tiny-v1")).text ?? "");
  if (answers[0] === answers[1] || (await complete("tiny")).text !== answers[0])
    throw new Error(
      `the two versions must answer differently, and tiny as version 0: ${JSON.stringify(answers)}`,
    );
  rss.startMiB = rssMiB(server.pid!);
}

for (let round = 1; round <= rounds; round++) {
  const upSince = Date.now();
  await sleep(SETTLE_MS);
  for (const problem of check(upSince)) report(round, problem);
  if (fault === "kill") await killRound(round);
  else await overwriteRound(round);
}

// Last: wait out every lease the last kill left (and the overwrite rounds' runs), check again, then a graceful
// stop must release runs.
const upSince = Date.now();
await sleep(fault === "kill" ? LEASE_MS + SETTLE_MS : SETTLE_MS);
if (fault === "overwrite") {
  const deadline = Date.now() + 300_000;
  const busy = async () =>
    (await api<{ status: string }[]>("GET", "/conduit/finetuning?limit=1000")).some(
      (r) => r.status === "QUEUED" || r.status === "RUNNING",
    );
  while ((await busy()) && Date.now() < deadline) await sleep(1000);
  rss.endMiB = rssMiB(server.pid!);
}
for (const problem of check(upSince)) report(rounds + 1, problem);
const stopped = new Promise((resolve) => server!.once("exit", resolve));
const stopStarted = Date.now();
server.kill("SIGTERM");
await stopped;
const stopMs = Date.now() - stopStarted;
const db = new SqliteDatabase(path.join(dataDir, "conduit.db"), { readonly: true });
const byStatus = db.prepare("SELECT status, COUNT(*) AS n FROM runs GROUP BY status").all() as {
  status: string;
  n: number;
}[];
const fileCount = (db.prepare("SELECT COUNT(*) AS n FROM files").get() as { n: number }).n;
const failures = db
  .prepare("SELECT error, COUNT(*) AS n FROM runs WHERE status = 'FAILED' GROUP BY error")
  .all() as { error: string; n: number }[];
db.close();
if (byStatus.some((s) => s.status === "RUNNING"))
  report(rounds + 1, "a run is still RUNNING after a graceful stop");

console.log("\n# Fault script summary");
if (fault === "kill") {
  console.log(
    `rounds: ${rounds} (seed ${values.seed}, kill 0.1–${maxKillMs / 1000} s into each round's work)`,
  );
  console.log(`kills by phase (a kill can hit several): ${JSON.stringify(kills)}`);
  console.log(
    `work: ${outcomes.uploadsDone} uploads answered, ${outcomes.uploadsCut} cut by a kill; ${outcomes.runsCreated} runs created; ` +
      `${outcomes.streamsDone} streams ended, ${outcomes.streamsCut} cut`,
  );
} else {
  console.log(`rounds: ${rounds} (seed ${values.seed}); overwrites by kind: ${JSON.stringify(overwrites)}`);
  console.log(`crashes: ${crashes.length}${crashes.length > 0 ? ` (${crashes.join("; ")})` : ""}`);
  console.log(
    `requests while the file changed: ${probes.answered[0]} answered by version 0, ${probes.answered[1]} by version 1, ` +
      `${probes.refused} refused with 503 (the file did not load); after a truncate, ${truncatedRefused} of ` +
      `${overwrites.truncate} requests refused with 503 as they must be; ${probes.listings} listings answered`,
  );
  console.log(
    `streams: ${streams.done} ended with [DONE], ${streams.endedWithError} with an error event, ${streams.refused} refused with 503`,
  );
  console.log(
    `the server's log: ${logged.reloads} reloads of a changed file, ${logged.failedLoads} failed loads`,
  );
  console.log(
    `server RSS: ${rss.startMiB.toFixed(0)} MiB after the first answers, at most ${rss.maxMiB.toFixed(0)} after a round, ` +
      `${rss.endMiB.toFixed(0)} at the end`,
  );
  console.log(`runs: ${outcomes.runsCreated} created`);
  for (const { error, n } of failures) console.log(`  FAILED ×${n}: ${error}`);
}
console.log(
  `end state: ${fileCount} files; runs ${JSON.stringify(Object.fromEntries(byStatus.map((s) => [s.status, s.n])))}`,
);
console.log(`graceful stop at the end: ${stopMs} ms; trainers that outlived a kill: ${orphanTrainers}`);
console.log(`elapsed: ${((performance.now() - started) / 60_000).toFixed(1)} min`);
console.log(`inconsistencies found: ${inconsistencies.length}`);
for (const { round, problem } of inconsistencies) console.log(`  round ${round}: ${problem}`);
fs.rmSync(dataDir, { recursive: true, force: true });
process.exit(inconsistencies.length > 0 ? 1 : 0);
