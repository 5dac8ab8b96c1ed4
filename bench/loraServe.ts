/**
 * Serving many fine-tunes of one base: ten LoRA adapters on one loaded base against ten full fine-tuned
 * models (ten files of the base's size), through Conduit's engine with its defaults. Each side runs in a
 * child process of its own, so resident memory is that side's alone. Then, in one process, the tokens/s of
 * a request on an adapter against the same request on the bare base (interleaved, greedy, same prompt).
 *
 *   node --import tsx bench/loraServe.ts [smollm2-135m|stories260K|file.gguf] [--count 10] [--rank 16] [--tokens 64]
 *
 * Adapter and model contents do not change their cost, so the adapters are freshly initialised ones (B = 0
 * still runs both adapter products) and the "full fine-tunes" are copies of the base file.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { createLlamaEngine } from "../src/engine/LlamaEngine.ts";
import type { ModelRef } from "../src/model/types.ts";
import { LLAMA_CPP_LORA_TARGETS } from "../src/contract/runs.ts";
import { loraWeights, writeInitialAdapter } from "../src/train/native/loraAdapter.ts";
import { loadLlamaLib } from "../src/train/native/llamaLib.ts";
import { readModelFile } from "../src/train/native/modelFile.ts";
import { modelPath, requireFile, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    count: { type: "string", default: "10" },
    rank: { type: "string", default: "16" },
    tokens: { type: "string", default: "64" },
    side: { type: "string" },
    dir: { type: "string" },
  },
});
const count = Number(values.count);
const tokens = Number(values.tokens);
const prompt = "Once upon a time, there was a little girl who";
const sampling = {
  maxTokens: tokens,
  temperature: 0,
  topK: 40,
  topP: 1,
  presencePenalty: 0,
  frequencyPenalty: 0,
};

/** The refs one side serves: `lora` (one base, `count` adapters) or `full` (`count` model files). */
function refs(dir: string, side: string): ModelRef[] {
  return Array.from({ length: count }, (_, i) =>
    side === "lora"
      ? {
          id: `a${i}`,
          path: path.join(dir, "base.gguf"),
          lora: { path: path.join(dir, `adapter-${i}.gguf`) },
        }
      : { id: `m${i}`, path: path.join(dir, `full-${i}.gguf`) },
  );
}

if (values.side !== undefined) {
  // Child: load every model of one side with the engine's defaults, answer one request each, report RSS.
  const engine = createLlamaEngine({ threads: 1, logger: () => {} });
  const before = process.memoryUsage().rss;
  for (const model of refs(values.dir!, values.side))
    await engine.generate({ model, prompt, sampling: { ...sampling, maxTokens: 8 } });
  const stats = engine.stats();
  console.log(
    JSON.stringify({
      rssMb: process.memoryUsage().rss / 2 ** 20,
      grewMb: (process.memoryUsage().rss - before) / 2 ** 20,
      loadedModels: stats.loadedModels,
      loadedBases: stats.loadedBases,
      contextSize: engine.loaded()[0]?.contextSize,
    }),
  );
  await engine.dispose();
  process.exit(0);
}

const name = positionals[0] ?? "smollm2-135m";
const source = requireFile(name.endsWith(".gguf") ? path.resolve(name) : modelPath(name as BenchModel));
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-lora-serve-"));
process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
fs.copyFileSync(source, path.join(dir, "base.gguf"));
const info = readModelFile(loadLlamaLib(), source);
const rank = Number(values.rank);
const spec = { rank, alpha: 2 * rank, targets: [...LLAMA_CPP_LORA_TARGETS], complexity: 1 };
const weights = loraWeights(info, spec);
for (let i = 0; i < count; i++) {
  await writeInitialAdapter(info, path.join(dir, `adapter-${i}.gguf`), weights, spec, i);
  fs.copyFileSync(source, path.join(dir, `full-${i}.gguf`));
}
const adapterMb = fs.statSync(path.join(dir, "adapter-0.gguf")).size / 2 ** 20;
const baseMb = fs.statSync(source).size / 2 ** 20;
console.log(
  `base ${path.basename(source)} (${baseMb.toFixed(1)} MB), ${count} adapters of rank ${rank} (${adapterMb.toFixed(2)} MB each); ` +
    `engine defaults, 1 thread; ${os.cpus().length} cores, load ${os.loadavg()[0]?.toFixed(1)}`,
);
const self = fileURLToPath(import.meta.url);
const side = (which: string) =>
  JSON.parse(
    execFileSync(
      process.execPath,
      ["--import", "tsx", self, "--side", which, "--dir", dir, "--count", String(count)],
      {
        encoding: "utf8",
      },
    )
      .trim()
      .split("\n")
      .at(-1)!,
  ) as { rssMb: number; grewMb: number; loadedModels: number; loadedBases: number; contextSize: number };
const lora = side("lora");
const full = side("full");
for (const [label, m] of [
  [`${count} LoRA runs`, lora],
  [`${count} full runs`, full],
] as const)
  console.log(
    `  ${label.padEnd(14)} process RSS ${m.rssMb.toFixed(0).padStart(6)} MB (models + contexts ${m.grewMb.toFixed(0).padStart(6)} MB), ` +
      `${m.loadedModels} servable models on ${m.loadedBases} loaded base(s), context ${m.contextSize} × 4 sequences each`,
  );
console.log(
  `  ratio LoRA / full: RSS ${(lora.rssMb / full.rssMb).toFixed(2)}x, models + contexts ${(lora.grewMb / full.grewMb).toFixed(2)}x`,
);

// Tokens/s on an adapter against the bare base, interleaved in one engine.
const engine = createLlamaEngine({ threads: 1, logger: () => {} });
const base: ModelRef = { id: "base", path: path.join(dir, "base.gguf") };
const adapter: ModelRef = refs(dir, "lora")[0]!;
const rate = { base: [] as number[], adapter: [] as number[] };
for (const model of [base, adapter])
  await engine.generate({ model, prompt, sampling: { ...sampling, maxTokens: 4 } });
for (let round = 0; round < 3; round++)
  for (const [key, model] of [
    ["base", base],
    ["adapter", adapter],
  ] as const) {
    const t0 = performance.now();
    const result = await engine.generate({ model, prompt, sampling });
    rate[key].push(result.completionTokens / ((performance.now() - t0) / 1000));
  }
await engine.dispose();
const best = (xs: number[]) => Math.max(...xs);
console.log(
  `  generation, ${tokens} tokens: base ${best(rate.base).toFixed(1)} tok/s, adapter ${best(rate.adapter).toFixed(1)} tok/s ` +
    `(best of 3) → adapter / base ${(best(rate.adapter) / best(rate.base)).toFixed(2)}x`,
);
