import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import type { Llama } from "node-llama-cpp";
import { ConduitError } from "../../src/errors.ts";
import { createLlamaEngine } from "../../src/engine/LlamaEngine.ts";
import type { ModelRef } from "../../src/engine/types.ts";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { seededRandom } from "../../src/random.ts";
import { LLAMA_CPP_LORA_TARGETS } from "../../src/train/native/llamaCppTrainer.ts";
import { loraWeights, writeTrainedAdapter, type LoraSpec } from "../../src/train/core/loraAdapter.ts";
import { loadLlamaLib } from "../../src/train/libllama/llamaLib.ts";
import { readModelFile, type ModelFileInfo } from "../../src/train/core/modelFile.ts";
import { as, build, datasetWithPairs, KEY_A, KEY_B } from "../lib/helper.ts";
import { greedy } from "../lib/sampling.ts";

/**
 * Embeddings on real llama.cpp: each loaded base gets one embedding context, shared by its LoRA adapters (each
 * request applies its own), counted against the memory budget, with requests taking turns through the engine's
 * bounded queue.
 */

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-embeddings-"));
let base: ModelRef;
let other: ModelRef;
let info: ModelFileInfo;
let llama: Llama;
const spec: LoraSpec = { rank: 4, alpha: 8, targets: [...LLAMA_CPP_LORA_TARGETS], complexity: 1 };
const TEXTS = ["Once upon a time there was a robot", "in a garden full of apples"];

before(async () => {
  base = { id: "tiny", path: path.join(dir, "tiny.gguf") };
  other = { id: "other", path: path.join(dir, "other.gguf") };
  await createTinyModel(base.path, { seed: 1 });
  await createTinyModel(other.path, { seed: 2 });
  info = readModelFile(loadLlamaLib(), base.path);
  llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {} });
});
after(async () => {
  await llama.dispose();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** A random adapter of the tiny model (B not zero, so it changes what the model computes). */
async function writeAdapter(file: string, seed: number, model = info): Promise<void> {
  const weights = loraWeights(model, spec);
  const random = seededRandom(seed);
  const values = new Map<string, Float32Array>();
  for (const w of weights)
    for (const [suffix, size, fan] of [
      ["lora_a", w.inputs * spec.rank, w.inputs],
      ["lora_b", spec.rank * w.outputs, spec.rank],
    ] as const)
      values.set(
        `${w.name}.${suffix}`,
        Float32Array.from({ length: size }, () => ((random() * 2 - 1) * 3) / Math.sqrt(fan)),
      );
  await writeTrainedAdapter(model, file, weights, spec, values, "F16");
}

const engineOptions = { logger: () => {}, contextSize: 256 } as const;

describe("embeddings on the engine", () => {
  test("a LoRA adapter embeds with its adapter on the base's embedding context; the base stays itself", async () => {
    const adapterFile = path.join(dir, "adapter.gguf");
    await writeAdapter(adapterFile, 7);
    const adapter: ModelRef = { id: "ft", path: base.path, lora: { path: adapterFile } };

    const alone = async (model: ModelRef) => {
      const engine = createLlamaEngine({ llama, ...engineOptions });
      try {
        return (await engine.embed({ model, inputs: TEXTS })).vectors;
      } finally {
        await engine.dispose();
      }
    };
    const [bare, tuned] = [await alone(base), await alone(adapter)];
    assert.notDeepEqual(tuned, bare, "the adapter changes the vectors");

    const engine = createLlamaEngine({ llama, ...engineOptions });
    try {
      // Base and adapter interleaved, with a generation on the same base between them.
      const results = await Promise.all([
        engine.embed({ model: adapter, inputs: TEXTS }),
        engine.embed({ model: base, inputs: TEXTS }),
        engine.generate({ model: adapter, prompt: TEXTS[0]!, sampling: greedy(4) }),
        engine.embed({ model: adapter, inputs: TEXTS }),
        engine.embed({ model: base, inputs: TEXTS }),
      ]);
      assert.deepEqual(results[0].vectors, tuned);
      assert.deepEqual(results[1].vectors, bare);
      assert.deepEqual(results[3].vectors, tuned);
      assert.deepEqual(results[4].vectors, bare);
      assert.equal(engine.stats().loadedBases, 1);
      assert.equal(results[1].dimensions, 64);
      assert.ok(results[1].promptTokens > TEXTS.length);
      const embedded = [0, 1, 3, 4].reduce(
        (sum, i) => sum + (results[i] as { promptTokens: number }).promptTokens,
        0,
      );
      assert.equal(engine.stats().embeddingTokens, embedded);
      assert.equal(engine.stats().promptTokens, results[2].promptTokens, "generations' prompts only");
    } finally {
      await engine.dispose();
    }
  });

  test("the embedding context counts against the memory budget: an idle model makes room for it", async () => {
    const size = fs.statSync(base.path).size + fs.statSync(other.path).size;
    const engine = createLlamaEngine({ llama, ...engineOptions, memoryBudgetBytes: size + 1024 });
    try {
      await engine.load(other);
      await engine.load(base);
      assert.deepEqual(
        engine
          .loaded()
          .map((m) => m.id)
          .sort(),
        ["other", "tiny"],
        "both models fit",
      );
      await engine.embed({ model: base, inputs: TEXTS });
      assert.deepEqual(
        engine.loaded().map((m) => m.id),
        ["tiny"],
        "the embedding context took the idle model's room",
      );
      // And the model with its embedding context is now too big to share the budget.
      await engine.load(other);
      assert.deepEqual(
        engine.loaded().map((m) => m.id),
        ["other"],
      );
    } finally {
      await engine.dispose();
    }
  });

  test("requests take turns through the bounded queue: with no room to wait, the second is rate_limited", async () => {
    const many = Array.from({ length: 40 }, (_, i) => `${TEXTS[0]} ${i}`);
    const full = createLlamaEngine({ llama, ...engineOptions, maxQueue: 0 });
    try {
      await full.embed({ model: base, inputs: ["warm"] });
      const first = full.embed({ model: base, inputs: many });
      const second = full.embed({ model: base, inputs: ["hi"] });
      await assert.rejects(second, (e: ConduitError) => e.code === "rate_limited" && e.retryAfter! >= 1);
      assert.equal((await first).vectors.length, many.length);
      assert.equal(full.stats().rejectedRequests, 1);
    } finally {
      await full.dispose();
    }
    const queued = createLlamaEngine({ llama, ...engineOptions, maxQueue: 1 });
    try {
      const [a, b] = await Promise.all([
        queued.embed({ model: base, inputs: many }),
        queued.embed({ model: base, inputs: [many[3]!] }),
      ]);
      assert.deepEqual(b.vectors[0], a.vectors[3], "the same input, the same vector, whoever waited");
    } finally {
      await queued.dispose();
    }
  });

  test("many texts: those past the first 8 KiB are tokenized off the event loop, to the same tokens", async () => {
    const engine = createLlamaEngine({ llama, ...engineOptions });
    try {
      const texts = Array.from({ length: 300 }, (_, i) => `${TEXTS[0]}, and then ${i} more apples fell.`);
      assert.ok(Buffer.byteLength(texts.join("")) > 16 * 1024);
      const all = await engine.embed({ model: base, inputs: texts });
      const last = await engine.embed({ model: base, inputs: [texts.at(-1)!] });
      assert.deepEqual(all.vectors.at(-1), last.vectors[0]);
      assert.equal(all.vectors.length, texts.length);
    } finally {
      await engine.dispose();
    }
  });

  test("shutting down fails a request under way at its next input", async () => {
    const engine = createLlamaEngine({ llama, ...engineOptions });
    const many = Array.from({ length: 400 }, (_, i) => `${TEXTS[1]} ${i}`);
    await engine.embed({ model: base, inputs: ["warm"] });
    const running = engine.embed({ model: base, inputs: many }).then(
      () => undefined,
      (error: unknown) => error,
    );
    await new Promise((resolve) => setTimeout(resolve, 20));
    const started = Date.now();
    await engine.dispose();
    const error = await running;
    assert.ok(error instanceof ConduitError && error.code === "unavailable", String(error));
    assert.ok(Date.now() - started < 5_000);
  });

  test("an aborted request stops between inputs and frees its turn", async () => {
    const engine = createLlamaEngine({ llama, ...engineOptions });
    try {
      const controller = new AbortController();
      const many = Array.from({ length: 200 }, (_, i) => `${TEXTS[1]} ${i}`);
      const aborted = engine.embed({ model: base, inputs: many, signal: controller.signal });
      setTimeout(() => controller.abort(new Error("gone")), 20);
      await assert.rejects(aborted, /gone/);
      const after = await engine.embed({ model: base, inputs: [TEXTS[0]!] });
      assert.equal(after.vectors.length, 1);
    } finally {
      await engine.dispose();
    }
  });
});

describe("embeddings of a READY run", () => {
  test("a LoRA run embeds with its adapter, for its owner only", async (t) => {
    const { app, core } = await build(t);
    const ds = await datasetWithPairs(app, [{ input: "a", output: "b" }]);
    const created = await as(app, KEY_A).post("/conduit/finetuning", {
      datasetID: ds.id,
      baseModelName: "tiny",
      method: "lora",
    });
    assert.equal(created.statusCode, 200, created.body);
    const run = created.json<{ id: string }>();
    const file = core.blobs.pathOf(`runs/${run.id}/adapter.gguf`);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    await writeAdapter(file, 5, readModelFile(loadLlamaLib(), core.registry.resolve("tiny")!.path));
    assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, run.id);
    assert.ok(await core.runRepository.finish(run.id, "w", { status: "READY", modelPath: file }));

    const embed = (model: string, key = KEY_A) =>
      as(app, key).post("/v1/embeddings", { model, input: TEXTS, encoding_format: "float" });
    const tuned = await embed(run.id);
    assert.equal(tuned.statusCode, 200, tuned.body);
    assert.equal(tuned.json().model, run.id);
    const bare = await embed("tiny");
    assert.equal(bare.statusCode, 200, bare.body);
    assert.notDeepEqual(tuned.json().data, bare.json().data);
    assert.deepEqual(
      core.engine
        .loaded()
        .map((m) => m.lora ?? null)
        .sort(),
      [file, null],
    );

    const stranger = await embed(run.id, KEY_B);
    assert.equal(stranger.statusCode, 404, stranger.body);
    assert.equal(stranger.json().error.param, "model");
  });
});
