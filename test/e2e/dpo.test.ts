/**
 * Preference tuning (`"method": "dpo"`) through the API on the torch trainer, on the 1.2 MB stories260K model of
 * ../shared/models: a run from the base and one on top of a supervised run reach READY, and the preferred answers'
 * log-probability margin over the non-preferred ones grows on the training examples (each example's DPO loss,
 * -log σ(margin), falls below log 2, its value at the reference). Needs the worker's venv (`npm run setup:torch`);
 * skipped with a message without it.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { as, buildTestApp, createDataset, KEY_A, runEnded, testEnv, waitForRun } from "../lib/helper.ts";
import { torchPythonForTests } from "../lib/torchPython.ts";
import { preferenceLines } from "../lib/preferences.ts";
import { torchJob } from "../lib/trainerJob.ts";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { startTrainer } from "../../src/train/trainer.ts";

const python = torchPythonForTests();
const stories = fileURLToPath(new URL("../../../shared/models/stories260Ktok512.gguf", import.meta.url));
const skip = !python.ok ? python.reason : !fs.existsSync(stories) ? `${stories} is not here` : false;

test(
  "a DPO run from the base and one after a supervised run: READY, the preferred answers' margin grows",
  { skip, timeout: 600_000 },
  async (t) => {
    const env = await testEnv(t, "sqlite", {
      CONDUIT_TRAINER: "auto",
      CONDUIT_PYTHON: python.ok ? python.python : "",
      CONDUIT_TRAIN_THREADS: "1",
    });
    fs.copyFileSync(stories, path.join(env.dataDir, "models", "stories.gguf"));
    const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
    core.scheduler.start();
    const alice = as(app, KEY_A);
    const ds = await createDataset(app, "preferences");
    const up = await alice.post(`/conduit/dataset/${ds.id}/upload`, {
      name: "preferences.jsonl",
      content: preferenceLines.join("\n"),
    });
    assert.equal(up.statusCode, 200, up.body);
    // Two held-out examples of the same kind, in a dataset of their own: the run's validation set.
    const heldOut = await createDataset(app, "held-out preferences");
    const validation = await alice.post(`/conduit/dataset/${heldOut.id}/upload`, {
      name: "held-out.jsonl",
      content: [8, 9]
        .map((i) =>
          JSON.stringify({
            input: `Tell me about the cat number ${i}.`,
            preferred: `The cat ${i} is happy and likes to play.`,
            non_preferred: "No.",
          }),
        )
        .join("\n"),
    });
    assert.equal(validation.statusCode, 200, validation.body);

    /** Each training example's DPO loss with the served weights (the examples endpoint). */
    const exampleLosses = async (id: string) =>
      (await alice.get(`/conduit/finetuning/${id}/examples?sort=index&split=train&limit=100`))
        .json<{ loss: number | null }[]>()
        .map((example) => example.loss ?? Number.NaN);

    const settings = { datasetID: ds.id, baseModelName: "stories", loraRank: 8, lr: 0.01, epochs: 4 };
    const created = await alice.post("/conduit/finetuning", {
      ...settings,
      method: "dpo",
      validationFileID: validation.json<{ id: string }>().id,
    });
    assert.equal(created.statusCode, 200, created.body);
    const fromBase = await waitForRun(app, created.json<{ id: string }>().id, runEnded, {
      timeoutMs: 300_000,
    });
    assert.equal(fromBase.status, "READY", fromBase.logs.join("\n"));
    assert.equal(fromBase.config.method, "lora");
    assert.equal(fromBase.config.trainer, "torch");
    assert.deepEqual(fromBase.config.dpo, { beta: 0.1, fromRunID: null });
    // One step per example and epoch.
    assert.equal(fromBase.stats.final?.steps, 8 * 4);
    // The estimate planned those steps, and the two windows each trains through.
    assert.equal(fromBase.estimate?.planned?.steps, 8 * 4);
    assert.equal(fromBase.estimate?.planned?.tokens, fromBase.stats.final.trainTokens);
    assert.ok(
      fromBase.logs.some((line) =>
        /DPO \(beta 0\.1\): the reference model's log-probabilities of 8 examples/.test(line),
      ),
      fromBase.logs.join("\n"),
    );
    // At the reference the margin is 0 and the loss log 2: training moved every example's margin up.
    const losses = await exampleLosses(fromBase.id);
    assert.equal(losses.length, 8);
    t.diagnostic(`DPO from the base: example losses ${losses.map((l) => l.toFixed(3)).join(" ")}`);
    for (const loss of losses) assert.ok(loss < Math.log(2) - 0.05, `example loss ${loss} < log 2`);
    assert.ok((fromBase.stats.rewardMargin ?? 0) > 0, JSON.stringify(fromBase.stats));
    assert.ok((fromBase.stats.rewardAccuracy ?? 0) >= 0.75, JSON.stringify(fromBase.stats));
    // The held-out pairs are evaluated with the DPO loss, their margin and accuracy reported with it.
    const { evalLoss, evalRewardMargin, evalRewardAccuracy } = fromBase.stats;
    t.diagnostic(
      `held out: DPO loss ${evalLoss}, margin ${evalRewardMargin}, accuracy ${evalRewardAccuracy}`,
    );
    assert.ok(Number.isFinite(evalLoss) && Number.isFinite(evalRewardMargin), JSON.stringify(fromBase.stats));
    assert.ok(evalRewardAccuracy >= 0 && evalRewardAccuracy <= 1, JSON.stringify(fromBase.stats));
    assert.equal(fromBase.stats.evalLossSeries.length, 4, "an evaluation after every epoch");
    const heldOutLosses = (
      await alice.get(`/conduit/finetuning/${fromBase.id}/examples?split=validation`)
    ).json<{ loss: number | null }[]>();
    assert.equal(heldOutLosses.length, 2);
    // The log (OpenAI's job events) says it too, at each epoch.
    assert.ok(
      fromBase.logs.some((line) =>
        /trainer: epoch 4\/4 train loss .*; reward margin [\d.]+, preferred wins [\d.]+% \(held out: /.test(
          line,
        ),
      ),
      fromBase.logs.join("\n"),
    );
    assert.ok(heldOutLosses.every((example) => Number.isFinite(example.loss)));
    // It is served like any LoRA run.
    const chat = await alice.post("/conduit/v1/chat", {
      model: fromBase.id,
      prompt: "Tell me",
      max_tokens: 4,
    });
    assert.equal(chat.statusCode, 200, chat.body);

    // SFT, then DPO from its adapter: the reference is the supervised model, and the margin grows over it.
    const sft = await alice.post("/conduit/finetuning", { ...settings, epochs: 2 });
    assert.equal(sft.statusCode, 200, sft.body);
    const supervised = await waitForRun(app, sft.json<{ id: string }>().id, runEnded, {
      timeoutMs: 300_000,
    });
    assert.equal(supervised.status, "READY", supervised.logs.join("\n"));
    const onTop = await alice.post("/conduit/finetuning", {
      datasetID: ds.id,
      method: "dpo",
      beta: 0.5,
      fromRunID: supervised.id,
      lr: 0.01,
      epochs: 2,
    });
    assert.equal(onTop.statusCode, 200, onTop.body);
    const continued = await waitForRun(app, onTop.json<{ id: string }>().id, runEnded, {
      timeoutMs: 300_000,
    });
    assert.equal(continued.status, "READY", continued.logs.join("\n"));
    assert.deepEqual(continued.config.dpo, { beta: 0.5, fromRunID: supervised.id });
    assert.equal(continued.config.loraRank, 8);
    assert.ok(
      continued.logs.some((line) => /the adapter starts from /.test(line)),
      continued.logs.join("\n"),
    );
    const after = await exampleLosses(continued.id);
    t.diagnostic(`DPO after SFT: example losses ${after.map((l) => l.toFixed(3)).join(" ")}`);
    for (const loss of after) assert.ok(loss < Math.log(2) - 0.05, `example loss ${loss} < log 2`);
  },
);

/**
 * The largest difference between two adapter GGUFs' tensors (F32, F16 or Q8_0), as a share of the largest value of
 * that tensor in `b`.
 */
function adapterDifference(pythonPath: string, a: string, b: string): number {
  const script = [
    "import sys, numpy as np",
    "from gguf import GGUFReader",
    "from gguf.quants import dequantize",
    "read = lambda p: {t.name: dequantize(t.data, t.tensor_type).astype(np.float32) for t in GGUFReader(p).tensors}",
    "a, b = read(sys.argv[1]), read(sys.argv[2])",
    "assert a.keys() == b.keys() and len(a) > 0, (sorted(a), sorted(b))",
    "print(max(float(np.abs(a[n] - b[n]).max() / max(np.abs(b[n]).max(), 1e-12)) for n in a))",
  ].join("\n");
  const result = spawnSync(pythonPath, ["-c", script, a, b], { encoding: "utf8" });
  assert.equal(result.status, 0, result.stderr);
  return Number(result.stdout.trim());
}

test(
  "a DPO job started from an adapter reads it back as it was written: barely trained, it exports the same adapter",
  { skip: python.ok ? false : python.reason, timeout: 300_000 },
  async (t) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-dpo-"));
    t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
    const model = path.join(dir, "tiny-gqa.gguf");
    // Llama with grouped-query attention: the Q and K rows of lora_b are permuted differently in llama.cpp's layout.
    await createTinyModel(model, { seed: 3, embeddingLength: 128, headCount: 4, headCountKv: 2 });
    const samplesFile = path.join(dir, "samples.jsonl");
    const turn = (i: number, answer: string) => [
      { text: `<|im_start|>user\nitem ${i}<|im_end|>\n<|im_start|>assistant\n`, train: false },
      { text: `${answer}<|im_end|>`, train: true },
    ];
    fs.writeFileSync(
      samplesFile,
      Array.from({ length: 4 }, (_, i) =>
        JSON.stringify({ sample: turn(i, `value ${i}`), rejected: turn(i, "no") }),
      ).join("\n"),
    );
    const common = {
      method: "lora" as const,
      lora: {
        rank: 4,
        alpha: 8,
        targets: ["attn_q" as const, "attn_k" as const, "attn_v" as const, "ffn_down" as const],
      },
      baseModelPath: model,
      samplesFile,
      seed: 0,
      lrSchedule: { kind: "constant" as const },
      options: { python: python.ok ? python.python : "" },
    };
    const supervised = path.join(dir, "supervised.gguf");
    const sft = await startTrainer(
      torchJob({
        ...common,
        outputPath: supervised,
        workDir: path.join(dir, "sft"),
        learningRate: 0.01,
        epochs: 2,
        // Served adapters are Q8_0 by default (CONDUIT_ADAPTER_TYPE): it is read back dequantized.
        outputType: "Q8_0",
      }),
    ).done;
    assert.equal(sft.status, "completed", JSON.stringify(sft));
    const continued = path.join(dir, "dpo.gguf");
    const logs: string[] = [];
    const dpo = await startTrainer(
      torchJob({
        ...common,
        outputPath: continued,
        workDir: path.join(dir, "dpo"),
        // A step too small to move the weights: what is written is what was read.
        optimizer: "sgd",
        learningRate: 1e-9,
        epochs: 1,
        packing: false,
        preference: { beta: 0.1, initAdapterPath: supervised },
      }),
      { onLog: (line) => logs.push(line) },
    ).done;
    assert.equal(dpo.status, "completed", `${JSON.stringify(dpo)}\n${logs.join("\n")}`);
    assert.ok(
      logs.some((line) => line.includes("the adapter starts from supervised.gguf")),
      logs.join("\n"),
    );
    const worst = adapterDifference(common.options.python, continued, supervised);
    // Q8_0 read, F16 written: a permutation read back wrong would differ by the tensor's whole size.
    assert.ok(worst < 1e-2, `the exported adapter differs from the one it started from by ${worst}`);
  },
);
