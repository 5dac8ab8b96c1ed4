/**
 * Peak memory of the trainer process as the dataset grows. Generates IO pairs (1k, 10k, 100k by
 * default), formats them with the chat template as the scheduler does (10% held out for eval loss),
 * and trains a LoRA adapter on a generated tiny model for a few steps; the trainer still tokenizes
 * every example, plans the epoch, evaluates the held-out set and measures every example's loss, which
 * is where memory grew with the dataset. Each size runs in a process of its own, so the second memory
 * column (this bench's own process, which formats the examples and starts the trainer, as the API
 * process does) is per size too.
 *
 *   node --import tsx bench/trainMemory.ts [--pairs 1000,10000,100000] [--steps 20] [--feed files|lists]
 *
 * `--feed files` (the default) gives the trainer its examples as the scheduler does: JSONL files
 * written as the pairs are formatted (`samplesFile`), losses to a file. `--feed lists` puts them in the
 * job itself, as the scheduler did before; a trainer older than `samplesFile` only takes that, so the
 * "before" figures come from this file run with `--feed lists` in a checkout of that commit.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";
import { createTinyModel } from "../src/model/tinyModel.ts";
import { LLAMA_CPP_LORA_TARGETS } from "../src/train/native/llamaCppTrainer.ts";
import { formatExample } from "../src/train/samples.ts";
import { startTrainer, type TrainingSample } from "../src/train/trainer.ts";
import { llamaCppJob } from "../test/lib/trainerJob.ts";

const { values } = parseArgs({
  options: {
    pairs: { type: "string", default: "1000,10000,100000" },
    steps: { type: "string", default: "20" },
    feed: { type: "string", default: "files" },
    one: { type: "string" },
    model: { type: "string" },
  },
});
const feed = values.feed === "lists" ? "lists" : "files";
const MiB = 2 ** 20;

interface Measured {
  pairs: number;
  feed: string;
  trainerPeakRss: number;
  benchPeakRss: number;
  steps: number;
  exampleTokens: number;
  seconds: number;
}

/** Pair `i`: a sum with a sentence around it, of varied length. */
function pair(i: number): { input: string; output: string } {
  const a = (i * 7919) % 1000;
  const b = (i * 104729) % 1000;
  const words = ["please", "quickly", "carefully", "now", "for me", "again"];
  const extra = Array.from({ length: i % 6 }, (_, k) => words[(i + k) % words.length]).join(" ");
  return { input: `What is ${a} plus ${b}? ${extra}`.trim(), output: `${a} plus ${b} is ${a + b}.` };
}

async function measureOne(pairs: number, model: string): Promise<Measured> {
  const base = { id: "tiny", path: model };
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-train-memory-"));
  try {
    const train: TrainingSample[] = [];
    const held: TrainingSample[] = [];
    const trainFile = path.join(dir, "train.jsonl");
    const heldFile = path.join(dir, "validation.jsonl");
    const trainOut = feed === "files" ? fs.openSync(trainFile, "w") : undefined;
    const heldOut = feed === "files" ? fs.openSync(heldFile, "w") : undefined;
    for (let i = 0; i < pairs; i++) {
      const { input, output } = pair(i);
      const { sample } = await formatExample(base, "", input, output, false);
      const isHeld = i % 10 === 9;
      if (trainOut === undefined) (isHeld ? held : train).push(sample);
      else fs.writeSync(isHeld ? heldOut! : trainOut, `${JSON.stringify({ input, output, sample })}\n`);
    }
    if (trainOut !== undefined) fs.closeSync(trainOut);
    if (heldOut !== undefined) fs.closeSync(heldOut);
    const job = llamaCppJob({
      method: "lora",
      lora: { rank: 8, alpha: 16, targets: [...LLAMA_CPP_LORA_TARGETS] },
      baseModelPath: model,
      outputPath: path.join(dir, "adapter.gguf"),
      workDir: path.join(dir, "work"),
      learningRate: 1e-3,
      epochs: 1,
      maxSteps: Number(values.steps),
      contextSize: 1024,
      seed: 0,
      lrSchedule: { kind: "constant" },
      ...(feed === "files"
        ? { samplesFile: trainFile, evalSamplesFile: heldFile, lossesFile: path.join(dir, "losses.jsonl") }
        : { samples: train, evalSamples: held }),
    });
    const started = performance.now();
    const outcome = await startTrainer(job).done;
    if (outcome.status !== "completed")
      throw new Error(`training ${pairs} pairs: ${JSON.stringify(outcome)}`);
    return {
      pairs,
      feed,
      trainerPeakRss: outcome.stats.peakRssBytes,
      benchPeakRss: process.resourceUsage().maxRSS * 1024,
      steps: outcome.stats.steps,
      exampleTokens: outcome.stats.sampleTokens,
      seconds: (performance.now() - started) / 1000,
    };
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

if (values.one !== undefined) {
  const measured = await measureOne(Number(values.one), values.model!);
  process.stdout.write(`${JSON.stringify(measured)}\n`);
} else {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-train-memory-model-"));
  try {
    const model = path.join(dir, "tiny.gguf");
    await createTinyModel(model, { seed: 1 });
    const rows: Measured[] = [];
    for (const pairs of values.pairs.split(",").map(Number)) {
      const out = execFileSync(
        process.execPath,
        [
          "--import",
          "tsx",
          fileURLToPath(import.meta.url),
          "--one",
          String(pairs),
          "--model",
          model,
          "--feed",
          feed,
          "--steps",
          values.steps,
        ],
        { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"], maxBuffer: 16 * MiB },
      );
      const row = JSON.parse(out.trim().split("\n").at(-1)!) as Measured;
      rows.push(row);
      console.error(`${pairs} pairs: trainer ${Math.round(row.trainerPeakRss / MiB)} MiB`);
    }
    console.log(
      `feed: ${feed}; LoRA rank 8 on the generated tiny model, ${values.steps} steps, 10% held out`,
    );
    console.log("| pairs | trainer peak RSS | bench process peak RSS | trainer seconds |");
    console.log("| ----: | ---------------: | ---------------------: | --------------: |");
    for (const row of rows)
      console.log(
        `| ${row.pairs} | ${Math.round(row.trainerPeakRss / MiB)} MiB | ${Math.round(row.benchPeakRss / MiB)} MiB | ` +
          `${row.seconds.toFixed(1)} |`,
      );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
