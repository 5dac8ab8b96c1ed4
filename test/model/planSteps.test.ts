/**
 * One plan: the plan a run's estimate is made from at creation (`planTrainingData`, the samples tokenized with
 * the base model's vocabulary alone) is the plan each trainer runs: the torch trainer's (the windows and steps it
 * writes for its worker) and the llama.cpp trainer's (the steps it trains), for datasets of several shapes, with
 * a held-out set or not, a steps cap, and epochs chosen by `auto`.
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { chooseAutoSettings } from "../../src/train/autoSettings.ts";
import { planTrainingData } from "../../src/train/core/planTrainingData.ts";
import type { TokenStore } from "../../src/train/core/sampleStore.ts";
import { planSettingsOf } from "../../src/train/prepareSamples.ts";
import { prepare } from "../../src/train/torch/runTorchTraining.ts";
import { startTrainer, type TrainingSample } from "../../src/train/trainer.ts";
import { runDefaults, type RunConfig } from "../../src/domain/runs.ts";
import { llamaCppJob, torchJob, type JobInput } from "../lib/trainerJob.ts";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-plan-"));
let model: string;

before(async () => {
  model = path.join(dir, "tiny.gguf");
  await createTinyModel(model, { seed: 5 });
});
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const words = ["red", "blue", "green", "stone", "river", "cloud", "seven", "north", "lamp", "quiet"];

/** A chat pair as the scheduler formats it: the prompt, then the answer that is trained on. */
function pair(i: number, answerWords: number): TrainingSample {
  const answer = Array.from({ length: answerWords }, (_, k) => words[(i * 7 + k * 3) % words.length]).join(
    " ",
  );
  return [
    {
      text: `<|im_start|>user\nitem ${i}: ${words[i % words.length]}<|im_end|>\n<|im_start|>assistant\n`,
      train: false,
    },
    { text: `${answer} ${i}<|im_end|>`, train: true },
  ];
}

/** Samples written as the scheduler writes them (`{"input","output","sample"}` lines). */
function writeSamples(name: string, samples: TrainingSample[]): string {
  const file = path.join(dir, `${name}.jsonl`);
  fs.writeFileSync(
    file,
    samples.map((sample, i) => JSON.stringify({ input: `item ${i}`, output: "", sample })).join("\n") + "\n",
  );
  return file;
}

interface Scenario {
  name: string;
  train: TrainingSample[];
  held: TrainingSample[];
  /** Epochs, or `auto` (chosen from the pairs as a run's creation does). */
  epochs: number | "auto";
  steps: number | null;
  seed: number;
}

const scenarios: Scenario[] = [
  {
    name: "12 short pairs, epochs from auto",
    train: Array.from({ length: 12 }, (_, i) => pair(i, 2)),
    held: [],
    epochs: "auto",
    steps: null,
    seed: 42,
  },
  {
    name: "60 pairs of mixed lengths and 8 held out, 2 epochs",
    train: Array.from({ length: 60 }, (_, i) => pair(i, 1 + ((i * 5) % 23))),
    held: Array.from({ length: 8 }, (_, i) => pair(100 + i, 4)),
    epochs: 2,
    steps: null,
    seed: 7,
  },
  {
    name: "long answers (a 512-token window), 3 epochs cut at 7 steps",
    train: Array.from({ length: 20 }, (_, i) => pair(i, i % 4 === 0 ? 60 : 5)),
    held: Array.from({ length: 3 }, (_, i) => pair(200 + i, 5)),
    epochs: 3,
    steps: 7,
    seed: 3,
  },
  {
    name: "an epoch over 100 steps (evaluated every quarter)",
    train: Array.from({ length: 110 }, (_, i) => pair(i, 40)),
    held: Array.from({ length: 4 }, (_, i) => pair(300 + i, 40)),
    epochs: 1,
    steps: null,
    seed: 11,
  },
];

function settingsOf(scenario: Scenario) {
  const epochs =
    scenario.epochs === "auto"
      ? chooseAutoSettings({
          method: "lora",
          pairs: scenario.train.length,
          characters: 1000,
          model: { embeddingLength: 64, contextLength: 1024 },
        }).epochs
      : scenario.epochs;
  const config = {
    ...runDefaults,
    epochs,
    steps: scenario.steps,
    seed: scenario.seed,
  } as unknown as RunConfig;
  return planSettingsOf(config, null);
}

describe("the plan at creation is the trainers' plan", () => {
  for (const [index, scenario] of scenarios.entries())
    test(scenario.name, async () => {
      const work = path.join(dir, `s${index}`);
      const samplesFile = writeSamples(`train-${index}`, scenario.train);
      const evalSamplesFile = scenario.held.length > 0 ? writeSamples(`held-${index}`, scenario.held) : null;
      const settings = settingsOf(scenario);
      const files = { samples: [], samplesFile, evalSamples: [], evalSamplesFile };
      const planned = await planTrainingData(model, {
        ...settings,
        ...files,
        workDir: path.join(work, "plan"),
      });
      assert.equal(
        planned.steps,
        planned.stepsPerEpoch.reduce((a, b) => a + b, 0),
      );
      if (scenario.steps !== null) assert.equal(planned.steps, scenario.steps);

      const input: JobInput = {
        method: "lora",
        lora: { rank: 4, alpha: 8, targets: ["attn_q", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] },
        baseModelPath: model,
        learningRate: 1e-3,
        ...settings,
        ...files,
        outputPath: path.join(work, "adapter.gguf"),
        workDir: path.join(work, "torch"),
      };

      // The torch trainer: the windows and evaluation points it hands its worker.
      const stores: TokenStore[] = [];
      fs.mkdirSync(input.workDir, { recursive: true });
      const torch = torchJob({ ...input, options: { python: "" } });
      if (torch.trainer !== "torch" || torch.lora === null) throw new Error("a torch LoRA job");
      try {
        const prepared = await prepare(
          torch,
          { ...torch.lora, complexity: torch.complexity },
          { log: () => undefined, isCancelled: () => false, yieldToEventLoop: () => Promise.resolve() },
          stores,
        );
        assert.ok(prepared);
        assert.deepEqual(prepared.workerJob.stepsPerEpoch, planned.stepsPerEpoch);
        assert.equal(prepared.workerJob.windowSize, planned.windowSize);
        assert.equal(prepared.workerJob.evaluationPoints.length, planned.evaluations);
      } finally {
        for (const store of stores) store.dispose();
      }

      // The llama.cpp trainer: what it trained.
      const logs: string[] = [];
      const outcome = await startTrainer(llamaCppJob({ ...input, workDir: path.join(work, "llama") }), {
        onLog: (line) => logs.push(line),
      }).done;
      assert.equal(outcome.status, "completed", JSON.stringify(outcome));
      if (outcome.status !== "completed") return;
      assert.equal(outcome.stats.steps, planned.steps);
      assert.equal(outcome.stats.epochs, planned.stepsPerEpoch.length);
      assert.equal(outcome.stats.windowSize, planned.windowSize);
      assert.equal(outcome.stats.trainTokens, planned.steps * planned.windowSize);
      assert.equal(outcome.stats.sampleTokens, planned.sampleTokens);
      // Every phase after the last step says what it does: the best checkpoint, the losses, the writing.
      for (const phase of [
        // Without an eval set there is no best checkpoint: the last weights are written.
        ...(scenario.held.length > 0 ? [/trainer: (the last step is|writing) the best checkpoint/] : []),
        /trainer: measuring each example's loss .*\(\d+ windows\)/,
        /trainer: measured each example's loss in [\d.]+ s/,
        /trainer: writing the LoRA adapter/,
        /trainer: written in [\d.]+ s/,
      ])
        assert.ok(
          logs.some((line) => phase.test(line)),
          `${phase}: ${logs.join("\n")}`,
        );
    });
});
