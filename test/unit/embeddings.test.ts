import assert from "node:assert/strict";
import { test } from "node:test";
import { fromEmbeddingsBody, toEmbeddingList } from "../../src/api/generation/embeddings.ts";
import { packed } from "../../src/engine/Embedder.ts";

/** The embeddings translation of both faces, as pure functions. */

test("fromEmbeddingsBody: one text, texts, one token list, token lists", () => {
  assert.deepEqual(fromEmbeddingsBody({ model: "m", input: "a" }).inputs, ["a"]);
  assert.deepEqual(fromEmbeddingsBody({ input: ["a", "b"] }).inputs, ["a", "b"]);
  assert.deepEqual(fromEmbeddingsBody({ input: [1, 2, 3] }).inputs, [[1, 2, 3]]);
  assert.deepEqual(fromEmbeddingsBody({ input: [[1], [2, 3]] }).inputs, [[1], [2, 3]]);
  assert.deepEqual(fromEmbeddingsBody({ model: "m", input: "a", dimensions: 8 }), {
    model: "m",
    inputs: ["a"],
    dimensions: 8,
  });
});

test("toEmbeddingList: OpenAI's list, floats or little-endian float32 base64, usage", () => {
  const result = {
    model: "run-1",
    vectors: [
      [0.5, -1.25],
      [3, 1e-3],
    ],
    dimensions: 2,
    promptTokens: 7,
  };
  const floats = toEmbeddingList("ft:tiny:run-1", result, "float");
  assert.deepEqual(floats, {
    object: "list",
    data: [
      { object: "embedding", index: 0, embedding: [0.5, -1.25] },
      { object: "embedding", index: 1, embedding: [3, 1e-3] },
    ],
    model: "ft:tiny:run-1",
    usage: { prompt_tokens: 7, total_tokens: 7 },
  });
  assert.deepEqual(toEmbeddingList("m", result, undefined).data, floats.data, "float is the default");
  const base64 = toEmbeddingList("m", result, "base64");
  const first = Buffer.from(base64.data[0]!.embedding as string, "base64");
  assert.deepEqual(first, Buffer.from([0, 0, 0, 0x3f, 0, 0, 0xa0, 0xbf]));
  const second = Buffer.from(base64.data[1]!.embedding as string, "base64");
  assert.deepEqual([second.readFloatLE(0), second.readFloatLE(4)], [3, Math.fround(1e-3)]);
});

test("packed: inputs in order, at most `lanes` and `tokens` a decode, a long one alone", () => {
  const input = (length: number) => Array.from({ length }, (_, i) => i);
  const lengths = (groups: number[][][]) => groups.map((g) => g.map((tokens) => tokens.length));
  assert.deepEqual(lengths(packed([1, 2, 3, 4, 5].map(input), 2, 100)), [[1, 2], [3, 4], [5]]);
  assert.deepEqual(lengths(packed([60, 30, 20, 99, 1].map(input), 4, 100)), [[60, 30], [20], [99, 1]]);
  assert.deepEqual(lengths(packed([100, 100].map(input), 4, 100)), [[100], [100]]);
  assert.deepEqual(packed([], 4, 100), []);
});
