import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { getLlama, LlamaLogLevel, readGgufFileInfo } from "node-llama-cpp";
import type { Llama } from "node-llama-cpp";
import { LLAMA_CPP_LORA_TARGETS } from "../../src/train/native/llamaCppTrainer.ts";
import { BatcherGroup } from "../../src/engine/BatcherGroup.ts";
import type { Engine } from "../../src/engine/Engine.ts";
import { createLlamaEngine } from "../../src/engine/LlamaEngine.ts";
import { loadMixedAdapterLlama, mixedAdapterBuildStatus } from "../../src/engine/mixedAdapterBuild.ts";
import { loadAdapter } from "../../src/engine/nativeBatch.ts";
import { SequenceBatcher, type BatchAdapter } from "../../src/engine/SequenceBatcher.ts";
import type { ModelRef } from "../../src/engine/types.ts";
import { loadChatTemplate } from "../../src/model/chatTemplate.ts";
import { GgmlType } from "../../src/model/gguf/GgufWriter.ts";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { seededRandom } from "../../src/random.ts";
import {
  loraWeights,
  writeTrainedAdapter,
  type AdapterTensorType,
  type LoraSpec,
  type LoraWeight,
} from "../../src/train/core/loraAdapter.ts";
import { loadLlamaLib } from "../../src/train/libllama/llamaLib.ts";
import { readModelFile, type ModelFileInfo } from "../../src/train/core/modelFile.ts";
import { as, build, datasetWithPairs, KEY_A } from "../lib/helper.ts";
import { greedy } from "../lib/sampling.ts";

/**
 * LoRA adapters served by the engine on real llama.cpp: adapters of one base share its contexts (one decode
 * per adapter in use on a context per step, generations grouped by adapter onto contexts), are loaded on first
 * use, evicted least recently used under the memory budget, and unloaded when their run is deleted. Adapters
 * here are random (B not zero), so each answers differently.
 */

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-adapters-"));
let base: ModelRef;
let info: ModelFileInfo;
let weights: LoraWeight[];
let llama: Llama;
const spec: LoraSpec = { rank: 4, alpha: 8, targets: [...LLAMA_CPP_LORA_TARGETS], complexity: 1 };

before(async () => {
  const file = path.join(dir, "tiny.gguf");
  await createTinyModel(file, { seed: 1 });
  base = { id: "tiny", path: file };
  info = readModelFile(loadLlamaLib(), file);
  weights = loraWeights(info, spec);
  llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {} });
});
after(async () => {
  await llama.dispose();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** The values of a random adapter: A and B uniform in ±`size`/√in (big enough to change greedy answers). */
function randomValues(seed: number, size = 3, rank = spec.rank): Map<string, Float32Array> {
  const random = seededRandom(seed);
  const values = new Map<string, Float32Array>();
  for (const w of weights) {
    const a = new Float32Array(w.inputs * rank);
    const b = new Float32Array(rank * w.outputs);
    for (const [t, fan] of [
      [a, w.inputs],
      [b, rank],
    ] as const)
      for (let i = 0; i < t.length; i++) t[i] = ((random() * 2 - 1) * size) / Math.sqrt(fan);
    values.set(`${w.name}.lora_a`, a);
    values.set(`${w.name}.lora_b`, b);
  }
  return values;
}

async function writeAdapter(
  name: string,
  seed: number,
  type: AdapterTensorType = "F16",
  rank = spec.rank,
): Promise<ModelRef> {
  const file = path.join(dir, `${name}.gguf`);
  await writeTrainedAdapter(info, file, weights, { ...spec, rank }, randomValues(seed, 3, rank), type);
  return { id: name, path: base.path, lora: { path: file } };
}

// Longer than the batcher's shortest reused prefix (16 tokens), so a KV cache of another adapter would be reused.
const PROMPT =
  "Once upon a time there was a little robot who lived in a garden full of apples and rivers, and";

async function answer(engine: Engine, model: ModelRef, prompt = PROMPT, tokens = 12): Promise<string> {
  return (await engine.generate({ model, prompt, sampling: greedy(tokens) })).text;
}

/** Each model's answer from an engine of its own. */
async function alone(models: ModelRef[], prompt = PROMPT): Promise<string[]> {
  const texts: string[] = [];
  for (const model of models) {
    const engine = createLlamaEngine({ llama, logger: () => {}, contextSize: 256 });
    try {
      texts.push(await answer(engine, model, prompt));
    } finally {
      await engine.dispose();
    }
  }
  return texts;
}

describe("LoRA adapters on a base's shared contexts", () => {
  test("mixed adapters in one batch give each adapter's own greedy answer; KV caches are not shared across adapters", async () => {
    const adapters = await Promise.all([1, 2, 3, 4, 5].map((i) => writeAdapter(`mix-${i}`, i)));
    const models = [base, ...adapters];
    const expected = await alone(models);
    assert.ok(
      new Set(expected).size >= 4,
      `the adapters should answer differently: ${JSON.stringify(expected)}`,
    );

    const engine = createLlamaEngine({ llama, logger: () => {}, contextSize: 256, parallelSequences: 4 });
    try {
      // Six models on four sequences: every step mixes adapters, and sequences pass from one adapter to another
      // (the same prompt each time: a KV cache reused across adapters would change the answers).
      for (let round = 0; round < 2; round++) {
        const texts = await Promise.all(models.map((m) => answer(engine, m)));
        assert.deepEqual(texts, expected, `round ${round}`);
      }
      // One after the other on the same sequences.
      for (const [i, m] of models.entries()) assert.equal(await answer(engine, m), expected[i]);
      const stats = engine.stats();
      assert.equal(stats.loadedBases, 1);
      assert.equal(stats.loadedModels, models.length);
      for (const m of engine.loaded()) assert.equal(m.contextSize, 256);
    } finally {
      await engine.dispose();
    }
  });

  test("a base's contexts group generations by adapter: different adapters side by side, one adapter together", async () => {
    const [x, y] = await Promise.all([writeAdapter("group-x", 11), writeAdapter("group-y", 12)]);
    const expected = await alone([x, y, x]);
    const model = await llama.loadModel({ modelPath: base.path, gpuLayers: 0 });
    const contexts = [
      await model.createContext({ contextSize: 256, sequences: 2, threads: 1 }),
      await model.createContext({ contextSize: 256, sequences: 2, threads: 1 }),
    ];
    const template = await loadChatTemplate(base);
    const group = new BatcherGroup(
      contexts.map(
        (context) =>
          new SequenceBatcher({
            llama,
            model,
            context,
            template,
            threads: 1,
            promptThreads: 1,
            batchSize: 256,
            logger: () => {},
            onFinish: () => {},
          }),
      ),
    );
    const adapterOf = async (ref: ModelRef): Promise<BatchAdapter> => ({
      key: ref.lora!.path,
      native: await loadAdapter(llama, model, ref.lora!.path),
      scale: 1,
    });
    const ax = await adapterOf(x);
    const ay = await adapterOf(y);
    try {
      const prompt = await group.tokenize({ model: base, prompt: PROMPT, sampling: greedy(12) });
      const run = (ref: ModelRef, adapter: BatchAdapter) => {
        const ticket = group.takeSequence(prompt, adapter);
        assert.ok(ticket, "a free sequence");
        return {
          ticket,
          answer: group.start(
            ticket,
            prompt,
            { model: ref, prompt: PROMPT, sampling: greedy(12) },
            undefined,
            adapter,
          ),
        };
      };
      const first = run(x, ax);
      const second = run(y, ay);
      assert.notEqual(second.ticket.batcher, first.ticket.batcher, "another adapter takes the other context");
      const third = run(x, ax);
      assert.equal(third.ticket.batcher, first.ticket.batcher, "the same adapter joins its context");
      assert.equal(group.runningOn(ax.key), 2);
      assert.equal(group.activeCount, 3);
      const texts = (await Promise.all([first, second, third].map((r) => r.answer))).map((r) => r.text);
      assert.deepEqual(texts, expected);
    } finally {
      await group.idle();
      for (const context of contexts) await context.dispose();
      await ax.native.dispose();
      await ay.native.dispose();
      await model.dispose();
    }
  });

  test("adapters of one base requested at once are loaded and freed one at a time (llama.cpp's adapter set is not thread-safe)", async () => {
    // Without the model's adapter lock (adapterSetLock.ts) concurrent loads and frees corrupt the heap: with its write
    // side off, this test crashed the process in 3 runs of 3.
    const adapters = await Promise.all(
      [1, 2, 3, 4, 5, 6, 7, 8].map((i) => writeAdapter(`at-once-${i}`, 70 + i)),
    );
    for (let round = 0; round < 200; round++) {
      const engine = createLlamaEngine({ llama, logger: () => {}, contextSize: 64, parallelSequences: 8 });
      try {
        const texts = await Promise.all(adapters.map((a) => answer(engine, a, "1, 2, 3,", 1)));
        assert.equal(texts.length, adapters.length);
        assert.equal(engine.stats().loadedModels, adapters.length);
      } finally {
        await engine.dispose();
      }
    }
  });

  test("adapters are loaded on first use and evicted least recently used under the memory budget", async () => {
    const [a, b, c] = await Promise.all([1, 2, 3].map((i) => writeAdapter(`lru-${i}`, 10 + i)));
    const adapterBytes = fs.statSync(a!.lora!.path).size;
    const baseBytes = fs.statSync(base.path).size;
    // Room for the base and two adapters.
    const engine = createLlamaEngine({
      llama,
      logger: () => {},
      contextSize: 256,
      memoryBudgetBytes: baseBytes + 2 * adapterBytes + adapterBytes / 2,
    });
    const ids = () =>
      engine
        .loaded()
        .map((m) => m.id)
        .sort();
    try {
      assert.deepEqual(ids(), []);
      const first = await answer(engine, a!);
      await answer(engine, b!);
      assert.deepEqual(ids(), ["lru-1", "lru-2"]);
      await answer(engine, c!);
      assert.deepEqual(ids(), ["lru-2", "lru-3"], "the least recently used adapter went");
      await answer(engine, b!);
      await answer(engine, a!);
      assert.deepEqual(ids(), ["lru-1", "lru-2"], "lru-3 was used less recently than lru-2");
      assert.equal(engine.stats().loadedBases, 1);
      // Loaded again from its file, it answers as before.
      assert.equal(await answer(engine, a!), first);
    } finally {
      await engine.dispose();
    }
  });

  test("an unloaded adapter is taken out of service at once and freed when its generation ends", async () => {
    const [a, b] = await Promise.all([1, 2].map((i) => writeAdapter(`gone-${i}`, 20 + i)));
    const engine = createLlamaEngine({ llama, logger: () => {}, contextSize: 256 });
    try {
      const expected = await answer(engine, b!);
      const running = engine.generate({ model: a!, prompt: PROMPT, sampling: greedy(40) });
      const other = engine.generate({ model: b!, prompt: PROMPT, sampling: greedy(12) });
      engine.unload(a!.lora!.path);
      assert.deepEqual(
        engine.loaded().map((m) => m.id),
        ["gone-2"],
      );
      // The generation under way ends normally on the adapter it started with; the other adapter is untouched.
      const [done, text] = await Promise.all([running, other]);
      assert.equal(done.completionTokens, 40);
      assert.equal(text.text, expected);
      // The next request loads it again.
      await answer(engine, a!);
      assert.deepEqual(
        engine
          .loaded()
          .map((m) => m.id)
          .sort(),
        ["gone-1", "gone-2"],
      );
    } finally {
      await engine.dispose();
    }
  });

  test("a request already waiting for a sequence of an adapter that is unloaded still runs on it", async () => {
    const [a, b] = await Promise.all([1, 2].map((i) => writeAdapter(`queued-${i}`, 30 + i)));
    const [expected] = await alone([a!]);
    const engine = createLlamaEngine({ llama, logger: () => {}, contextSize: 256, parallelSequences: 1 });
    try {
      await engine.load(a!);
      await engine.load(b!);
      const long = engine.generate({ model: b!, prompt: PROMPT, sampling: greedy(30) });
      // The only sequence is taken: this one waits for it.
      const waiting = engine.generate({ model: a!, prompt: PROMPT, sampling: greedy(12) });
      // Failed by the engine's dispose when an assertion below fails first.
      long.catch(() => {});
      waiting.catch(() => {});
      // One turn of the event loop: the prompt is tokenized and the request is in the queue.
      await new Promise((resolve) => setImmediate(resolve));
      assert.equal(engine.loaded().find((m) => m.id === "queued-1")?.queuedRequests, 1);
      engine.unload(a!.lora!.path);
      assert.deepEqual(
        engine.loaded().map((m) => m.id),
        ["queued-2"],
      );
      const [, text] = await Promise.all([long, waiting]);
      assert.equal(text.text, expected);
      assert.equal(engine.stats().loadedModels, 1);
    } finally {
      await engine.dispose();
    }
  });

  test("F16 adapters: tensors are F16 on disk and answer as the same adapter in F32 at temperature 0", async () => {
    const f32 = await writeAdapter("same-f32", 7, "F32");
    const f16 = await writeAdapter("same-f16", 7, "F16");
    const types = async (file: string) =>
      new Set(
        ((await readGgufFileInfo(file, { logWarnings: false })).fullTensorInfo ?? []).map((t) => t.ggmlType),
      );
    assert.deepEqual(await types(f16.lora!.path), new Set([GgmlType.F16]));
    assert.deepEqual(await types(f32.lora!.path), new Set([GgmlType.F32]));
    const f16Bytes = fs.statSync(f16.lora!.path).size;
    const f32Bytes = fs.statSync(f32.lora!.path).size;
    assert.ok(f16Bytes < 0.6 * f32Bytes, `F16 ${f16Bytes} bytes against F32 ${f32Bytes}`);
    const prompts = [PROMPT, "The capital of the moon is", "1, 2, 3, 4,"];
    for (const prompt of prompts) {
      const [bare, wide, half] = await alone([base, f32, f16], prompt);
      assert.notEqual(wide, bare, "the adapter changes the answer");
      assert.equal(half, wide, prompt);
    }
  });

  test("Q8_0 adapters: 8-bit blocks on disk where rows allow, about half F16's bytes, loaded by llama.cpp", async () => {
    const f16 = await writeAdapter("q8-f16", 9, "F16", 32);
    const q8 = await writeAdapter("q8-q8", 9, "Q8_0", 32);
    const types = async (file: string) =>
      new Set(
        ((await readGgufFileInfo(file, { logWarnings: false })).fullTensorInfo ?? []).map((t) => t.ggmlType),
      );
    // Every row of the tiny model's weights and of a rank-32 B is whole 32-value blocks.
    assert.deepEqual(await types(q8.lora!.path), new Set([GgmlType.Q8_0]));
    const ratio = fs.statSync(q8.lora!.path).size / fs.statSync(f16.lora!.path).size;
    assert.ok(ratio < 0.6, `Q8_0 is ${ratio} of F16`);
    // llama.cpp loads it and it changes the answers (how close Q8_0 stays to F16 on a real model: bench/README.md).
    const [bare, eighth] = await alone([base, q8]);
    assert.notEqual(eighth, bare, "the adapter changes the answer");
  });
});

const mixedBuild = mixedAdapterBuildStatus("auto");

describe(
  "different adapters in one decode (the mixed-adapter build)",
  { skip: mixedBuild.available ? false : `${mixedBuild.reason}` },
  () => {
    let mixedLlama: Llama;
    before(async () => {
      if (!mixedBuild.available) return;
      mixedLlama = await loadMixedAdapterLlama(mixedBuild.dir, {
        maxThreads: 0,
        logLevel: LlamaLogLevel.error,
        logger: () => {},
      });
    });
    after(async () => {
      await mixedLlama?.dispose();
    });

    test("every sequence of a mixed batch answers as its adapter served alone on the prebuilt binaries", async () => {
      // Ranks and types differ: F16 at rank 4, Q8_0 at rank 4 (B stays F16) and at rank 32 (B Q8_0 too).
      const adapters = await Promise.all(
        [1, 2, 3, 4, 5, 6, 7].map((i) =>
          writeAdapter(`seq-${i}`, 40 + i, i < 6 ? "F16" : "Q8_0", i === 7 ? 32 : spec.rank),
        ),
      );
      const models = [base, ...adapters];
      const prompts = [PROMPT, "The capital of the moon is"];
      const expected = new Map<string, string[]>();
      for (const prompt of prompts) expected.set(prompt, await alone(models, prompt));
      assert.ok(new Set(expected.get(PROMPT)).size >= 6, JSON.stringify(expected.get(PROMPT)));

      // One context of 8 sequences: every step decodes the bare base and 7 adapters together.
      const engine = createLlamaEngine({
        llama: mixedLlama,
        logger: () => {},
        contextSize: 256,
        parallelSequences: 8,
        contextsPerModel: 1,
      });
      try {
        assert.deepEqual((await engine.accelerator()).adapters?.batching, "per-sequence");
        for (let round = 0; round < 2; round++)
          for (const prompt of prompts) {
            // Both prompts at once on every model in the second round: sequences change adapter between rounds.
            const runs =
              round === 0
                ? models.map((m) => answer(engine, m, prompt))
                : [...models].reverse().map((m) => answer(engine, m, prompt));
            const texts = await Promise.all(runs);
            if (round === 1) texts.reverse();
            assert.deepEqual(texts, expected.get(prompt), `round ${round}, ${prompt}`);
          }
        // One after the other on the same sequences (each changes adapter, the KV cache of another is not reused).
        for (const [i, m] of models.entries())
          assert.equal(await answer(engine, m), expected.get(PROMPT)![i]);
      } finally {
        await engine.dispose();
      }
    });

    test("an adapter unloaded while other adapters generate is taken off its sequences first", async () => {
      const [a, b] = await Promise.all([writeAdapter("seq-unload-a", 61), writeAdapter("seq-unload-b", 62)]);
      const [expectedA, expectedB] = await alone([a, b]);
      const engine = createLlamaEngine({
        llama: mixedLlama,
        logger: () => {},
        contextSize: 256,
        parallelSequences: 4,
        contextsPerModel: 1,
      });
      try {
        assert.deepEqual(await Promise.all([answer(engine, a), answer(engine, b)]), [expectedA, expectedB]);
        engine.unload(a.lora!.path);
        assert.equal(await answer(engine, b), expectedB);
        // Loaded again from its file: the same answers.
        assert.deepEqual(await Promise.all([answer(engine, a), answer(engine, b)]), [expectedA, expectedB]);
      } finally {
        await engine.dispose();
      }
    });
  },
);

describe("LoRA adapters and runs", () => {
  test("a deleted run's adapter leaves the engine", async (t) => {
    const { app, core } = await build(t);
    const ds = await datasetWithPairs(app, [{ input: "a", output: "b" }]);
    const created = await as(app, KEY_A).post("/conduit/finetuning", {
      datasetID: ds.id,
      baseModelName: "tiny",
      method: "lora",
    });
    assert.equal(created.statusCode, 200, created.body);
    const run = created.json();
    // READY, as a worker finishes it, with an adapter of the tiny model in the run's storage.
    const file = core.blobs.pathOf(`runs/${run.id}/adapter.gguf`);
    fs.mkdirSync(path.dirname(file), { recursive: true });
    const tiny = readModelFile(loadLlamaLib(), core.registry.resolve("tiny")!.path);
    await writeTrainedAdapter(tiny, file, loraWeights(tiny, spec), { ...spec }, randomValues(5), "F16");
    assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, run.id);
    assert.ok(await core.runRepository.finish(run.id, "w", { status: "READY", modelPath: file }));

    const inference = await as(app, KEY_A).post(`/conduit/finetuning/${run.id}/inference`, {
      prompt: "hello",
      max_tokens: 2,
    });
    assert.equal(inference.statusCode, 200, inference.body);
    assert.deepEqual(
      core.engine.loaded().map((m) => m.lora),
      [file],
    );
    const deleted = await as(app, KEY_A).delete(`/conduit/finetuning/${run.id}`);
    assert.equal(deleted.statusCode, 200, deleted.body);
    assert.deepEqual(core.engine.loaded(), []);
    assert.equal(fs.existsSync(file), false);
  });
});
