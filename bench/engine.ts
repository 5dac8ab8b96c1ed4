/**
 * Inference speed through the Engine against references measured in the same process, on the same model and
 * thread count:
 *   - raw-evaluate: the minimal public node-llama-cpp loop (`LlamaContextSequence.evaluate`, greedy);
 *   - raw-native: the floor through node-llama-cpp's binding (decodeBatch + sampleToken, nothing else);
 *   - llama-bench (tg, same threads), when `.cache/llama.cpp/build/bin/llama-bench` exists.
 * Prints single-stream tokens/s (greedy), time to first token, and aggregate tokens/s of 8 concurrent streams
 * against raw-native-8: the same binding floor for 8 sequences (one decode for all, then one sampleToken per
 * sequence, concurrently), with the same prompts and token counts; with the process's CPU time per token, which
 * shared cores disturb less than tokens/s.
 *
 *   node --import tsx bench/engine.ts [model.gguf] [--threads 1] [--tokens 200] [--runs 9]
 *
 * The tokens per stream are capped by the model's context (stories260K was trained on 128 tokens). The machines
 * this runs on are shared and noisy, so the single-stream runs are interleaved and reported as best (the cost
 * of the code path) and median (what you get under the current load).
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import type { Token } from "node-llama-cpp";
import { createLlamaEngine } from "../src/engine/LlamaEngine.ts";
import { bindNative, greedySamplerConfig } from "../src/engine/nativeBatch.ts";
import type { SamplingOptions } from "../src/engine/types.ts";

const args = process.argv.slice(2);
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(`--${name}`);
  return i === -1 ? fallback : Number(args[i + 1]);
};
const modelPath = path.resolve(
  args.find((a, i) => !a.startsWith("--") && !args[i - 1]?.startsWith("--")) ??
    "/work/shared/models/stories260Ktok512.gguf",
);
const threads = flag("threads", 1);
const wantTokens = flag("tokens", 200);
const runs = flag("runs", 9);
const PROMPT = "Once upon a time";
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const fmt = (x: number) => x.toFixed(x < 10 ? 2 : 0);

// ---- raw node-llama-cpp ----
const llama = await getLlama({
  gpu: false,
  build: "never",
  maxThreads: 0,
  logLevel: LlamaLogLevel.error,
  logger: () => {},
});
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const contextSize = Math.min(2048, model.trainContextSize);
const promptTokens = model.tokenize(PROMPT, true);
if (model.tokens.shouldPrependBosToken && model.tokens.bos !== null) promptTokens.unshift(model.tokens.bos);
const N = Math.min(wantTokens, contextSize - promptTokens.length - 1);

interface Run {
  tokPerS: number;
  ttftMs: number;
  tokens: number;
}

async function rawEvaluate(): Promise<Run> {
  const context = await model.createContext({ contextSize, sequences: 1, threads });
  const sequence = context.getSequence();
  const t0 = performance.now();
  let first = 0;
  let n = 0;
  for await (const _token of sequence.evaluate(promptTokens, { temperature: 0 })) {
    if (n === 0) first = performance.now();
    if (++n >= N) break;
  }
  const end = performance.now();
  await context.dispose();
  return { tokPerS: ((n - 1) / (end - first)) * 1000, ttftMs: first - t0, tokens: n };
}

async function rawNative(): Promise<Run> {
  const context = await model.createContext({ contextSize, sequences: 1, threads });
  const native = bindNative(llama, model, context);
  const sampler = native.createSampler();
  sampler.applyConfig(greedySamplerConfig());
  const ctx = native.context;
  ctx.setThreads(threads);
  const t0 = performance.now();
  let first = 0;
  let input: number[] = promptTokens;
  let position = 0;
  let n = 0;
  while (n < N) {
    ctx.initBatch(input.length);
    const [index] = ctx.addToBatch(0, position, Uint32Array.from(input), Uint32Array.of(input.length - 1));
    position += input.length;
    await ctx.decodeBatch();
    const token = await ctx.sampleToken(index!, sampler);
    if (n === 0) first = performance.now();
    n++;
    if (model.isEogToken(token as Token)) break;
    input = [token];
  }
  const end = performance.now();
  sampler.dispose();
  await context.dispose();
  return { tokPerS: ((n - 1) / (end - first)) * 1000, ttftMs: first - t0, tokens: n };
}

// ---- the Engine ----
const ref = { id: path.basename(modelPath, ".gguf"), path: modelPath };
const greedy = { maxTokens: N, temperature: 0, topK: 40, topP: 1, presencePenalty: 0, frequencyPenalty: 0 };

async function engineSingle(engine: ReturnType<typeof createLlamaEngine>): Promise<Run> {
  const t0 = performance.now();
  let first = 0;
  const result = await engine.generate({
    model: ref,
    prompt: PROMPT,
    sampling: greedy,
    onText: () => {
      if (first === 0) first = performance.now();
    },
  });
  const end = performance.now();
  return {
    tokPerS: ((result.completionTokens - 1) / (end - first)) * 1000,
    ttftMs: first - t0,
    tokens: result.completionTokens,
  };
}

const STREAMS = 8;
/** Each stream's prompt: new to every sequence's cache, the same for the engine and the raw loop. */
const streamPrompt = (run: number, i: number) => `${run}-${i}: ${PROMPT}`;

/** Aggregate tokens/s and CPU ms per token of one batch of concurrent streams. */
interface Aggregate {
  tokPerS: number;
  cpuMsPerToken: number;
}

function measureAggregate(started: number, cpu: NodeJS.CpuUsage, tokens: number): Aggregate {
  const used = process.cpuUsage(cpu);
  return {
    tokPerS: (tokens / (performance.now() - started)) * 1000,
    cpuMsPerToken: (used.user + used.system) / 1000 / tokens,
  };
}

async function engineStreams(
  engine: ReturnType<typeof createLlamaEngine>,
  run: number,
  sampling: SamplingOptions,
): Promise<Aggregate> {
  const t0 = performance.now();
  const cpu = process.cpuUsage();
  const all = await Promise.all(
    Array.from({ length: STREAMS }, (_, i) =>
      engine.generate({ model: ref, prompt: streamPrompt(run, i), sampling, onText: () => {} }),
    ),
  );
  return measureAggregate(
    t0,
    cpu,
    all.reduce((n, x) => n + x.completionTokens, 0),
  );
}

/** The binding's floor for 8 streams: one decode for every sequence per step, then one sampleToken each. */
async function rawNativeStreams(run: number): Promise<Aggregate> {
  const context = await model.createContext({ contextSize, sequences: STREAMS, threads });
  const native = bindNative(llama, model, context);
  const ctx = native.context;
  ctx.setThreads(threads);
  const samplers = Array.from({ length: STREAMS }, () => {
    const sampler = native.createSampler();
    sampler.applyConfig(greedySamplerConfig());
    return sampler;
  });
  const t0 = performance.now();
  const cpu = process.cpuUsage();
  const sequences = Array.from({ length: STREAMS }, (_, i) => {
    const pending = model.tokenize(streamPrompt(run, i), true) as number[];
    if (model.tokens.shouldPrependBosToken && model.tokens.bos !== null) pending.unshift(model.tokens.bos);
    return { pending, position: 0, generated: 0, done: false };
  });
  let tokens = 0;
  for (;;) {
    const live = sequences.filter((s) => !s.done);
    if (live.length === 0) break;
    ctx.initBatch(live.reduce((n, s) => n + s.pending.length, 0));
    const indexes = live.map((s) => {
      const id = sequences.indexOf(s);
      const [index] = ctx.addToBatch(
        id,
        s.position,
        Uint32Array.from(s.pending),
        Uint32Array.of(s.pending.length - 1),
      );
      s.position += s.pending.length;
      return index!;
    });
    await ctx.decodeBatch();
    const sampled = await Promise.all(
      live.map((s, i) => ctx.sampleToken(indexes[i]!, samplers[sequences.indexOf(s)]!)),
    );
    live.forEach((s, i) => {
      const token = sampled[i]!;
      if (model.isEogToken(token as Token)) return void (s.done = true);
      tokens++;
      s.pending = [token];
      if (++s.generated >= N) s.done = true;
    });
  }
  const result = measureAggregate(t0, cpu, tokens);
  for (const sampler of samplers) sampler.dispose();
  await context.dispose();
  return result;
}

/** 8 concurrent streams through engines with 4 and 8 sequences and through the raw loop, runs interleaved. */
async function concurrent() {
  const engines = await Promise.all(
    [4, 8].map(async (parallelSequences) => {
      const engine = createLlamaEngine({ llama, threads, parallelSequences, maxQueue: 64, logger: () => {} });
      await engine.load(ref);
      return engine;
    }),
  );
  const greedyRuns: Aggregate[][] = [[], [], []];
  const sampled: number[][] = [[], []];
  for (let r = 0; r < runs; r++) {
    for (const [i, engine] of engines.entries()) {
      greedyRuns[i]!.push(await engineStreams(engine, r, greedy));
      sampled[i]!.push(
        (await engineStreams(engine, r, { ...greedy, temperature: 0.8, seed: r + 1 })).tokPerS,
      );
    }
    greedyRuns[2]!.push(await rawNativeStreams(r));
  }
  for (const engine of engines) await engine.dispose();
  const summary = (xs: Aggregate[]) => ({
    tokPerS: median(xs.map((x) => x.tokPerS)),
    cpuMsPerToken: median(xs.map((x) => x.cpuMsPerToken)),
  });
  return { greedy: greedyRuns.map(summary), sampled: sampled.map(median) };
}

// Event-loop lag while the engine generates: a 5 ms interval timer's worst lateness.
function lagProbe() {
  let worst = 0;
  let last = performance.now();
  const timer = setInterval(() => {
    const now = performance.now();
    worst = Math.max(worst, now - last - 5);
    last = now;
  }, 5);
  return () => (clearInterval(timer), worst);
}

function llamaBench(): number | undefined {
  const bin = path.resolve(".cache/llama.cpp/build/bin/llama-bench");
  if (!fs.existsSync(bin)) return undefined;
  try {
    const out = execFileSync(
      bin,
      ["-m", modelPath, "-t", String(threads), "-p", "0", "-n", String(N), "-r", String(runs), "-o", "json"],
      {
        encoding: "utf8",
        stdio: ["ignore", "pipe", "ignore"],
      },
    );
    const rows = JSON.parse(out) as { avg_ts: number; n_gen: number }[];
    return rows.find((r) => r.n_gen > 0)?.avg_ts;
  } catch {
    return undefined;
  }
}

console.log(
  `model ${modelPath}\nthreads ${threads}, ${N} tokens per stream (context ${contextSize}), ${runs} interleaved runs\n`,
);

const evaluateRuns: Run[] = [];
const nativeRuns: Run[] = [];
const engineRuns: Run[] = [];
const engine = createLlamaEngine({ llama, threads, logger: () => {} });
await engine.load(ref);
await engineSingle(engine); // warm-up
let worstLag = 0;
for (let r = 0; r < runs; r++) {
  evaluateRuns.push(await rawEvaluate());
  nativeRuns.push(await rawNative());
  const stop = lagProbe();
  engineRuns.push(await engineSingle(engine));
  worstLag = Math.max(worstLag, stop());
}
await engine.dispose();

const tps = (xs: Run[]) => xs.map((x) => x.tokPerS);
const best = (xs: number[]) => Math.max(...xs);
const engineBest = best(tps(engineRuns));
const engineMedian = median(tps(engineRuns));
const rows: [string, Run[]][] = [
  ["engine", engineRuns],
  ["raw-evaluate", evaluateRuns],
  ["raw-native", nativeRuns],
];
console.log(
  "single stream, greedy     best tok/s  median tok/s  median TTFT ms  engine ratio (best, median)",
);
for (const [name, xs] of rows) {
  const b = best(tps(xs));
  const m = median(tps(xs));
  const f = median(xs.map((x) => x.ttftMs));
  console.log(
    `  ${name.padEnd(22)} ${fmt(b).padStart(10)}  ${fmt(m).padStart(12)}  ${fmt(f).padStart(14)}  ${fmt(engineBest / b)}x, ${fmt(engineMedian / m)}x`,
  );
}
const bench = llamaBench();
if (bench !== undefined)
  console.log(
    `  ${"llama-bench tg (mean)".padEnd(22)} ${fmt(bench).padStart(10)}  ${"".padStart(12)}  ${"-".padStart(14)}  ${fmt(engineBest / bench)}x, ${fmt(engineMedian / bench)}x`,
  );
else console.log("  llama-bench: not built (.cache/llama.cpp/build/bin/llama-bench)");
console.log(`  worst event-loop lag (5 ms timer) during engine generation: ${fmt(worstLag)} ms`);

const c = await concurrent();
const floor = c.greedy[2]!;
console.log(
  `\n${STREAMS} concurrent streams (medians)   greedy tok/s  CPU ms/token  vs raw-native-8  vs 1 stream  temperature 0.8 tok/s`,
);
for (const [name, i] of [
  ["engine, parallelSequences 4", 0],
  ["engine, parallelSequences 8", 1],
  ["raw-native-8", 2],
] as const) {
  const g = c.greedy[i]!;
  const t = c.sampled[i];
  console.log(
    `  ${name.padEnd(30)} ${fmt(g.tokPerS).padStart(12)}  ${g.cpuMsPerToken.toFixed(2).padStart(12)}  ${fmt(g.tokPerS / floor.tokPerS).padStart(14)}x  ${fmt(g.tokPerS / engineMedian).padStart(10)}x  ${t === undefined ? "" : fmt(t).padStart(20)}`,
  );
}
console.log(
  `  load ${os
    .loadavg()
    .map((x) => x.toFixed(1))
    .join(" ")}`,
);
await model.dispose();
await llama.dispose();
