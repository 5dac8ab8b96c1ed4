import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, test } from "node:test";
import { chooseAutoSettings } from "../../src/train/autoSettings.ts";
import { learningRateAt } from "../../src/train/core/learningRate.ts";
import { checkAbi, EXPECTED_STRUCT_SIZES, localBuildDir } from "../../src/train/libllama/llamaLib.ts";
import { countWindows, lossPositions, packWindows } from "../../src/train/core/packWindows.ts";
import { trainableBlocks } from "../../src/train/core/modelFile.ts";
import { isTrainableTensor } from "../../src/train/native/trainableTensor.ts";
import { torchTrainer } from "../../src/train/torch/torchTrainer.ts";
import { llamaCppTrainer } from "../../src/train/native/llamaCppTrainer.ts";
import { bf16Products } from "../../src/train/native/blasBackend.ts";
import type { TrainerHost } from "../../src/train/core/TrainerBackend.ts";

describe("trainer building blocks", () => {
  test("the torch trainer's automatic threads are every core, tuned between steps; a count is taken as it is", () => {
    assert.equal(torchTrainer.threads("auto"), os.availableParallelism());
    assert.equal(torchTrainer.threads(2), 2);
  });

  test("a trainer's memory need grows with the base, and full fine-tuning needs several times LoRA's", async () => {
    const host = { blas: "off" } as TrainerHost;
    const model = (parameters: number) => ({
      parameters,
      fileType: "Q4_K_M",
      sizeBytes: parameters / 2,
      file: "",
    });
    const need = (method: "lora" | "full", parameters: number) =>
      llamaCppTrainer.memoryNeed(method, model(parameters), host);
    const gb = (bytes: number) => bytes / 1e9;
    // The measured points the lines go through (bench/README.md): SmolLM2 Q8_0 LoRA 0.87 GB, full 2.42 GB.
    assert.ok(Math.abs(gb(await need("lora", 134.5e6)) - 0.87) < 0.05);
    assert.ok(Math.abs(gb(await need("full", 134.5e6)) - 2.42) < 0.05);
    assert.ok((await need("full", 1.5e9)) > 4 * (await need("lora", 1.5e9)));
    assert.ok((await need("lora", 1.5e9)) > 2 * (await need("lora", 0.5e9)));
  });

  test("with bf16 products a LoRA base trains as it is: its memory need goes through the three measured bases", async (t) => {
    const folder = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bf16-"));
    t.after(() => fs.rmSync(folder, { recursive: true, force: true }));
    const library = path.join(folder, "libggml-blas.so");
    fs.writeFileSync(library, "");
    fs.writeFileSync(path.join(folder, "build.json"), JSON.stringify({ quantizedOutProd: true, bf16: true }));
    if (!bf16Products())
      return t.skip("this CPU has no AVX512-BF16 (or GGML_BLAS_BF16=0): the backend would make F32 products");
    const host = { blas: library } as TrainerHost;
    const gb = async (parameters: number) =>
      (await llamaCppTrainer.memoryNeed(
        "lora",
        { parameters, fileType: "Q4_K_M", sizeBytes: 0, file: "" },
        host,
      )) / 1e9;
    // bench/README.md, "bf16 products": SmolLM2 0.92 GB, Qwen2.5-Coder 0.5B 2.29 GB, 1.5B 3.79 GB.
    for (const [parameters, measured] of [
      [134.5e6, 0.921],
      [494.0e6, 2.287],
      [1543.7e6, 3.785],
    ] as const)
      assert.ok(
        Math.abs((await gb(parameters)) - measured) < 0.02,
        `${parameters}: ${await gb(parameters)} GB`,
      );
    assert.ok((await gb(172e3)) < 0.5, "a tiny model needs little");
  });

  test("a finished local node-llama-cpp build is found, a half-written one is not", (t) => {
    const root = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-nlc-"));
    t.after(() => fs.rmSync(root, { recursive: true, force: true }));
    const folder = path.join(root, "llama", "localBuilds", `${process.platform}-${process.arch}`);
    const release = path.join(folder, "Release");
    fs.mkdirSync(release, { recursive: true });
    fs.writeFileSync(path.join(release, "_nlcBuildMetadata.json"), "{}");
    assert.equal(localBuildDir(root, "cpu"), undefined, "no buildDone.status: still building");
    fs.writeFileSync(path.join(folder, "buildDone.status"), "");
    assert.equal(localBuildDir(root, "cpu"), release);
    assert.equal(localBuildDir(root, "cuda"), undefined, "a CPU build is not a CUDA build");
  });

  test("struct layouts match the pinned llama.cpp headers, and a mismatch fails loudly", () => {
    assert.deepEqual(
      { ...EXPECTED_STRUCT_SIZES },
      {
        llama_model_params: 80,
        llama_context_params: 160,
        llama_opt_params: 48,
        ggml_opt_optimizer_params: 28,
        llama_model_quantize_params: 64,
        llama_batch: 56,
      },
    );
    assert.doesNotThrow(() => checkAbi());
    assert.throws(
      () => checkAbi(undefined, { ...EXPECTED_STRUCT_SIZES, llama_opt_params: 40 }),
      /struct layout mismatch .*llama_opt_params is 48 bytes, expected 40/,
    );
  });

  test("packs whole samples into windows with next-token labels, an end label and a loss mask", () => {
    const eos = 2;
    const all = (tokens: Int32Array) => ({ tokens, trained: new Uint8Array(tokens.length).fill(1) });
    const samples = [
      all(Int32Array.of(1, 10, 11)),
      all(Int32Array.of(1, 20)),
      all(Int32Array.of(1, 30, 31, 32)),
    ];
    const windows = packWindows(samples, [0, 1, 2], 6, eos);
    assert.equal(windows.length, 2);
    assert.equal(countWindows([3, 2, 4], 6), 2);
    assert.deepEqual([...windows[0]!.input], [1, 10, 11, 1, 20, eos]);
    assert.deepEqual([...windows[0]!.labels], [10, 11, eos, 20, eos, eos]);
    assert.deepEqual([...windows[1]!.input], [1, 30, 31, 32, eos, eos]);
    assert.deepEqual([...windows[1]!.labels], [30, 31, 32, eos, eos, eos]);
    // Padding never counts in the loss.
    assert.deepEqual([...windows[0]!.lossMask], [1, 1, 1, 1, 1, 0]);
    assert.deepEqual([...windows[1]!.lossMask], [1, 1, 1, 1, 0, 0]);
    assert.deepEqual(
      windows.map((w) => [w.sampleTokens, w.lossTokens]),
      [
        [5, 5],
        [4, 4],
      ],
    );
    assert.deepEqual(windows[1]!.spans, [{ sample: 2, start: 0, length: 4 }]);

    // Answer-only: a position counts when its label is an answer token, and the end label after the answer.
    const qa = { tokens: Int32Array.of(1, 40, 41, 50, 51), trained: Uint8Array.of(0, 0, 0, 1, 1) };
    assert.deepEqual([...lossPositions(qa)], [0, 0, 1, 1, 1]);
    const [window] = packWindows([qa], [0], 6, eos);
    assert.deepEqual([...window!.lossMask], [0, 0, 1, 1, 1, 0]);
    assert.equal(window!.lossTokens, 3);

    // A model trained on a shorter context than the window: only the first `capacity` positions hold samples.
    const short = packWindows(samples, [0, 1, 2], 8, eos, true, 5);
    assert.deepEqual(
      short.map((w) => [...w.input]),
      [
        [1, 10, 11, 1, 20, eos, eos, eos],
        [1, 30, 31, 32, eos, eos, eos, eos],
      ],
    );
    assert.deepEqual([...short[0]!.lossMask], [1, 1, 1, 1, 1, 0, 0, 0]);
    // Without packing every sample has a window of its own.
    assert.equal(packWindows(samples, [0, 1, 2], 6, eos, false).length, 3);
    assert.equal(countWindows([3, 2, 4], 6, false), 3);

    // A sample longer than a window is refused (the trainer sizes the window to fit, or fails the run first).
    assert.throws(
      () => packWindows([all(Int32Array.of(1, 2, 3, 4, 5))], [0], 3, 0),
      /5 tokens, more than the window of 3/,
    );
  });

  test("auto settings: many epochs for a handful of pairs, one for thousands; the rate falls with the width", () => {
    const choose = (pairs: number, width = 576, method: "lora" | "full" = "lora") =>
      chooseAutoSettings({
        method,
        pairs,
        characters: pairs * 40,
        model: { embeddingLength: width, contextLength: 2048 },
      });
    assert.deepEqual(
      [10, 20, 50, 100, 150, 300, 3000, 5000, 10_000, 100_000].map((pairs) => choose(pairs).epochs),
      [200, 74, 19, 7, 4, 3, 3, 2, 1, 1],
    );
    assert.equal(choose(10).lr, 0.001);
    assert.equal(choose(10, 128).lr, 0.0021);
    assert.ok(choose(10, 2048).lr < choose(10, 576).lr);
    assert.ok(choose(10, 576, "full").lr < choose(10, 576).lr);
    assert.equal(choose(10).loraRank, 32);
    assert.equal(choose(10, 64).loraRank, 16);
    assert.equal(choose(1_000_000).loraRank, 64);
    assert.match(choose(10).reasons.epochs, /200 epochs: a small dataset \(10 pairs\)/);
    // Preference tuning: the default passes however few the examples, at a tenth of the supervised rate.
    const dpo = (pairs: number, width = 576) =>
      chooseAutoSettings({
        method: "lora",
        objective: "dpo",
        pairs,
        characters: pairs * 40,
        model: { embeddingLength: width, contextLength: 2048 },
      });
    assert.deepEqual(
      [10, 300, 5000].map((pairs) => dpo(pairs).epochs),
      [3, 3, 2],
    );
    assert.equal(dpo(10).lr, 0.0001);
    assert.equal(dpo(10, 128).lr, 0.00021);
    assert.match(dpo(10).reasons.lr, /DPO: 0\.1 × the supervised rate/);
  });

  test("complexity selects the top blocks; the head always trains, token_embd never", () => {
    assert.equal(trainableBlocks(8, 1), 8);
    assert.equal(trainableBlocks(8, 0.25), 2);
    assert.equal(trainableBlocks(8, 0.01), 1);
    assert.ok(isTrainableTensor("blk.7.attn_q.weight", 8, 0.25));
    assert.ok(isTrainableTensor("blk.6.ffn_up.weight", 8, 0.25));
    assert.ok(!isTrainableTensor("blk.5.ffn_up.weight", 8, 0.25));
    assert.ok(isTrainableTensor("output.weight", 8, 0.25));
    assert.ok(isTrainableTensor("output_norm.weight", 8, 0.25));
    assert.ok(!isTrainableTensor("token_embd.weight", 8, 1));
    // No gradient reaches K and V in this llama.cpp: training them would only let weight decay shrink them.
    assert.ok(!isTrainableTensor("blk.7.attn_k.weight", 8, 1));
    assert.ok(!isTrainableTensor("blk.7.attn_v.weight", 8, 1));
    assert.ok(isTrainableTensor("blk.7.attn_output.weight", 8, 1));
  });

  test("learning-rate schedules warm up, decay, and stay positive", () => {
    const schedule = { kind: "linear", warmupSteps: 2, minFraction: 0 } as const;
    assert.equal(learningRateAt(1, { ...schedule, kind: "constant" }, 5, 10), 1);
    assert.ok(Math.abs(learningRateAt(1, schedule, 0, 10) - 1 / 3) < 1e-12);
    assert.equal(learningRateAt(1, schedule, 2, 10), 1);
    assert.ok(learningRateAt(1, schedule, 9, 10) > 0);
    assert.ok(learningRateAt(1, schedule, 9, 10) < learningRateAt(1, schedule, 5, 10));
    const cosine = learningRateAt(1, { kind: "cosine", warmupSteps: 0, minFraction: 0.1 }, 5, 10);
    assert.ok(Math.abs(cosine - (0.1 + 0.9 * 0.5)) < 1e-12);
  });
});
