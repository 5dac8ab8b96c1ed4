/**
 * `POST /v1/embeddings` with a list of inputs, through Conduit's engine: the inputs embedded several to a decode
 * (the mixed-adapter build, `npm run setup:adapters`: each input a sequence of its own, as many at once as the
 * engine's `--parallel` generations) against one input a decode (node-llama-cpp's prebuilt binaries, which read
 * one sequence's embedding: what every request did before), on the same model and threads, in interleaved rounds.
 * Prints inputs/s and tokens/s of each, the ratio, and how close the two engines' vectors are (cosine).
 *
 *   node --import tsx bench/embeddings.ts [qwen2.5-coder-0.5b|smollm2-135m|…] [--inputs 64] [--rounds 3]
 *     [--parallel 4] [--threads 2] [--words 5-40]
 */
import os from "node:os";
import { parseArgs } from "node:util";
import { createLlamaEngine } from "../src/engine/LlamaEngine.ts";
import type { Engine } from "../src/engine/Engine.ts";
import { modelPath, requireFile, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    inputs: { type: "string", default: "64" },
    rounds: { type: "string", default: "3" },
    parallel: { type: "string", default: "4" },
    threads: { type: "string", default: String(os.availableParallelism()) },
    words: { type: "string", default: "5-40" },
  },
});
const models = (positionals.length > 0 ? positionals : ["qwen2.5-coder-0.5b"]) as BenchModel[];
const count = Number(values.inputs);
const rounds = Number(values.rounds);
const parallel = Number(values.parallel);
const threads = Number(values.threads);

// Sentences of `--words` words (5 to 40: a document split for search; 3-8: search queries), each its own.
const [fewest, most] = values.words.split("-").map(Number) as [number, number];
const words =
  "the a model answers questions about code data fine tuning adapters served quickly on small machines".split(
    " ",
  );
const inputs = Array.from(
  { length: count },
  (_, i) =>
    Array.from(
      { length: fewest + ((i * 7) % (most - fewest + 1)) },
      (_, j) => words[(i * 3 + j * 5) % words.length],
    ).join(" ") + ` (${i})`,
);

const engineFor = (batching: "auto" | "grouped") =>
  createLlamaEngine({ threads, parallelSequences: parallel, adapterBatching: batching, logger: () => {} });

function cosine(a: number[], b: number[]): number {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    na += a[i]! * a[i]!;
    nb += b[i]! * b[i]!;
  }
  return dot / Math.sqrt(na * nb);
}

console.log(
  `${count} inputs a request, ${threads} threads, ${parallel} sequences; load ${os.loadavg()[0]!.toFixed(2)} ` +
    `on ${os.availableParallelism()} cores (${os.cpus()[0]?.model ?? "?"})`,
);
for (const name of models) {
  const model = { id: name, path: requireFile(modelPath(name)) };
  const engines: [string, Engine][] = [
    ["one input a decode (prebuilt binaries)", engineFor("grouped")],
    ["several inputs a decode (mixed-adapter build)", engineFor("auto")],
  ];
  const batched = (await engines[1]![1].accelerator()).adapters;
  if (batched?.batching !== "per-sequence") {
    console.log(
      `${name}: no mixed-adapter build (${batched?.batching === "grouped" ? batched.reason : "?"}); skipped`,
    );
    for (const [, engine] of engines) await engine.dispose();
    continue;
  }
  const vectors: number[][][] = [];
  let tokens = 0;
  for (const [, engine] of engines) {
    const warm = await engine.embed({ model, inputs });
    vectors.push(warm.vectors);
    tokens = warm.promptTokens;
  }
  const seconds = engines.map(() => [] as number[]);
  for (let round = 0; round < rounds; round++)
    for (const [i, [, engine]] of engines.entries()) {
      const started = process.hrtime.bigint();
      await engine.embed({ model, inputs });
      seconds[i]!.push(Number(process.hrtime.bigint() - started) / 1e9);
    }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  console.log(`\n${name}: ${tokens} tokens in ${count} inputs (median of ${rounds} rounds)`);
  const rates = engines.map(([label], i) => {
    const s = median(seconds[i]!);
    console.log(
      `  ${label.padEnd(48)} ${(count / s).toFixed(1).padStart(8)} inputs/s ${(tokens / s).toFixed(0).padStart(7)} tok/s`,
    );
    return count / s;
  });
  const similarity = vectors[0]!.map((v, i) => cosine(v, vectors[1]![i]!));
  console.log(
    `  ratio ${(rates[1]! / rates[0]!).toFixed(2)}×; vectors' cosine between the two: min ${Math.min(...similarity).toFixed(6)}`,
  );
  for (const [, engine] of engines) await engine.dispose();
}
