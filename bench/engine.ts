/**
 * Inference speed through the Engine against references measured in the same process, on the same model and
 * thread count:
 *   - raw-evaluate: the minimal public node-llama-cpp loop (`LlamaContextSequence.evaluate`, greedy);
 *   - raw-native: the floor through node-llama-cpp's binding (decodeBatch + sampleToken, nothing else);
 *   - llama-bench (tg, same threads), when `.cache/llama.cpp/build/bin/llama-bench` exists.
 * Prints single-stream tokens/s (greedy), time to first token, and aggregate tokens/s of 8 concurrent streams.
 *
 *   node --import tsx bench/engine.ts [model.gguf] [--threads 1] [--tokens 200] [--runs 9]
 *
 * The tokens per stream are capped by the model's context (stories260K was trained on 128 tokens). The machines
 * this runs on are shared and noisy, so the single-stream runs are interleaved and reported as best (the cost
 * of the code path) and median (what you get under the current load).
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import type { Token } from "node-llama-cpp";
import { createLlamaEngine } from "../src/engine/LlamaEngine.ts";
import { bindNative } from "../src/engine/nativeBatch.ts";

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
  sampler.applyConfig({
    temperature: 0,
    topK: 40,
    topP: 1,
    seed: 1,
    repeatPenalty: 1,
    repeatPenaltyMaxTokens: 1,
    repeatPenaltyTokens: new Uint32Array(0),
    repeatPenaltyPresencePenalty: 0,
    repeatPenaltyFrequencyPenalty: 0,
  });
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

async function engineConcurrent(parallelSequences: number, streams: number) {
  const engine = createLlamaEngine({ llama, threads, parallelSequences, maxQueue: 64, logger: () => {} });
  await engine.load(ref);
  const results: number[] = [];
  for (let r = 0; r < runs; r++) {
    const t0 = performance.now();
    const all = await Promise.all(
      Array.from({ length: streams }, (_, i) =>
        engine.generate({
          model: ref,
          prompt: PROMPT,
          sampling: { ...greedy, temperature: 0.8, seed: i + 1 },
        }),
      ),
    );
    const tokens = all.reduce((n, x) => n + x.completionTokens, 0);
    results.push((tokens / (performance.now() - t0)) * 1000);
  }
  await engine.dispose();
  return median(results);
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

const c4 = await engineConcurrent(4, 8);
const c8 = await engineConcurrent(8, 8);
console.log("\n8 concurrent streams (temperature 0.8)   aggregate tok/s (median)   vs single-stream median");
console.log(
  `  engine, parallelSequences 4 (default)   ${fmt(c4).padStart(6)}                     ${fmt(c4 / engineMedian)}x`,
);
console.log(
  `  engine, parallelSequences 8             ${fmt(c8).padStart(6)}                     ${fmt(c8 / engineMedian)}x`,
);
await model.dispose();
await llama.dispose();
