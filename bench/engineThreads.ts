/**
 * Why the engine's `threads` default is 1: llama.cpp compute threads, measured through node-llama-cpp's native
 * context (the engine's own path), for token generation (decode + sample per token) and for one prompt batch.
 *
 *   node --import tsx bench/engineThreads.ts [model.gguf] [--threads 1,2] [--tokens 100] [--runs 5]
 *
 * node-llama-cpp attaches no persistent ggml threadpool to its contexts, so with more than one thread every
 * decode creates and joins its worker threads (one `clone3` per decode under strace), and those threads meet
 * at spin barriers (`ggml_barrier` busy-waits) after every graph node. When the cores are shared (the Node
 * main thread, libuv, other processes) a spinning thread waits for a descheduled partner for whole time slices.
 */
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { bindNative, greedySamplerConfig } from "../src/engine/nativeBatch.ts";

const args = process.argv.slice(2);
const flag = (name: string, fallback: string) => {
  const i = args.indexOf(`--${name}`);
  return i === -1 ? fallback : (args[i + 1] ?? fallback);
};
const modelPath =
  args[0] && !args[0].startsWith("--") ? args[0] : "/work/shared/models/stories260Ktok512.gguf";
const threadCounts = flag("threads", "1,2").split(",").map(Number);
const tokens = Number(flag("tokens", "100"));
const runs = Number(flag("runs", "5"));

const llama = await getLlama({
  gpu: false,
  build: "never",
  maxThreads: 0,
  logLevel: LlamaLogLevel.error,
  logger: () => {},
});
const model = await llama.loadModel({ modelPath, gpuLayers: 0 });
const contextSize = Math.min(512, model.trainContextSize);
const context = await model.createContext({ contextSize, sequences: 1, threads: 1, batchSize: contextSize });
const { context: ctx, createSampler } = bindNative(llama, model, context);
const sampler = createSampler();
sampler.applyConfig(greedySamplerConfig());
const story = "Once upon a time there was a little girl who lived in a village near the forest. ";
const longPrompt = model.tokenize(story.repeat(20), true).slice(0, Math.min(120, contextSize - 1));
const shortPrompt = model.tokenize("Once upon a time", true);
const steps = Math.min(tokens, contextSize - shortPrompt.length - 1);

async function generation() {
  ctx.disposeSequence(0);
  let input: number[] = shortPrompt;
  let position = 0;
  let decodeMs = 0;
  let sampleMs = 0;
  const t0 = performance.now();
  for (let n = 0; n < steps; n++) {
    ctx.initBatch(input.length);
    const [index] = ctx.addToBatch(0, position, Uint32Array.from(input), Uint32Array.of(input.length - 1));
    position += input.length;
    const a = performance.now();
    await ctx.decodeBatch();
    const b = performance.now();
    input = [await ctx.sampleToken(index!, sampler)];
    sampleMs += performance.now() - b;
    decodeMs += b - a;
  }
  const totalMs = performance.now() - t0;
  return {
    tokPerS: (steps / totalMs) * 1000,
    decodeUs: (decodeMs / steps) * 1000,
    sampleUs: (sampleMs / steps) * 1000,
  };
}

async function prompt() {
  ctx.disposeSequence(0);
  const t0 = performance.now();
  ctx.initBatch(longPrompt.length);
  ctx.addToBatch(0, 0, Uint32Array.from(longPrompt), Uint32Array.of(longPrompt.length - 1));
  await ctx.decodeBatch();
  return (longPrompt.length / (performance.now() - t0)) * 1000;
}

const results = new Map(
  threadCounts.map((t) => [t, { gen: [] as Awaited<ReturnType<typeof generation>>[], pp: [] as number[] }]),
);
for (let r = 0; r < runs; r++)
  for (const t of threadCounts) {
    ctx.setThreads(t);
    results.get(t)!.gen.push(await generation());
    results.get(t)!.pp.push(await prompt());
  }

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
console.log(
  `model ${modelPath}; ${steps} generated tokens, ${longPrompt.length}-token prompt; ${runs} interleaved runs\n`,
);
console.log(
  "threads  gen tok/s best / median   decode us/token (median)   sample us/token (median)   prompt tok/s best / median",
);
for (const [t, { gen, pp }] of results) {
  const g = gen.map((x) => x.tokPerS);
  console.log(
    `${String(t).padStart(7)}  ${Math.max(...g)
      .toFixed(0)
      .padStart(8)} / ${median(g).toFixed(0).padEnd(8)}  ${median(gen.map((x) => x.decodeUs))
      .toFixed(0)
      .padStart(24)}   ${median(gen.map((x) => x.sampleUs))
      .toFixed(0)
      .padStart(24)}   ${Math.max(...pp)
      .toFixed(0)
      .padStart(10)} / ${median(pp).toFixed(0)}`,
  );
}
sampler.dispose();
await context.dispose();
await model.dispose();
await llama.dispose();
