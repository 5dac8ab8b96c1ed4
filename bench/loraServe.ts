/**
 * Serving many fine-tunes of one base through Conduit's engine (1 thread per context, contexts of 2048 tokens).
 *
 * 1. Resident memory, each setup in a child process of its own (so the RSS is that setup's alone), after
 *    every active model answered once and then 8 concurrent streams (over 8 of them) ran: the bare base;
 *    10 and 100 adapters registered with 10 active; 100 active (these on one context); 10 active on a pool of
 *    `--pool` contexts; the same 10 adapters with a context each (its own KV cache per adapter, node-llama-cpp's
 *    `lora` option, a batcher each); 10 full fine-tunes (copies of the base file). Against the bare base, and
 *    against the bare base plus the adapter files' size per loaded adapter.
 * 2. For each of `--stream-counts` (8 and 32) concurrent streams, tokens/s interleaved in rounds, on the bare
 *    base, over as many different adapters and on one adapter, each against the same server's bare base: the
 *    engine grouping generations by adapter (one decode per adapter in use each step, node-llama-cpp's prebuilt
 *    binaries), the engine with the mixed-adapter build (`npm run setup:adapters`: one decode for any mix) on one
 *    context and on a pool of `--pool` contexts, and `llama-server` with the same adapters (`--lora` each, its
 *    per-request `lora` field; `bash bench/setup.sh` builds it), with the cores each used.
 * 3. Time to the first token of a request on a cold adapter (never used: its load included) against a warm one
 *    and the bare base (one context).
 * 4. What Q8_0 adapters cost in quality: llama.cpp's logits with one adapter in F16 and in Q8_0.
 *
 *   node --import tsx bench/loraServe.ts [smollm2-135m|qwen2.5-coder-0.5b|stories260K|file.gguf …] [--rank 32]
 *     [--adapter-type Q8_0|F16] [--tokens 64] [--rounds 3] [--stream-counts 8,32] [--pool 2] [--speed-only | --memory-only] [--no-llama-server]
 *
 * Several models run one after the other, each in a process of its own.
 *
 * Adapter contents do not change their cost, so the adapters are freshly initialised ones in Q8_0 (what a run
 * writes by default; `--adapter-type F16` for the other type; B = 0 still runs both adapter products) and the "full fine-tunes" are copies of the base file. Every
 * stream has a prompt of its own, so no request reuses another's KV cache.
 */
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import type { Llama, LlamaContext, LlamaModel } from "node-llama-cpp";
import type { Engine } from "../src/engine/Engine.ts";
import { createLlamaEngine } from "../src/engine/LlamaEngine.ts";
import { SequenceBatcher } from "../src/engine/SequenceBatcher.ts";
import type { GenerationRequest, ModelRef } from "../src/engine/types.ts";
import { loadChatTemplate } from "../src/model/chatTemplate.ts";
import { LLAMA_CPP_LORA_TARGETS } from "../src/train/native/llamaCppTrainer.ts";
import { loraWeights, writeInitialAdapter, writeTrainedAdapter } from "../src/train/core/loraAdapter.ts";
import { llamaCppLogits } from "../src/train/native/probeLogits.ts";
import { loadLlamaLib } from "../src/train/libllama/llamaLib.ts";
import { readModelFile } from "../src/train/core/modelFile.ts";
import { describeBackend } from "../src/engine/accelerator.ts";
import { freePort, waitFor } from "./lib/conduitServer.ts";
import { modelPath, requireFile, toolPath, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    rank: { type: "string", default: "32" },
    "adapter-type": { type: "string", default: "Q8_0" },
    tokens: { type: "string", default: "64" },
    rounds: { type: "string", default: "3" },
    streams: { type: "string", default: "8" },
    "stream-counts": { type: "string", default: "8,32" },
    "no-llama-server": { type: "boolean", default: false },
    side: { type: "string" },
    registered: { type: "string" },
    active: { type: "string" },
    dir: { type: "string" },
    pool: { type: "string", default: "2" },
    "speed-only": { type: "boolean", default: false },
    "memory-only": { type: "boolean", default: false },
  },
});
const tokens = Number(values.tokens);
const streams = Number(values.streams);
const streamCounts = values["stream-counts"].split(",").map(Number);
const rounds = Number(values.rounds);
const poolSize = Number(values.pool);
const ADAPTERS = 100;
const FULL = 10;
const sampling = {
  maxTokens: tokens,
  temperature: 0,
  topK: 40,
  topP: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
};
/** A prompt of its own per request (no KV cache reuse between requests). */
let prompts = 0;
const nextPrompt = () => `Story number ${prompts++}. Once upon a time, there was a little girl who`;

const baseRef = (dir: string): ModelRef => ({ id: "base", path: path.join(dir, "base.gguf") });
const adapterRef = (dir: string, i: number): ModelRef => ({
  id: `a${i}`,
  path: path.join(dir, "base.gguf"),
  lora: { path: path.join(dir, `adapter-${i}.gguf`) },
});
const fullRef = (dir: string, i: number): ModelRef => ({
  id: `m${i}`,
  path: path.join(dir, `full-${i}.gguf`),
});

/** Something that generates: the engine, the per-adapter contexts of {@link PerContextServer}, llama-server. */
interface Server {
  generate(request: GenerationRequest): Promise<{ completionTokens: number }>;
  dispose(): Promise<void>;
  /** CPU seconds the server has used, when it is another process (else this process's are counted). */
  cpuSeconds?(): number;
}

/**
 * llama.cpp's own server with the same adapters (`--lora` each, applied per request by its `lora` field), `-np`
 * slots of 2048 tokens, 1 thread as the engine's contexts: it batches requests of the same adapters together
 * and decodes different ones apart (ggml-org/llama.cpp PR 10994).
 */
class LlamaServer implements Server {
  private constructor(
    private readonly url: string,
    private readonly child: ChildProcess,
    private readonly loraIds: Map<string, number>,
  ) {}

  static async start(dir: string, slots: number): Promise<LlamaServer> {
    const port = await freePort();
    const loraIds = new Map<string, number>();
    const loras: string[] = [];
    for (let i = 0; i < slots; i++) {
      const file = adapterRef(dir, i).lora!.path;
      loraIds.set(file, i);
      loras.push("--lora", file);
    }
    const child = spawn(
      requireFile(toolPath("llama-server")),
      [
        ...["-m", baseRef(dir).path, "--host", "127.0.0.1", "--port", String(port)],
        ...["-t", "1", "-tb", "1", "-np", String(slots), "-c", String(2048 * slots), "--no-webui"],
        ...[...loras, "--lora-init-without-apply", "--log-disable"],
      ],
      { stdio: ["ignore", "ignore", "ignore"] },
    );
    const url = `http://127.0.0.1:${port}`;
    await waitFor(`${url}/health`, child, "llama-server");
    return new LlamaServer(url, child, loraIds);
  }

  async generate(request: GenerationRequest): Promise<{ completionTokens: number }> {
    const id = request.model.lora ? this.loraIds.get(request.model.lora.path) : undefined;
    const response = await fetch(`${this.url}/completion`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({
        prompt: request.prompt,
        n_predict: request.sampling.maxTokens,
        temperature: 0,
        top_k: 40,
        cache_prompt: false,
        lora: id === undefined ? [] : [{ id, scale: 1 }],
      }),
    });
    if (!response.ok) throw new Error(`llama-server: ${response.status} ${await response.text()}`);
    const body = (await response.json()) as { tokens_predicted: number };
    return { completionTokens: body.tokens_predicted };
  }

  cpuSeconds(): number {
    const fields = fs.readFileSync(`/proc/${this.child.pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return (Number(fields[11]) + Number(fields[12])) / 100;
  }

  async dispose(): Promise<void> {
    this.child.kill();
    await new Promise((resolve) => this.child.once("exit", resolve));
  }
}

/**
 * The other way to serve adapters: a context (with its own KV cache) per adapter, the adapter applied by
 * node-llama-cpp's `lora` context option, each with a batcher of its own, on one loaded base. What the engine
 * did before adapters shared a base's contexts; kept here to measure the two against each other.
 */
class PerContextServer implements Server {
  private llama: Llama | undefined;
  private model: LlamaModel | undefined;
  private readonly contexts = new Map<string, Promise<{ context: LlamaContext; batcher: SequenceBatcher }>>();

  async generate(request: GenerationRequest): Promise<{ completionTokens: number }> {
    const ref = request.model;
    this.llama ??= await getLlama({
      gpu: false,
      build: "never",
      maxThreads: 0,
      logLevel: LlamaLogLevel.error,
    });
    this.model ??= await this.llama.loadModel({ modelPath: ref.path, useMmap: false });
    const key = ref.lora?.path ?? ref.path;
    let entry = this.contexts.get(key);
    if (!entry) {
      const llama = this.llama;
      const model = this.model;
      entry = (async () => {
        const context = await model.createContext({
          contextSize: Math.min(2048, model.trainContextSize),
          sequences: 4,
          threads: 1,
          batchSize: 512,
          failedCreationRemedy: false,
          ...(ref.lora ? { lora: { adapters: [{ filePath: ref.lora.path }] } } : {}),
        });
        const template = await loadChatTemplate(ref);
        const batcher = new SequenceBatcher({
          llama,
          model,
          context,
          template,
          threads: 1,
          promptThreads: 1,
          batchSize: 512,
          logger: () => {},
          onFinish: () => {},
        });
        return { context, batcher };
      })();
      this.contexts.set(key, entry);
    }
    const { batcher } = await entry;
    const prompt = await batcher.tokenize(request);
    const sequence = batcher.takeSequence(prompt) ?? (await batcher.waitForSequence(undefined));
    return batcher.start(sequence, prompt, request, undefined);
  }

  async dispose(): Promise<void> {
    for (const entry of this.contexts.values()) {
      const { context, batcher } = await entry;
      await batcher.idle();
      await context.dispose();
    }
    await this.model?.dispose();
    await this.llama?.dispose();
  }
}

/** Aggregate tokens/s of `models.length` concurrent streams, one per model, and the cores the process used. */
async function concurrentRate(server: Server, models: ModelRef[]): Promise<{ rate: number; cores: number }> {
  const t0 = performance.now();
  const cpu0 = process.cpuUsage();
  const serverCpu0 = server.cpuSeconds?.();
  const results = await Promise.all(
    models.map((model) => server.generate({ model, prompt: nextPrompt(), sampling })),
  );
  const cpu = process.cpuUsage(cpu0);
  const seconds = (performance.now() - t0) / 1000;
  const generated = results.reduce((n, r) => n + r.completionTokens, 0);
  const cpuSeconds =
    serverCpu0 === undefined ? (cpu.user + cpu.system) / 1e6 : server.cpuSeconds!() - serverCpu0;
  return { rate: generated / seconds, cores: cpuSeconds / seconds };
}

const best = (xs: { rate: number; cores: number }[]) => xs.reduce((a, b) => (b.rate > a.rate ? b : a));

/** Milliseconds to the first streamed piece of a request. */
async function firstToken(engine: Engine, model: ModelRef): Promise<number> {
  const t0 = performance.now();
  let first: number | undefined;
  await engine.generate({
    model,
    prompt: nextPrompt(),
    sampling: { ...sampling, maxTokens: 4 },
    onText: () => (first ??= performance.now() - t0),
  });
  return first ?? Number.NaN;
}

if (values.side !== undefined) {
  // Child: one setup; every active model answers once, then `streams` concurrent streams; report RSS.
  const dir = values.dir!;
  const side = values.side;
  const active = Number(values.active ?? 10);
  const server: Server & { stats?: Engine["stats"] } =
    side === "per-context"
      ? new PerContextServer()
      : createLlamaEngine({ threads: 1, contextsPerModel: side === "pool" ? poolSize : 1, logger: () => {} });
  // Registered: READY runs whose adapters the engine may be asked for; it loads one only when it is.
  const registered = Array.from({ length: Number(values.registered ?? active) }, (_, i) =>
    adapterRef(dir, i),
  );
  const models =
    side === "base"
      ? [baseRef(dir)]
      : side === "full"
        ? Array.from({ length: active }, (_, i) => fullRef(dir, i))
        : registered.slice(0, active);
  for (const model of models)
    await server.generate({ model, prompt: nextPrompt(), sampling: { ...sampling, maxTokens: 8 } });
  await concurrentRate(
    server,
    Array.from({ length: streams }, (_, i) => models[i % models.length]!),
  );
  const stats = server.stats?.();
  console.log(
    JSON.stringify({
      rssMb: process.memoryUsage().rss / 2 ** 20,
      loadedModels: stats?.loadedModels ?? models.length,
      loadedBases: stats?.loadedBases ?? (side === "full" ? models.length : 1),
    }),
  );
  await server.dispose();
  process.exit(0);
}

if (positionals.length > 1) {
  // Several models in one run: each in a process of its own, one after the other.
  const flags = process.argv.slice(2).filter((arg) => !positionals.includes(arg));
  for (const model of positionals)
    execFileSync(process.execPath, ["--import", "tsx", fileURLToPath(import.meta.url), model, ...flags], {
      stdio: "inherit",
    });
  process.exit(0);
}

const name = positionals[0] ?? "smollm2-135m";
const source = requireFile(name.endsWith(".gguf") ? path.resolve(name) : modelPath(name as BenchModel));
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-lora-serve-"));
process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
fs.copyFileSync(source, path.join(dir, "base.gguf"));
const info = readModelFile(loadLlamaLib(), source);
const rank = Number(values.rank);
const adapterType = values["adapter-type"].toUpperCase();
if (adapterType !== "F16" && adapterType !== "Q8_0") throw new Error("--adapter-type is F16 or Q8_0");
const spec = { rank, alpha: 2 * rank, targets: [...LLAMA_CPP_LORA_TARGETS], complexity: 1 };
const weights = loraWeights(info, spec);
for (let i = 0; i < ADAPTERS; i++)
  await writeInitialAdapter(info, path.join(dir, `adapter-${i}.gguf`), weights, spec, i, adapterType);
for (let i = 0; i < FULL; i++) fs.copyFileSync(source, path.join(dir, `full-${i}.gguf`));
const adapterMb = fs.statSync(path.join(dir, "adapter-0.gguf")).size / 2 ** 20;
const baseMb = fs.statSync(source).size / 2 ** 20;
const load = () => os.loadavg()[0]!.toFixed(1);
console.log(
  `base ${path.basename(source)} (${baseMb.toFixed(1)} MiB), adapters of rank ${rank} on every target, ${adapterType} ` +
    `(${adapterMb.toFixed(2)} MiB each); engine defaults, 1 thread; ${os.cpus().length} cores, load ${load()}`,
);

// 1. Resident memory.
const self = fileURLToPath(import.meta.url);
const side = (which: string, registered: number, active: number) => {
  const out = execFileSync(
    process.execPath,
    [
      "--import",
      "tsx",
      self,
      "--side",
      which,
      "--dir",
      dir,
      "--registered",
      String(registered),
      "--active",
      String(active),
      "--tokens",
      String(tokens),
      "--streams",
      String(streams),
      "--pool",
      String(poolSize),
    ],
    { encoding: "utf8" },
  );
  return JSON.parse(out.trim().split("\n").at(-1)!) as {
    rssMb: number;
    loadedModels: number;
    loadedBases: number;
  };
};
const memoryRows = (): [string, ReturnType<typeof side>][] => [
  ["10 adapters registered, 10 active", side("lora", 10, 10)],
  ["100 adapters registered, 10 active", side("lora", 100, 10)],
  ["100 adapters registered, 100 active", side("lora", 100, 100)],
  [`10 adapters, a pool of ${poolSize} contexts`, side("pool", 10, 10)],
  ["10 adapters, a context each", side("per-context", 10, 10)],
  ["10 full fine-tunes", side("full", 10, 10)],
];
if (!values["speed-only"]) {
  const bare = side("base", 0, 1);
  const rows: [string, ReturnType<typeof side>][] = [["bare base", bare], ...memoryRows()];
  console.log(
    `\nresident memory after each active model answered once and ${streams} concurrent streams (load ${load()}):`,
  );
  console.log(
    "| | process RSS | vs the bare base | the bare base + the adapters' files | servable models | loaded bases |\n|---|---|---|---|---|---|",
  );
  for (const [label, m] of rows) {
    const adaptersLoaded = label.includes("adapters") ? m.loadedModels : 0;
    const floor = bare.rssMb + adaptersLoaded * adapterMb;
    console.log(
      `| ${label} | ${Math.round(m.rssMb).toLocaleString("en")} MB | ${(m.rssMb / bare.rssMb).toFixed(2)} | ${Math.round(floor).toLocaleString("en")} MB (${(m.rssMb / floor).toFixed(2)}) | ${m.loadedModels} | ${m.loadedBases} |`,
    );
  }
}
// "Registered" adapters are READY runs' files: nothing is loaded for one until it is asked for.
if (values["memory-only"]) process.exit(0);

// 2. Tokens/s of concurrent streams, interleaved: each server's bare base, its streams over as many adapters, and
// on one adapter, on the same contexts.
const base = baseRef(dir);
const engineFor = (sequences: number, batching: "auto" | "grouped", contexts = 1) =>
  createLlamaEngine({
    threads: 1,
    contextsPerModel: contexts,
    parallelSequences: sequences,
    adapterBatching: batching,
    logger: () => {},
  });
const speed: { label: string; rate: { rate: number; cores: number } }[][] = [];
for (const count of streamCounts) {
  const adapters = Array.from({ length: count }, (_, i) => adapterRef(dir, i));
  const grouped = engineFor(count, "grouped");
  const mixed = engineFor(count, "auto");
  const mixedPool = engineFor(count, "auto", poolSize);
  const perSequence = (await mixed.accelerator()).adapters;
  const servers: [string, Server][] = [[`grouped by adapter, one context (${count} sequences)`, grouped]];
  if (perSequence?.batching === "per-sequence")
    servers.push(
      [`one decode for any mix, one context (${count} sequences)`, mixed],
      [`one decode for any mix, a pool of ${poolSize} contexts`, mixedPool],
    );
  else
    console.log(
      `\n(no mixed-adapter build: ${perSequence?.batching === "grouped" ? perSequence.reason : "unknown"})`,
    );
  const server = values["no-llama-server"] ? undefined : await LlamaServer.start(dir, count);
  if (server) servers.push([`llama-server -np ${count}, per-request lora`, server]);
  const setups: [string, Server, ModelRef[]][] = servers.flatMap(
    ([name, srv]): [string, Server, ModelRef[]][] => [
      [`${name}: the bare base`, srv, Array(count).fill(base)],
      [`${name}: ${count} adapters`, srv, adapters],
      [`${name}: one adapter`, srv, Array(count).fill(adapters[0])],
    ],
  );
  const rates = setups.map(() => [] as { rate: number; cores: number }[]);
  // Warm-up: every model loaded, every context made.
  for (const [, srv, models] of setups)
    for (const model of new Set(models))
      await srv.generate({ model, prompt: nextPrompt(), sampling: { ...sampling, maxTokens: 4 } });
  const loadBefore = load();
  for (let round = 0; round < rounds; round++)
    for (const [i, [, srv, models]] of setups.entries()) rates[i]!.push(await concurrentRate(srv, models));
  console.log(
    `\ngeneration, ${count} concurrent streams of ${tokens} tokens, aggregate tokens/s (best of ${rounds} interleaved rounds; load ${loadBefore} → ${load()}):`,
  );
  console.log(
    "| | tok/s | vs its bare base | cores used | tok per CPU-s | per CPU-s vs its bare base |\n|---|---|---|---|---|---|",
  );
  const rows: { label: string; rate: { rate: number; cores: number } }[] = [];
  for (const [i, [label]] of setups.entries()) {
    const b = best(rates[i]!);
    const bare = best(rates[i - (i % 3)]!);
    rows.push({ label, rate: b });
    console.log(
      `| ${label} | ${b.rate.toFixed(1)} | ${(b.rate / bare.rate).toFixed(2)} | ${b.cores.toFixed(2)} | ${(b.rate / b.cores).toFixed(1)} | ${(b.rate / b.cores / (bare.rate / bare.cores)).toFixed(2)} |`,
    );
  }
  speed.push(rows);
  await grouped.dispose();
  await mixedPool.dispose();
  await server?.dispose();
  await mixed.dispose();
}

// 3. First token: a cold adapter (first use: loaded then) against a warm one and the bare base.
const engine = createLlamaEngine({ threads: 1, contextsPerModel: 1, logger: () => {} });
const adapters = [adapterRef(dir, 0)];
await engine.generate({ model: adapters[0]!, prompt: nextPrompt(), sampling: { ...sampling, maxTokens: 4 } });
const ttft = { base: [] as number[], warm: [] as number[], cold: [] as number[] };
for (let round = 0; round < rounds; round++) {
  ttft.base.push(await firstToken(engine, base));
  ttft.warm.push(await firstToken(engine, adapters[0]!));
  ttft.cold.push(await firstToken(engine, adapterRef(dir, 50 + round)));
}
await engine.dispose();
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
console.log(
  `\ntime to first token, median of ${rounds}, ${describeBackend(await engine.accelerator())} (load ${load()}):`,
);
console.log("| | ms |\n|---|---|");
for (const [label, xs] of [
  ["bare base", ttft.base],
  ["warm adapter", ttft.warm],
  ["cold adapter (loaded by the request)", ttft.cold],
] as const)
  console.log(`| ${label} | ${median(xs).toFixed(0)} |`);

// 4. What Q8_0 costs in quality: llama.cpp's logits over a text with the same adapter in F16 and in Q8_0 against
// the base's. B is drawn at the size a fine-tune's B reaches (±0.02), so the adapter moves the answers.
const qualityText =
  "The quick brown fox jumps over the lazy dog. In 1969 the first people walked on the moon, and the " +
  "world watched. def add(a, b):\n    return a + b\n\nQuestion: what is the capital of France? Answer: Paris.";
const textModel = await (
  await getLlama({ gpu: false, logLevel: LlamaLogLevel.error })
).loadModel({
  modelPath: source,
});
const textTokens = [...textModel.tokenize(qualityText)];
await textModel.dispose();
const random = (seed: number) => {
  let s = seed >>> 0;
  return () => ((s = (s * 1664525 + 1013904223) >>> 0) / 2 ** 32) * 2 - 1;
};
const draw = random(7);
const trained = new Map<string, Float32Array>();
for (const w of weights) {
  const a = new Float32Array(w.inputs * rank).map(() => draw() / Math.sqrt(w.inputs));
  trained.set(`${w.name}.lora_a`, a);
  trained.set(
    `${w.name}.lora_b`,
    new Float32Array(rank * w.outputs).map(() => draw() * 0.02),
  );
}
const logitsOf = async (type: "F32" | "F16" | "Q8_0" | null) => {
  if (type === null) return llamaCppLogits(source, null, textTokens);
  const file = path.join(dir, `quality-${type}.gguf`);
  await writeTrainedAdapter(info, file, weights, spec, trained, type);
  return llamaCppLogits(source, file, textTokens);
};
const plain = await logitsOf(null);
const exact = await logitsOf("F32");
const top = (row: Float32Array) => row.reduce((best, v, i) => (v > row[best]! ? i : best), 0);
/** Largest and mean logit difference from `b`, and at how many positions the top token is the same. */
const compare = (a: Float32Array[], b: Float32Array[]) => {
  let worst = 0;
  let sum = 0;
  let count = 0;
  let same = 0;
  for (let p = 0; p < a.length; p++) {
    for (let v = 0; v < a[p]!.length; v++) {
      const d = Math.abs(a[p]![v]! - b[p]![v]!);
      worst = Math.max(worst, d);
      sum += d;
      count++;
    }
    if (top(a[p]!) === top(b[p]!)) same++;
  }
  return { worst, mean: sum / count, same };
};
const rows: [string, ReturnType<typeof compare>][] = [
  ["the bare base", compare(plain, exact)],
  ["the adapter in F16", compare(await logitsOf("F16"), exact)],
  ["the adapter in Q8_0", compare(await logitsOf("Q8_0"), exact)],
];
console.log(
  `
the same adapter (rank ${rank}) stored in F16 and in Q8_0, against it in F32: llama.cpp's logits over ${textTokens.length} tokens`,
);
console.log("| | largest logit difference | mean | same top token |\n|---|---|---|---|");
for (const [label, r] of rows)
  console.log(
    `| ${label} | ${r.worst.toFixed(4)} | ${r.mean.toFixed(5)} | ${r.same} of ${textTokens.length} |`,
  );
