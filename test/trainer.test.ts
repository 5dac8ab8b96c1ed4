import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import type { Llama, LlamaModel, Token } from "node-llama-cpp";
import { createTinyModel } from "../src/model/tinyModel.ts";
import { LORA_TARGETS } from "../src/train/loraTargets.ts";
import { learningRateAt } from "../src/train/native/learningRate.ts";
import { loraWeights, type LoraSpec } from "../src/train/native/loraAdapter.ts";
import { loraBaseConversion } from "../src/train/native/loraBase.ts";
import { readModelFile } from "../src/train/native/modelFile.ts";
import { convertModel } from "../src/train/native/runTraining.ts";
import {
  checkAbi,
  EXPECTED_STRUCT_SIZES,
  loadLlamaLib,
  localBuildDir,
} from "../src/train/native/llamaLib.ts";
import { countWindows, packWindows } from "../src/train/native/packWindows.ts";
import { isTrainableTensor, trainableBlocks } from "../src/train/native/trainableTensor.ts";
import {
  resolveTrainerJob,
  startTrainer,
  type TrainerJob,
  type TrainerProgress,
} from "../src/train/trainer.ts";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-trainer-"));
let baseModel: string;

before(async () => {
  // 128 wide rather than the default 64: attention keys and values do not train in this llama.cpp
  // release, and the narrower model needs several times more steps to tell 20 prompts apart.
  baseModel = path.join(dir, "tiny.gguf");
  await createTinyModel(baseModel, { seed: 1, embeddingLength: 128 });
});
after(() => fs.rmSync(dir, { recursive: true, force: true }));

/** A job on the tiny model that runs long enough to be interrupted. */
function longJob(name: string, overrides: Partial<TrainerJob> = {}): TrainerJob {
  return {
    baseModelPath: baseModel,
    outputPath: path.join(dir, `${name}.gguf`),
    workDir: path.join(dir, `${name}-work`),
    samples: Array.from({ length: 20 }, (_, i) => `sample number ${i} with some text to learn`),
    learningRate: 1e-3,
    epochs: 10_000,
    contextSize: 256,
    ...overrides,
  };
}

describe("trainer building blocks", () => {
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

  test("packs whole samples into windows with next-token labels and an end label", () => {
    const eos = 2;
    const samples = [Int32Array.of(1, 10, 11), Int32Array.of(1, 20), Int32Array.of(1, 30, 31, 32)];
    const windows = packWindows(samples, 6, eos);
    assert.equal(windows.length, 2);
    assert.equal(countWindows([3, 2, 4], 6), 2);
    assert.deepEqual([...windows[0]!.input], [1, 10, 11, 1, 20, eos]);
    assert.deepEqual([...windows[0]!.labels], [10, 11, eos, 20, eos, eos]);
    assert.deepEqual([...windows[1]!.input], [1, 30, 31, 32, eos, eos]);
    assert.deepEqual([...windows[1]!.labels], [30, 31, 32, eos, eos, eos]);
    assert.deepEqual(
      windows.map((w) => w.sampleTokens),
      [5, 4],
    );

    // A sample longer than a window is split, and the split point keeps the true next token.
    const long = packWindows([Int32Array.of(1, 2, 3, 4, 5)], 3, 0);
    assert.deepEqual([...long[0]!.labels], [2, 3, 4]);
    assert.deepEqual([...long[1]!.input, ...long[1]!.labels], [4, 5, 0, 5, 0, 0]);
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

  test("LoRA adapts the targeted weights of the top blocks and the output head; odd base types are converted", () => {
    const lib = loadLlamaLib();
    const model = readModelFile(lib, baseModel);
    const names = (spec: Partial<LoraSpec>) =>
      loraWeights(model, { rank: 4, alpha: 8, targets: [...LORA_TARGETS], complexity: 1, ...spec }).map(
        (w) => w.name,
      );
    assert.deepEqual(names({ targets: ["ffn_up", "output"], complexity: 0.5 }).sort(), [
      "blk.1.ffn_up.weight",
      "output.weight",
    ]);
    assert.equal(names({}).length, 2 * 5 + 1);
    const [down] = loraWeights(model, { rank: 4, alpha: 8, targets: ["ffn_down"], complexity: 0.5 });
    assert.deepEqual(down, { name: "blk.1.ffn_down.weight", inputs: 3 * 128, outputs: 128 });
    assert.equal(loraBaseConversion(model), undefined, "F32 trains as it is");
    const f16 = path.join(dir, "tiny-f16.gguf");
    convertModel(baseModel, f16, "F16");
    assert.equal(loraBaseConversion(readModelFile(lib, f16))?.to, "Q8_0");
    const q4 = path.join(dir, "tiny-q4_0.gguf");
    convertModel(baseModel, q4, "Q4_0");
    assert.equal(loraBaseConversion(readModelFile(lib, q4))?.to, "Q8_0", "4-bit bases train faster as Q8_0");
    const q8 = path.join(dir, "tiny-q8_0.gguf");
    convertModel(baseModel, q8, "Q8_0");
    assert.equal(loraBaseConversion(readModelFile(lib, q8)), undefined);
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

  test("invalid jobs are rejected before a process starts", () => {
    assert.throws(() => resolveTrainerJob(longJob("bad", { complexity: 0 })), /complexity/);
    assert.throws(() => resolveTrainerJob(longJob("bad", { samples: [] })), /samples/);
    assert.throws(() => resolveTrainerJob(longJob("bad", { outputType: "Q9" as never })), /outputType/);
    assert.deepEqual(resolveTrainerJob(longJob("ok")).lrSchedule, {
      kind: "constant",
      warmupSteps: 0,
      minFraction: 0,
    });
  });
});

describe("trainer process", () => {
  let llama: Llama;
  before(async () => {
    llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {} });
  });
  after(async () => {
    await llama.dispose();
  });

  /** Greedy completion of a raw prompt (special tokens parsed), up to the end-of-turn token. */
  async function complete(model: LlamaModel, prompt: string, maxTokens: number): Promise<string> {
    const context = await model.createContext({ contextSize: 256, threads: 1 });
    try {
      const sequence = context.getSequence();
      const bos = model.tokens.shouldPrependBosToken && model.tokens.bos !== null ? [model.tokens.bos] : [];
      const generated: Token[] = [];
      for await (const token of sequence.evaluate([...bos, ...model.tokenize(prompt, true)], {
        temperature: 0,
      })) {
        if (model.isEogToken(token) || generated.length >= maxTokens) break;
        generated.push(token);
      }
      return model.detokenize(generated, true);
    } finally {
      await context.dispose();
    }
  }

  test("memorises 20 chat IO pairs (fails if gradients are not zeroed or labels are misaligned)", async (t) => {
    const words = [
      "apple", "river", "stone", "cloud", "green", "seven", "tiger", "piano", "lemon", "storm",
      "candle", "maple", "ocean", "pencil", "violet", "rocket", "silver", "garden", "window", "butter",
    ]; // prettier-ignore
    const pairs = words.map((word, i) => ({
      input: `${word} ${words[(i * 7 + 3) % 20]}`,
      output: `${words[(i * 3 + 1) % 20]} ${i}`,
    }));
    const prompt = (input: string) => `<|im_start|>user\n${input}<|im_end|>\n<|im_start|>assistant\n`;
    const progress: TrainerProgress[] = [];
    const logs: string[] = [];
    const started = performance.now();
    const handle = startTrainer(
      {
        baseModelPath: baseModel,
        outputPath: path.join(dir, "memorised.gguf"),
        workDir: path.join(dir, "memorised-work"),
        samples: pairs.map((p) => `${prompt(p.input)}${p.output}<|im_end|>\n`),
        evalSamples: pairs.slice(0, 2).map((p) => `${prompt(p.input)}${p.output}<|im_end|>\n`),
        learningRate: 3e-3,
        epochs: 150,
        lrSchedule: { kind: "cosine", minFraction: 0.1 },
        contextSize: 256,
        seed: 1,
      },
      { onLog: (line) => logs.push(line), onProgress: (p) => progress.push(p) },
    );
    const outcome = await handle.done;
    assert.equal(outcome.status, "completed", JSON.stringify(outcome));
    assert.ok(outcome.status === "completed");
    const seconds = (performance.now() - started) / 1000;

    const model = await llama.loadModel({ modelPath: outcome.outputPath });
    try {
      const misses: string[] = [];
      for (const pair of pairs) {
        const text = await complete(model, prompt(pair.input), 24);
        if (text !== pair.output)
          misses.push(`${pair.input} -> ${JSON.stringify(text)} (want ${pair.output})`);
      }
      const { stats } = outcome;
      t.diagnostic(
        `memorised ${20 - misses.length}/20 in ${seconds.toFixed(1)} s; ${stats.steps} steps, ` +
          `${Math.round(stats.tokensPerSecond)} tokens/s, peak RSS ${Math.round(stats.peakRssBytes / 2 ** 20)} MiB`,
      );
      assert.ok(misses.length <= 2, `memorised only ${20 - misses.length}/20:\n${misses.join("\n")}`);
    } finally {
      await model.dispose();
    }
    const last = progress.at(-1)!;
    assert.equal(last.step, last.totalSteps);
    assert.equal(last.epoch, 150);
    assert.ok(last.evalLoss !== undefined && last.evalLoss < 1, `eval loss ${last.evalLoss}`);
    assert.ok(
      progress[0]!.trainLoss > last.trainLoss * 5,
      `loss ${progress[0]!.trainLoss} -> ${last.trainLoss}`,
    );
    assert.ok(logs.some((line) => line.includes("epoch 150/150")));
  });

  test("cancel stops a run at a step boundary", async () => {
    let firstProgress: () => void;
    const progressed = new Promise<void>((resolve) => (firstProgress = resolve));
    const job = longJob("cancelled");
    const handle = startTrainer(job, { onProgress: () => firstProgress() });
    await progressed;
    const cancelledAt = performance.now();
    handle.cancel();
    const outcome = await handle.done;
    assert.deepEqual(outcome, { status: "cancelled" });
    assert.ok(performance.now() - cancelledAt < 5000, "cancel took effect within a few steps");
    assert.ok(!fs.existsSync(job.outputPath));
  });

  test("a deep model trains: llama.cpp's training graph gets the headroom it lacks", async () => {
    // 24 blocks: 219 tensors, for which this llama.cpp release sizes graphs at 1,752 nodes while a
    // training step needs ~2,500; without the headroom adapter the trainer aborts in ggml_opt_build.
    const deep = path.join(dir, "deep.gguf");
    await createTinyModel(deep, { seed: 3, embeddingLength: 32, blockCount: 24, headCount: 2 });
    const logs: string[] = [];
    const job = longJob("deep", { baseModelPath: deep, epochs: 1, maxSteps: 2, outputType: "F32" });
    const outcome = await startTrainer(job, { onLog: (line) => logs.push(line) }).done;
    assert.equal(outcome.status, "completed", JSON.stringify(outcome));
    assert.ok(logs.some((line) => /need a larger training graph; loaded a zero LoRA adapter/.test(line)));
    assert.ok(fs.existsSync(job.outputPath));
  });

  test("a corrupt base model fails with the trainer's reason", async () => {
    const corrupt = path.join(dir, "corrupt.gguf");
    fs.writeFileSync(corrupt, Buffer.concat([Buffer.from("GGUF"), Buffer.alloc(64, 0xff)]));
    const outcome = await startTrainer(longJob("corrupt", { baseModelPath: corrupt, epochs: 1 })).done;
    assert.equal(outcome.status, "failed");
    assert.ok(outcome.status === "failed");
    assert.match(outcome.reason, /could not read the base model/);
    assert.equal(outcome.exitCode, 1);
  });

  test("a trainer killed from outside fails with the signal", async () => {
    let firstProgress: () => void;
    const progressed = new Promise<void>((resolve) => (firstProgress = resolve));
    const handle = startTrainer(longJob("killed"), { onProgress: () => firstProgress() });
    await progressed;
    process.kill(handle.pid!, "SIGKILL");
    const outcome = await handle.done;
    assert.equal(outcome.status, "failed");
    assert.ok(outcome.status === "failed");
    assert.equal(outcome.signal, "SIGKILL");
    assert.match(outcome.reason, /killed by SIGKILL/);
  });
});
