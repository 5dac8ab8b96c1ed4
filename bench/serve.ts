/**
 * The service end to end against raw llama.cpp, on the same GGUF file and thread count:
 *   - single stream: Conduit's `/v1/completions` (streamed and not) over `llama-bench` generation (tg);
 *   - 8 concurrent streams: Conduit's aggregate tokens/s over `llama-server -np 8`'s;
 *   - time to first token: Conduit's over `llama-server`'s (streamed, same prompt).
 * Both servers run as their own processes (`conduit serve` with `CONDUIT_PARALLEL=8`, `llama-server -np 8`)
 * and are driven by this process over loopback with the same requests (greedy, raw prompt, no chat
 * template). Needs `bash bench/setup.sh` first.
 *
 *   node --import tsx bench/serve.ts [stories260K|smollm2-135m|file.gguf] [--threads 1] [--tokens 120] [--runs 5]
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { createParser } from "eventsource-parser";
import { BENCH_KEY as KEY, freePort, startConduit, waitFor } from "./lib/conduitServer.ts";
import { modelPath, requireFile, toolPath, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    threads: { type: "string", default: "1" },
    tokens: { type: "string", default: "120" },
    runs: { type: "string", default: "5" },
    "prompt-threads": { type: "string" },
    "prompt-repeat": { type: "string", default: "1" },
  },
});
const threads = Number(values.threads);
const tokens = Number(values.tokens);
const runs = Number(values.runs);
/** Threads for prompt steps: `CONDUIT_PROMPT_THREADS` for Conduit, `-tb` for llama-server. */
const promptThreads = Number(values["prompt-threads"] ?? threads);
/** A longer prompt (the story opening repeated) makes time to first token mostly prompt evaluation. */
const promptText = Array.from({ length: Number(values["prompt-repeat"]) }, () => "Once upon a time").join(
  ", ",
);
const modelArg = positionals[0] ?? "stories260K";
const model = requireFile(
  modelArg.endsWith(".gguf") ? path.resolve(modelArg) : modelPath(modelArg as BenchModel),
);
const STREAMS = 8;
/**
 * Every request's prompt starts with a character no earlier request started with, so neither server can
 * reuse a cached prompt prefix (llama-server caches prompts per slot by default): each request pays for
 * its whole prompt, as a new user's would.
 */
const FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
let prompts = 0;
if (1 + runs * (STREAMS + 2) > FIRST.length)
  throw new Error(`--runs is at most ${Math.floor((FIRST.length - 1) / (STREAMS + 2))}`);
const prompt = () => `${FIRST[prompts++ % FIRST.length]}: ${promptText}`;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] ?? Number.NaN;
const fmt = (x: number) => (Number.isFinite(x) ? x.toFixed(x < 10 ? 2 : 0) : "n/a");

// ---- the two servers ----

async function startLlamaServer(contextPerSlot: number): Promise<{ url: string; child: ChildProcess }> {
  const port = await freePort();
  const child = spawn(
    requireFile(toolPath("llama-server")),
    [
      ...["-m", model, "--host", "127.0.0.1", "--port", String(port)],
      ...["-t", String(threads), "-tb", String(promptThreads), "-np", String(STREAMS)],
      ...["-c", String(contextPerSlot * STREAMS), "--no-webui", "--log-disable"],
    ],
    { stdio: ["ignore", "ignore", "ignore"] },
  );
  const url = `http://127.0.0.1:${port}`;
  await waitFor(`${url}/health`, child, "llama-server");
  return { url, child };
}

// ---- one request ----

interface Timing {
  /** Completion tokens, from the server's usage. */
  tokens: number;
  /** From sending the request to the first text (streamed) or to the whole answer. */
  firstMs: number;
  totalMs: number;
}

async function complete(url: string, prompt: string, stream: boolean): Promise<Timing> {
  const started = performance.now();
  const response = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({
      model: "bench",
      prompt,
      max_tokens: tokens,
      temperature: 0,
      stream,
      ...(stream ? { stream_options: { include_usage: true } } : {}),
    }),
  });
  if (!response.ok) throw new Error(`${url}: ${response.status} ${await response.text()}`);
  if (!stream) {
    const body = (await response.json()) as { usage: { completion_tokens: number } };
    const totalMs = performance.now() - started;
    return { tokens: body.usage.completion_tokens, firstMs: totalMs, totalMs };
  }
  let firstMs = 0;
  let count = 0;
  const parser = createParser({
    onEvent(event) {
      if (event.data === "[DONE]") return;
      const chunk = JSON.parse(event.data) as {
        choices?: { text?: string }[];
        usage?: { completion_tokens: number } | null;
      };
      if (firstMs === 0 && chunk.choices?.[0]?.text) firstMs = performance.now() - started;
      if (chunk.usage) count = chunk.usage.completion_tokens;
    },
  });
  const decoder = new TextDecoder();
  for await (const bytes of response.body as unknown as AsyncIterable<Uint8Array>)
    parser.feed(decoder.decode(bytes, { stream: true }));
  return { tokens: count, firstMs, totalMs: performance.now() - started };
}

/** Generation tokens/s of one request: after the first token when streamed, over the whole request when not. */
function rate(t: Timing, stream: boolean): number {
  return stream ? ((t.tokens - 1) / (t.totalMs - t.firstMs)) * 1000 : (t.tokens / t.totalMs) * 1000;
}

async function concurrent(url: string): Promise<number> {
  const started = performance.now();
  const all = await Promise.all(Array.from({ length: STREAMS }, () => complete(url, prompt(), true)));
  return (all.reduce((n, t) => n + t.tokens, 0) / (performance.now() - started)) * 1000;
}

interface Measured {
  plain: number[];
  streamed: number[];
  ttft: number[];
  aggregate: number[];
  tokens: number[];
}

async function measure(url: string): Promise<Measured> {
  prompts = 0; // both servers get the same prompts
  await complete(url, prompt(), false); // loads the model, warms the caches
  const m: Measured = { plain: [], streamed: [], ttft: [], aggregate: [], tokens: [] };
  for (let r = 0; r < runs; r++) {
    const plain = await complete(url, prompt(), false);
    const streamed = await complete(url, prompt(), true);
    m.plain.push(rate(plain, false));
    m.streamed.push(rate(streamed, true));
    m.ttft.push(streamed.firstMs);
    m.tokens.push(streamed.tokens);
    m.aggregate.push(await concurrent(url));
  }
  return m;
}

function llamaBench(n: number): number {
  const out = execFileSync(
    requireFile(toolPath("llama-bench")),
    ["-m", model, "-t", String(threads), "-p", "0", "-n", String(n), "-r", String(runs), "-o", "json"],
    { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] },
  );
  const rows = JSON.parse(out) as { avg_ts: number; n_gen: number }[];
  return rows.find((r) => r.n_gen > 0)?.avg_ts ?? Number.NaN;
}

// ---- run ----

const conduit = await startConduit(
  { bench: model },
  {
    CONDUIT_THREADS: String(threads),
    CONDUIT_PROMPT_THREADS: String(promptThreads),
    CONDUIT_PARALLEL: String(STREAMS),
    CONDUIT_MAX_QUEUE: "64",
    CONDUIT_TRAIN_CONCURRENCY: "0",
  },
);
let conduitRuns: Measured;
try {
  conduitRuns = await measure(conduit.url);
} finally {
  conduit.stop();
}
const server = await startLlamaServer(Math.max(256, tokens + 64));
let serverRuns: Measured;
try {
  serverRuns = await measure(server.url);
} finally {
  server.child.kill("SIGTERM");
}
const results = { conduit: conduitRuns, server: serverRuns, bench: llamaBench(median(conduitRuns.tokens)) };

const { conduit: c, server: s, bench } = results;
console.log(
  `model ${path.basename(model)}, ${threads} thread(s) (prompts ${promptThreads}), up to ${tokens} tokens (median ${median(c.tokens)} generated, greedy), ` +
    `${runs} runs, ${os.cpus().length} cores, load ${os.loadavg()[0]?.toFixed(1)}\n`,
);
console.log("                                   conduit     llama.cpp reference          ratio");
const row = (name: string, mine: number, theirs: number, ref: string) =>
  console.log(
    `  ${name.padEnd(32)} ${fmt(mine).padStart(8)}     ${fmt(theirs).padStart(8)} ${ref.padEnd(26)} ${fmt(mine / theirs)}x`,
  );
row("single stream tok/s, not streamed", median(c.plain), bench, "(llama-bench tg)");
row("single stream tok/s, streamed", median(c.streamed), bench, "(llama-bench tg)");
row("single stream tok/s, streamed", median(c.streamed), median(s.streamed), "(llama-server)");
row(`${STREAMS} streams aggregate tok/s`, median(c.aggregate), median(s.aggregate), "(llama-server -np 8)");
row("time to first token ms", median(c.ttft), median(s.ttft), "(llama-server)");
console.log(
  "\n(medians; ratios are conduit / reference: ≥ 1 is better for tok/s, ≤ 1 for time to first token)",
);
