/**
 * One stream's decode loop six ways, against `llama-bench` tg, on the same GGUF and thread count (what bounds
 * the single-stream goal of #11):
 *   - binding: node-llama-cpp 3.22.1's native context as the engine drives it (`src/engine/nativeBatch.ts`):
 *     `decodeBatch`, then `sampleToken`, two libuv jobs a token;
 *   - binding-spin: the same while a `setImmediate` chain keeps the main thread busy (libuv then polls without
 *     sleeping), to tell the cost of waking a sleeping event loop from the cost of the jobs themselves; it burns
 *     a core, which a server shares with its clients;
 *   - koffi: `llama_decode` as one koffi async call, then `llama_sampler_sample` (greedy) on the main thread,
 *     through the libllama node-llama-cpp ships (the trainer's route, `src/train/native/llamaLib.ts`);
 *   - koffi-backend: `llama_decode` with a greedy *backend sampler* (`llama_context_params.samplers`,
 *     llama.cpp's experimental backend sampling), read by `llama_get_sampled_token_ith`: one call a token;
 *   - koffi-sync: the koffi loop with `llama_decode` called synchronously on the main thread, which no server
 *     may do (it blocks the event loop for the whole decode);
 *   - koffi-worker: that synchronous loop in a worker thread (`bench/lib/decodeWorker.ts`), each token posted to
 *     the main thread, which times them as they arrive: the event loop stays free and no step waits for it.
 * Each loop starts from an empty cache and decodes one token at a time from BOS, greedy, like tg. Rounds are
 * interleaved; medians. Needs `bash bench/setup.sh` first.
 *
 *   node --import tsx bench/nativeLoop.ts [smollm2-135m|stories260K] [--tokens 64] [--runs 5] [--threads 1]
 */
import { execFileSync } from "node:child_process";
import { Worker } from "node:worker_threads";
import { parseArgs } from "node:util";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { bindNative, greedySamplerConfig } from "../src/engine/nativeBatch.ts";
import { koffiDecoder } from "./lib/koffiDecode.ts";
import { modelPath, requireFile, toolPath, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    tokens: { type: "string", default: "64" },
    runs: { type: "string", default: "5" },
    threads: { type: "string", default: "1" },
  },
});
const file = requireFile(modelPath((positionals[0] ?? "smollm2-135m") as BenchModel));
const tokens = Number(values.tokens);
const runs = Number(values.runs);
const threads = Number(values.threads);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

interface Loop {
  /** Tokens/s of `tokens` single-token decodes and the tokens it chose. */
  run(): Promise<{ perSecond: number; chosen: number[] }>;
}

// ---- node-llama-cpp's binding ----
const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {} });
const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
const bos = model.tokens.bos ?? 0;
const context = await model.createContext({ contextSize: 512, sequences: 1, threads });
const native = bindNative(llama, model, context);
const greedy = native.createSampler();
greedy.applyConfig(greedySamplerConfig());
function bindingLoop(spin: boolean): Loop {
  return {
    async run() {
      let spinning = spin;
      const tick = () => {
        if (spinning) setImmediate(tick);
      };
      if (spin) setImmediate(tick);
      try {
        return await bindingRun();
      } finally {
        spinning = false;
      }
    },
  };
}
const binding = bindingLoop(false);
async function bindingRun(): Promise<{ perSecond: number; chosen: number[] }> {
  const ctx = native.context;
  ctx.disposeSequence(0);
  const chosen: number[] = [];
  let token = bos;
  const started = performance.now();
  for (let position = 0; position < tokens; position++) {
    ctx.initBatch(1);
    const [index] = ctx.addToBatch(0, position, Uint32Array.of(token), Uint32Array.of(0));
    await ctx.decodeBatch();
    token = await ctx.sampleToken(index!, greedy);
    chosen.push(token);
  }
  return { perSecond: (tokens / (performance.now() - started)) * 1000, chosen };
}

// ---- koffi on the same libllama ----
function koffiLoop(backendSampling: boolean, sync: boolean): Loop {
  const decoder = koffiDecoder(file, threads, backendSampling);
  return {
    async run() {
      decoder.clear();
      const chosen: number[] = [];
      let token = bos;
      const started = performance.now();
      for (let i = 0; i < tokens; i++) {
        token = sync ? decoder.step(token) : await decoder.stepAsync(token);
        chosen.push(token);
      }
      return { perSecond: (tokens / (performance.now() - started)) * 1000, chosen };
    },
  };
}

/** The sync koffi loop in a worker thread; the main thread times the tokens as they arrive. */
async function workerLoop(): Promise<Loop> {
  // A worker does not inherit the main thread's tsx hooks: it registers them before importing its TypeScript.
  const entry = JSON.stringify(new URL("./lib/decodeWorker.ts", import.meta.url).href);
  const worker = new Worker(
    `import("tsx/esm/api").then(({ register }) => { register(); return import(${entry}); })`,
    { eval: true, workerData: { file, threads } },
  );
  await new Promise((resolve) => worker.once("message", resolve));
  worker.unref();
  return {
    run: () =>
      new Promise((resolve) => {
        const chosen: number[] = [];
        const started = performance.now();
        const onToken = (token: number) => {
          if (token !== -1) return void chosen.push(token);
          worker.off("message", onToken);
          resolve({ perSecond: (tokens / (performance.now() - started)) * 1000, chosen });
        };
        worker.on("message", onToken);
        worker.postMessage({ bos, tokens });
      }),
  };
}

function llamaBench(): number {
  const out = execFileSync(
    requireFile(toolPath("llama-bench")),
    ["-m", file, "-t", String(threads), "-p", "0", "-n", String(tokens), "-r", "3", "-o", "json"],
    { encoding: "utf8" },
  );
  return (JSON.parse(out) as { avg_ts: number }[])[0]!.avg_ts;
}

const loops: [string, Loop][] = [
  ["binding (decodeBatch + sampleToken)", binding],
  ["binding-spin (main thread kept busy)", bindingLoop(true)],
  ["koffi (decode + llama_sampler_sample)", koffiLoop(false, false)],
  ["koffi-backend (backend sampler)", koffiLoop(true, false)],
  ["koffi-sync (blocks the event loop)", koffiLoop(false, true)],
  ["koffi-worker (sync in a worker thread)", await workerLoop()],
];
const results = new Map<string, number[]>(loops.map(([name]) => [name, []]));
const bench: number[] = [];
const reference = (await binding.run()).chosen.join();
for (const [, loop] of loops) await loop.run(); // warm-up
let agree = true;
for (let round = 0; round < runs; round++) {
  const order = round % 2 === 0 ? loops : [...loops].reverse();
  for (const [name, loop] of order) {
    const { perSecond, chosen } = await loop.run();
    agree &&= chosen.join() === reference;
    results.get(name)!.push(perSecond);
  }
  bench.push(llamaBench());
}
const tg = median(bench);
console.log(
  `${file.split("/").pop()}, ${threads} thread(s), ${tokens} tokens from BOS, greedy, ${runs} interleaved rounds`,
);
for (const [name, values] of results)
  console.log(
    `  ${name.padEnd(40)} ${median(values).toFixed(1).padStart(7)} tok/s  ${(median(values) / tg).toFixed(3)}x llama-bench tg`,
  );
console.log(`  ${"llama-bench tg".padEnd(40)} ${tg.toFixed(1).padStart(7)} tok/s`);
console.log(`  every loop chose the same tokens: ${agree}`);
greedy.dispose();
await context.dispose();
await model.dispose();
process.exit(0);
