/**
 * Writes a random-weight model of a known shape with the project's GGUF writer (cost does not depend on the
 * weights' values). The same name and seed give a byte-identical file, so a bench can plan on one machine
 * (Conduit tokenizes and packs windows from the file's header) and train on another that writes it anew.
 *
 *   node --import tsx bench/makeModel.ts tinyllama-1b OUT.gguf [--type F16|F32]
 *
 * `tinyllama-1b`: TinyLlama-1.1B's shape (2048 wide, 22 blocks, 32 heads, 4 KV heads, 5632 FFN) with the tiny
 * vocabulary: ~0.97 B parameters (the vocabulary is 510 tokens, not 32,000).
 */
import { parseArgs } from "node:util";
import { createTinyModel, type TinyModelOptions } from "../src/model/tinyModel.ts";

export const SHAPES: Record<string, TinyModelOptions> = {
  "tinyllama-1b": {
    embeddingLength: 2048,
    blockCount: 22,
    headCount: 32,
    headCountKv: 4,
    feedForwardLength: 5632,
    contextLength: 2048,
    seed: 1,
    name: "tinyllama-shape-random",
  },
};

if (import.meta.url === `file://${process.argv[1]}` || process.argv[1]?.endsWith("makeModel.mjs")) {
  const { values, positionals } = parseArgs({
    allowPositionals: true,
    options: { type: { type: "string", default: "F16" } },
  });
  const [shape, out] = positionals;
  const options = shape === undefined ? undefined : SHAPES[shape];
  if (options === undefined || out === undefined) {
    console.error(`usage: makeModel.ts ${Object.keys(SHAPES).join("|")} OUT.gguf [--type F16|F32]`);
    process.exit(2);
  }
  const info = await createTinyModel(out, { ...options, weightType: values.type === "F32" ? "F32" : "F16" });
  console.log(JSON.stringify({ shape, ...info }));
}
