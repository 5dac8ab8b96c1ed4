/**
 * The service end to end against raw llama.cpp, on the same GGUF file and thread count:
 *   - single stream: Conduit's `/v1/completions` (streamed and not) over `llama-bench` generation (tg);
 *   - 8 concurrent streams: Conduit's aggregate tokens/s over `llama-server -np 8`'s;
 *   - time to first token: Conduit's over `llama-server`'s (streamed, same prompt);
 *   - prompt cache: time to first token of a request whose prompt shares a long prefix (`--prefix-sentences`,
 *     25 ≈ 450 SmolLM2 tokens) with the request before it, over that first request's; llama-server gets
 *     `cache_prompt: true`.
 * Both servers run as their own processes (`conduit serve` with `CONDUIT_PARALLEL=8`, `llama-server -np 8`),
 * both up for the whole run, and are driven by this process over loopback with the same requests (greedy, raw
 * prompt, no chat template). The machines are shared and their speed drifts over minutes, so the runs are
 * interleaved: each round measures Conduit, llama-server and `llama-bench` one after the other (the order
 * rotates), and a ratio compares rounds taken at the same time. Needs `bash bench/setup.sh` first.
 *
 *   node --import tsx bench/serve.ts [stories260K|smollm2-135m|file.gguf] [--threads 1] [--tokens 120] [--runs 5]
 *        [--prefix-sentences 25] [--prompt-threads N] [--prompt-repeat 1] [--gpu off|cuda|vulkan] [--json FILE]
 *
 * `--gpu cuda` runs both on the GPU with every layer offloaded: Conduit with `CONDUIT_GPU=cuda`, the reference
 * with `-ngl 99` (a llama.cpp built with CUDA: `CONDUIT_BENCH_LLAMA_BIN`, see bench/gpu/). `off` (the default)
 * is `CONDUIT_GPU=off` and `-ngl 0`. `--json` also writes the medians and ratios to FILE.
 */
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import fs from "node:fs";
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
    "prefix-sentences": { type: "string", default: "25" },
    gpu: { type: "string", default: "off" },
    json: { type: "string" },
  },
});
const gpu = values.gpu;
if (!["off", "cuda", "vulkan"].includes(gpu)) throw new Error(`--gpu is off, cuda or vulkan, not ${gpu}`);
/** Layers the reference offloads: all of them (99 is more than any bench model has) on a GPU. */
const ngl = gpu === "off" ? "0" : "99";
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
/** A long shared prefix: numbered sentences (25 are 451 tokens on SmolLM2-135M). */
const prefixText = Array.from({ length: Number(values["prefix-sentences"]) }, (_, i) => {
  const words = ["fox", "hill", "river", "lamp", "garden", "boat", "cloud", "stone"];
  return `Note ${i + 1}: the ${words[i % 8]} was next to the ${words[(i * 3 + 1) % 8]} on day ${i * 7 + 3}.`;
}).join(" ");
/**
 * Every request's prompt starts with a character no earlier request started with, so neither server can
 * reuse a cached prompt prefix (llama-server caches prompts per slot by default): each request pays for
 * its whole prompt, as a new user's would.
 */
const FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
/** Prompts each server got so far: the servers get the same sequence of prompts. */
const prompts = new Map<string, number>();
const PER_ROUND = STREAMS + 3;
if (1 + runs * PER_ROUND > FIRST.length)
  throw new Error(`--runs is at most ${Math.floor((FIRST.length - 1) / PER_ROUND)}`);
const nextFirst = (url: string) => {
  const n = prompts.get(url) ?? 0;
  prompts.set(url, n + 1);
  return FIRST[n % FIRST.length]!;
};
const prompt = (url: string) => `${nextFirst(url)}: ${promptText}`;

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
      ...["-c", String(contextPerSlot * STREAMS), "-ngl", ngl, "--no-webui", "--log-disable"],
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
  /** Prompt tokens, from the server's usage. */
  promptTokens: number;
  /** From sending the request to the first text (streamed) or to the whole answer. */
  firstMs: number;
  totalMs: number;
}

async function complete(
  url: string,
  prompt: string,
  stream: boolean,
  { maxTokens = tokens, extra = {} }: { maxTokens?: number; extra?: Record<string, unknown> } = {},
): Promise<Timing> {
  const started = performance.now();
  const response = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${KEY}`, "content-type": "application/json" },
    body: JSON.stringify({
      model: "bench",
      prompt,
      max_tokens: maxTokens,
      temperature: 0,
      stream,
      ...(stream ? { stream_options: { include_usage: true } } : {}),
      ...extra,
    }),
  });
  if (!response.ok) throw new Error(`${url}: ${response.status} ${await response.text()}`);
  if (!stream) {
    const body = (await response.json()) as { usage: { completion_tokens: number; prompt_tokens: number } };
    const totalMs = performance.now() - started;
    return {
      tokens: body.usage.completion_tokens,
      promptTokens: body.usage.prompt_tokens,
      firstMs: totalMs,
      totalMs,
    };
  }
  let firstMs = 0;
  let count = 0;
  let promptTokens = 0;
  const parser = createParser({
    onEvent(event) {
      if (event.data === "[DONE]") return;
      const chunk = JSON.parse(event.data) as {
        choices?: { text?: string }[];
        usage?: { completion_tokens: number; prompt_tokens: number } | null;
      };
      if (firstMs === 0 && chunk.choices?.[0]?.text) firstMs = performance.now() - started;
      if (chunk.usage) [count, promptTokens] = [chunk.usage.completion_tokens, chunk.usage.prompt_tokens];
    },
  });
  const decoder = new TextDecoder();
  for await (const bytes of response.body as unknown as AsyncIterable<Uint8Array>)
    parser.feed(decoder.decode(bytes, { stream: true }));
  return { tokens: count, promptTokens, firstMs, totalMs: performance.now() - started };
}

/** Generation tokens/s of one request: after the first token when streamed, over the whole request when not. */
function rate(t: Timing, stream: boolean): number {
  return stream ? ((t.tokens - 1) / (t.totalMs - t.firstMs)) * 1000 : (t.tokens / t.totalMs) * 1000;
}

/** CPU seconds the process has used (user + system, from /proc; NaN where there is none). */
function cpuSeconds(pid: number | undefined): number {
  try {
    const fields = fs.readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return Number.NaN;
  }
}

/** 8 concurrent streams: aggregate tokens/s, and the server's CPU ms per token (shared cores disturb it less). */
async function concurrent(url: string, pid: number | undefined): Promise<[number, number]> {
  const started = performance.now();
  const cpu = cpuSeconds(pid);
  const all = await Promise.all(Array.from({ length: STREAMS }, () => complete(url, prompt(url), true)));
  const tokens = all.reduce((n, t) => n + t.tokens, 0);
  return [(tokens / (performance.now() - started)) * 1000, ((cpuSeconds(pid) - cpu) * 1000) / tokens];
}

interface Measured {
  plain: number[];
  streamed: number[];
  ttft: number[];
  aggregate: number[];
  aggregateCpu: number[];
  tokens: number[];
  /** Time to first token of a new long prompt, then of one sharing all but its last words with it. */
  prefixFirst: number[];
  prefixSecond: number[];
  prefixTokens: number[];
  bench: number[];
}

const newMeasured = (): Measured => ({
  plain: [],
  streamed: [],
  ttft: [],
  aggregate: [],
  aggregateCpu: [],
  tokens: [],
  prefixFirst: [],
  prefixSecond: [],
  prefixTokens: [],
  bench: [],
});

/** One round on one server: single stream (plain, streamed), 8 streams, the shared-prefix pair. */
async function round(
  url: string,
  pid: number | undefined,
  m: Measured,
  extra: Record<string, unknown>,
): Promise<void> {
  const plain = await complete(url, prompt(url), false);
  const streamed = await complete(url, prompt(url), true);
  m.plain.push(rate(plain, false));
  m.streamed.push(rate(streamed, true));
  m.ttft.push(streamed.firstMs);
  m.tokens.push(streamed.tokens);
  const [aggregate, cpu] = await concurrent(url, pid);
  m.aggregate.push(aggregate);
  m.aggregateCpu.push(cpu);
  // One token, not streamed: the time to the answer is the time to the first token, whatever it is (an
  // end-of-text token included).
  const shared = `${nextFirst(url)}: ${prefixText}`;
  const once = { maxTokens: 1, extra };
  try {
    const first = await complete(url, `${shared} Which note names the fox?`, false, once);
    const second = await complete(url, `${shared} Which note names the boat?`, false, once);
    m.prefixFirst.push(first.firstMs);
    m.prefixSecond.push(second.firstMs);
    m.prefixTokens.push(second.promptTokens);
  } catch {
    // The model's context cannot hold the long prompt (stories260K): no prompt-cache figures.
  }
}

function llamaBench(n: number): number {
  const out = execFileSync(
    requireFile(toolPath("llama-bench")),
    ["-m", model, "-t", String(threads), "-ngl", ngl, "-p", "0", "-n", String(n), "-r", "1", "-o", "json"],
    { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] },
  );
  const rows = JSON.parse(out) as { avg_ts: number; n_gen: number }[];
  return rows.find((r) => r.n_gen > 0)?.avg_ts ?? Number.NaN;
}

// ---- run ----

const loadAtStart = os.loadavg()[0]!;
const conduit = await startConduit(
  { bench: model },
  {
    CONDUIT_THREADS: String(threads),
    CONDUIT_PROMPT_THREADS: String(promptThreads),
    CONDUIT_PARALLEL: String(STREAMS),
    CONDUIT_MAX_QUEUE: "64",
    CONDUIT_TRAIN_CONCURRENCY: "0",
    CONDUIT_GPU: gpu,
    CONDUIT_GPU_LAYERS: "all",
  },
);
/** What Conduit generates on (`GET /healthz`'s `accelerator`), to be sure it is the GPU asked for. */
let accelerator: unknown;
let server: { url: string; child: ChildProcess } | undefined;
const c = newMeasured();
const s = newMeasured();
const bench: number[] = [];
try {
  server = await startLlamaServer(Math.max(256, tokens + 64, 1024));
  // Loads the model, warms the caches.
  await complete(conduit.url, prompt(conduit.url), false);
  accelerator = ((await (await fetch(`${conduit.url}/healthz`)).json()) as { accelerator?: unknown })
    .accelerator;
  await complete(server.url, prompt(server.url), false);
  const cacheOn = { cache_prompt: true };
  for (let r = 0; r < runs; r++) {
    const steps = [
      () => round(conduit.url, conduit.child.pid, c, {}),
      () => round(server!.url, server!.child.pid, s, cacheOn),
      async () => void bench.push(llamaBench(c.tokens.length > 0 ? median(c.tokens) : tokens)),
    ];
    // Rotated each round, so that no side always runs right after the other.
    for (let i = 0; i < steps.length; i++) await steps[(i + r) % steps.length]!();
  }
} finally {
  conduit.stop();
  server?.child.kill("SIGTERM");
}

console.log(`conduit accelerator: ${JSON.stringify(accelerator)}; reference -ngl ${ngl}`);
console.log(
  `model ${path.basename(model)}, ${threads} thread(s) (prompts ${promptThreads}), up to ${tokens} tokens (median ${median(c.tokens)} generated, greedy), ` +
    `${runs} interleaved runs, ${os.cpus().length} cores, load ${loadAtStart.toFixed(1)} → ${os.loadavg()[0]!.toFixed(1)}\n`,
);
console.log("                                   conduit     llama.cpp reference          ratio");
const row = (name: string, mine: number, theirs: number, ref: string) =>
  console.log(
    `  ${name.padEnd(32)} ${fmt(mine).padStart(8)}     ${fmt(theirs).padStart(8)} ${ref.padEnd(26)} ${fmt(mine / theirs)}x`,
  );
row("single stream tok/s, not streamed", median(c.plain), median(bench), "(llama-bench tg)");
row("single stream tok/s, streamed", median(c.streamed), median(bench), "(llama-bench tg)");
row("single stream tok/s, streamed", median(c.streamed), median(s.streamed), "(llama-server)");
row(`${STREAMS} streams aggregate tok/s`, median(c.aggregate), median(s.aggregate), "(llama-server -np 8)");
row(
  `${STREAMS} streams CPU ms/token`,
  median(c.aggregateCpu),
  median(s.aggregateCpu),
  "(llama-server -np 8)",
);
row("time to first token ms", median(c.ttft), median(s.ttft), "(llama-server)");
if (c.prefixSecond.length > 0 && s.prefixSecond.length > 0) {
  const prefix = `${median(c.prefixTokens)}-token prompts`;
  row(`TTFT, new ${prefix}`, median(c.prefixFirst), median(s.prefixFirst), "(llama-server)");
  row(`TTFT, shared prefix`, median(c.prefixSecond), median(s.prefixSecond), "(llama-server, cache_prompt)");
  const ratio = (m: Measured) => median(m.prefixSecond.map((x, i) => x / m.prefixFirst[i]!));
  console.log(`  TTFT shared prefix / new prompt: conduit ${fmt(ratio(c))}x, llama-server ${fmt(ratio(s))}x`);
} else console.log("  (prompt cache: the model's context cannot hold the long prompt)");
if (values.json) {
  const pair = (mine: number, theirs: number) => ({ conduit: mine, reference: theirs, ratio: mine / theirs });
  const result = {
    model: path.basename(model),
    gpu,
    accelerator,
    threads,
    tokens: median(c.tokens),
    runs,
    singlePlainVsBench: pair(median(c.plain), median(bench)),
    singleStreamedVsBench: pair(median(c.streamed), median(bench)),
    singleStreamedVsServer: pair(median(c.streamed), median(s.streamed)),
    streams8VsServer: pair(median(c.aggregate), median(s.aggregate)),
    streams8CpuMsPerToken: pair(median(c.aggregateCpu), median(s.aggregateCpu)),
    ttftMs: pair(median(c.ttft), median(s.ttft)),
    ...(c.prefixSecond.length > 0 && s.prefixSecond.length > 0
      ? {
          ttftNewPromptMs: pair(median(c.prefixFirst), median(s.prefixFirst)),
          ttftSharedPrefixMs: pair(median(c.prefixSecond), median(s.prefixSecond)),
        }
      : {}),
    raw: { conduit: c, server: s, bench },
  };
  fs.writeFileSync(values.json, `${JSON.stringify(result, null, 2)}\n`);
}
console.log(
  "\n(medians; ratios are conduit / reference: ≥ 1 is better for tok/s, ≤ 1 for CPU per token and time to first token)",
);
