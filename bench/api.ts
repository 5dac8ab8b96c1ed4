/**
 * API overhead benchmark. Conduit's routes against a bare Fastify route in the same run
 * (ratios), and a 100 MB JSONL upload (MB/s, peak RSS growth of the server).
 *
 *   node --import tsx bench/api.ts [--seconds 10] [--upload-mb 100]
 *
 * Set DATABASE_URL to measure on PostgreSQL instead of the embedded SQLite.
 */
import { fork } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import autocannon from "autocannon";

const { values } = parseArgs({
  options: { seconds: { type: "string", default: "10" }, "upload-mb": { type: "string", default: "100" } },
});
const seconds = Number(values.seconds);
const uploadMb = Number(values["upload-mb"]);
const key = "bench-key-0000000000";
const headers = { "x-api-key": key, "content-type": "application/json" };

const child = fork(new URL("./apiServer.ts", import.meta.url), {
  execArgv: ["--import", "tsx"],
  stdio: "inherit",
});
const ports = await new Promise<{ conduit: number; bare: number }>((resolve) =>
  child.once("message", (m) => resolve(m as never)),
);
const conduit = `http://127.0.0.1:${ports.conduit}`;
const bare = `http://127.0.0.1:${ports.bare}`;

function memory(pid: number): { rss: number; hwm: number } {
  const status = fs.readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (name: string) => Number(status.match(new RegExp(`${name}:\\s+(\\d+)`))?.[1] ?? 0) * 1024;
  return { rss: kb("VmRSS"), hwm: kb("VmHWM") };
}

async function load(url: string, method: "GET" | "POST", body?: string) {
  const result = await autocannon({ url, method, headers, body, connections: 10, duration: seconds });
  return { rps: result.requests.average, p99: result.latency.p99, errors: result.errors + result.non2xx };
}

// Upload first, so the peak RSS it reaches is not hidden by an earlier phase.
const dataset = (await (
  await fetch(`${conduit}/conduit/dataset`, { method: "POST", headers, body: '{"name":"bench"}' })
).json()) as { id: string };
const file = path.join(os.tmpdir(), `conduit-bench-${process.pid}.jsonl`);
const line =
  JSON.stringify({
    input: "Translate to French: the cat sits on the mat ".repeat(3),
    output: "le chat est assis sur le tapis ".repeat(3),
  }) + "\n";
const lines = Math.ceil((uploadMb * 1024 * 1024) / Buffer.byteLength(line));
fs.writeFileSync(file, line.repeat(lines));
const size = fs.statSync(file).size;
const before = memory(child.pid!);
const started = performance.now();
const upload = await fetch(`${conduit}/conduit/dataset/${dataset.id}/upload?name=big.jsonl`, {
  method: "POST",
  headers: { "x-api-key": key, "content-type": "application/jsonl" },
  body: fs.createReadStream(file) as unknown as ReadableStream,
  duplex: "half",
} as RequestInit);
const uploadSeconds = (performance.now() - started) / 1000;
const uploaded = (await upload.json()) as { ioPairsCount?: number };
const after = memory(child.pid!);
fs.rmSync(file);
if (upload.status !== 200 || uploaded.ioPairsCount !== lines)
  throw new Error(`upload failed: ${upload.status} ${JSON.stringify(uploaded)}`);

const run = (await (
  await fetch(`${conduit}/conduit/finetuning`, {
    method: "POST",
    headers,
    // Explicit settings: "auto" reads the model, and "m" is an empty file.
    body: JSON.stringify({ datasetID: dataset.id, baseModelName: "m", epochs: 1, lr: 0.001, loraRank: 8 }),
  })
).json()) as { id?: string };
if (!run.id) throw new Error(`creating the run failed: ${JSON.stringify(run)}`);

const bareGet = await load(`${bare}/bare/${run.id}`, "GET");
const getRun = await load(`${conduit}/conduit/finetuning/${run.id}`, "GET");
const barePost = await load(`${bare}/bare`, "POST", '{"name":"x"}');
const postDataset = await load(`${conduit}/conduit/dataset`, "POST", '{"name":"x"}');

const fmt = (n: number) => n.toFixed(0);
console.log(
  `database: ${process.env.DATABASE_URL ? "postgres" : "sqlite"}, ${os.cpus().length} cores, ${seconds}s per phase, 10 connections`,
);
console.log(
  `GET  /conduit/finetuning/{id}: ${fmt(getRun.rps)} req/s, p99 ${getRun.p99} ms (bare Fastify ${fmt(bareGet.rps)} req/s, p99 ${bareGet.p99} ms) → ratio ${(getRun.rps / bareGet.rps).toFixed(2)}`,
);
console.log(
  `POST /conduit/dataset:         ${fmt(postDataset.rps)} req/s, p99 ${postDataset.p99} ms (bare Fastify ${fmt(barePost.rps)} req/s, p99 ${barePost.p99} ms) → ratio ${(postDataset.rps / barePost.rps).toFixed(2)}`,
);
console.log(
  `upload ${(size / 1024 / 1024).toFixed(0)} MB JSONL (${lines} pairs): ${(size / 1024 / 1024 / uploadSeconds).toFixed(1)} MB/s, peak RSS growth ${((after.hwm - before.rss) / 1024 / 1024).toFixed(1)} MB`,
);
if (getRun.errors + postDataset.errors + bareGet.errors + barePost.errors > 0)
  console.log("warning: some requests failed");
child.send("stop");
