/**
 * API overhead benchmark. Conduit's routes against a bare Fastify route in the same run
 * (ratios), and a 100 MB JSONL upload (MB/s, peak RSS growth of the server).
 *
 *   node --import tsx bench/api.ts [--seconds 3] [--rounds 5] [--upload-mb 100]
 *
 * Each round measures the bare route and Conduit's back to back, `--seconds` each, so a ratio compares the
 * same moments of a shared machine; the median of the rounds' ratios is reported.
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
  options: {
    seconds: { type: "string", default: "3" },
    rounds: { type: "string", default: "5" },
    "upload-mb": { type: "string", default: "100" },
  },
});
const seconds = Number(values.seconds);
const rounds = Number(values.rounds);
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

// The run reads a small dataset of its own: the uploaded one holds more pairs than a run may (CONDUIT_MAX_RUN_PAIRS).
const small = (await (
  await fetch(`${conduit}/conduit/dataset`, {
    method: "POST",
    headers,
    body: '{"name":"small"}',
  })
).json()) as { id: string };
await fetch(`${conduit}/conduit/dataset/${small.id}/upload`, {
  method: "POST",
  headers,
  body: JSON.stringify({ name: "one.jsonl", ioPairs: [{ input: "a", output: "b" }] }),
});
const run = (await (
  await fetch(`${conduit}/conduit/finetuning`, {
    method: "POST",
    headers,
    // Explicit settings: "auto" reads the model, and "m" is an empty file.
    body: JSON.stringify({ datasetID: small.id, baseModelName: "m", epochs: 1, lr: 0.001, loraRank: 8 }),
  })
).json()) as { id?: string };
if (!run.id) throw new Error(`creating the run failed: ${JSON.stringify(run)}`);

type Load = Awaited<ReturnType<typeof load>>;
const median = (xs: number[]) => [...xs].sort((x, y) => x - y)[Math.floor(xs.length / 2)] as number;
/** `rounds` rounds of the bare route then Conduit's (the order alternating); the median ratio and its round. */
async function compare(bareRoute: () => Promise<Load>, conduitRoute: () => Promise<Load>) {
  const results: { bare: Load; conduit: Load; ratio: number }[] = [];
  for (let round = 0; round < rounds; round++) {
    const first = round % 2 === 0 ? await bareRoute() : await conduitRoute();
    const second = round % 2 === 0 ? await conduitRoute() : await bareRoute();
    const [bare, conduit] = round % 2 === 0 ? [first, second] : [second, first];
    results.push({ bare, conduit, ratio: conduit.rps / bare.rps });
  }
  const ratios = results.map((r) => r.ratio);
  const middle = results.find((r) => r.ratio === median(ratios))!;
  const errors = results.reduce((n, r) => n + r.bare.errors + r.conduit.errors, 0);
  return { ...middle, ratios, errors };
}

const getRun = await compare(
  () => load(`${bare}/bare/${run.id}`, "GET"),
  () => load(`${conduit}/conduit/finetuning/${run.id}`, "GET"),
);
const postDataset = await compare(
  () => load(`${bare}/bare`, "POST", '{"name":"x"}'),
  () => load(`${conduit}/conduit/dataset`, "POST", '{"name":"x"}'),
);

const fmt = (n: number) => n.toFixed(0);
const report = (label: string, c: Awaited<ReturnType<typeof compare>>) =>
  `${label}${fmt(c.conduit.rps)} req/s, p99 ${c.conduit.p99} ms (bare Fastify ${fmt(c.bare.rps)} req/s, p99 ${c.bare.p99} ms) → ratio ${c.ratio.toFixed(2)} (median of ${c.ratios.map((r) => r.toFixed(2)).join(", ")})`;
console.log(
  `database: ${process.env.DATABASE_URL ? "postgres" : "sqlite"}, ${os.cpus().length} cores, ${rounds} rounds of ${seconds}s per route, 10 connections, load ${os.loadavg()[0]!.toFixed(1)}`,
);
console.log(report("GET  /conduit/finetuning/{id}: ", getRun));
console.log(report("POST /conduit/dataset:         ", postDataset));
console.log(
  `upload ${(size / 1024 / 1024).toFixed(0)} MB JSONL (${lines} pairs): ${(size / 1024 / 1024 / uploadSeconds).toFixed(1)} MB/s, peak RSS growth ${((after.hwm - before.rss) / 1024 / 1024).toFixed(1)} MB`,
);
if (getRun.errors + postDataset.errors > 0) console.log("warning: some requests failed");
child.send("stop");
