/**
 * What packing does to a conversation: the trainer packs several conversations into one window (one
 * sequence in llama.cpp's training batch, no attention mask between them), so during training an
 * answer is predicted with the earlier conversations of its window in view, where at inference it
 * stands alone. This trains a LoRA adapter on the date task with packing (the default), then scores
 * every held-out answer twice with the trained model: alone (as served) and after other training
 * conversations (as in a packed window). If the two losses are close, the model has learned to ignore
 * what came before, and packing costs nothing in quality; the steps line says what it saves in time.
 *
 *   node --import tsx bench/packing.ts [smollm2-135m|file.gguf] [--train 40] [--held 40] [--epochs 3]
 *     [--before 4] [--threads 1]
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { getLlama, LlamaLogLevel, type ControlledEvaluateInputItem, type Token } from "node-llama-cpp";
import { formatExample } from "../src/train/samples.ts";
import { LLAMA_CPP_LORA_TARGETS } from "../src/train/native/llamaCppTrainer.ts";
import { startTrainer, type SampleSegment } from "../src/train/trainer.ts";
import { llamaCppJob } from "../test/lib/trainerJob.ts";
import { datesTask } from "./lib/qualityTasks.ts";
import { modelPath, requireFile, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    train: { type: "string", default: "40" },
    held: { type: "string", default: "40" },
    epochs: { type: "string", default: "3" },
    before: { type: "string", default: "4" },
    threads: { type: "string", default: "1" },
  },
});
const modelArg = positionals[0] ?? "smollm2-135m";
const base = requireFile(
  modelArg.endsWith(".gguf") ? path.resolve(modelArg) : modelPath(modelArg as BenchModel),
);
const ref = { id: "base", path: base };
const pairs = datesTask.pairs(Number(values.train) + Number(values.held));
const held = pairs.slice(0, Number(values.held));
const train = pairs.slice(held.length);
const segmentsOf = async (pair: { input: string; output: string }) => {
  const { sample } = await formatExample(ref, datesTask.system, pair.input, pair.output, false);
  return sample as readonly SampleSegment[];
};
const trainSamples = await Promise.all(train.map(segmentsOf));
const heldSamples = await Promise.all(held.map(segmentsOf));

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-packing-"));
try {
  const started = performance.now();
  const logs: string[] = [];
  const outcome = await startTrainer(
    llamaCppJob({
      method: "lora",
      lora: { rank: 16, alpha: 32, targets: [...LLAMA_CPP_LORA_TARGETS] },
      baseModelPath: base,
      outputPath: path.join(dir, "adapter.gguf"),
      workDir: path.join(dir, "work"),
      samples: trainSamples,
      learningRate: 1e-3,
      epochs: Number(values.epochs),
      lrSchedule: { kind: "cosine", minFraction: 0.1 },
      seed: 0,
      threads: Number(values.threads),
    }),
    { onLog: (line) => logs.push(line) },
  ).done;
  if (outcome.status !== "completed")
    throw new Error(`training ${outcome.status}: ${JSON.stringify(outcome)}`);
  const seconds = (performance.now() - started) / 1000;

  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.error,
    logger: () => {},
  });
  const model = await llama.loadModel({ modelPath: base });
  const context = await model.createContext({
    contextSize: 1024,
    threads: Number(values.threads),
    lora: { adapters: [{ filePath: outcome.outputPath }] },
  });
  const sequence = context.getSequence();
  const bos = model.tokens.shouldPrependBosToken && model.tokens.bos !== null ? [model.tokens.bos] : [];
  /** Tokens of a conversation as the trainer has them: BOS (if the vocab asks), each segment in turn. */
  const tokensOf = (segments: readonly SampleSegment[]) =>
    segments.map((segment, i) => [...(i === 0 ? bos : []), ...model.tokenize(segment.text, true)]);
  /** Mean loss (nats) of the answer's tokens and the end label after it, following `prefix` + the prompt, as the trainer counts it. */
  const answerLoss = async (prefix: Token[], segments: readonly SampleSegment[]) => {
    const [prompt = [], answer = []] = tokensOf(segments);
    const input: Token[] = [...prefix, ...prompt, ...answer, model.tokens.eos ?? (0 as Token)];
    const first = prefix.length + prompt.length;
    await sequence.clearHistory();
    const out = await sequence.controlledEvaluate(
      input.slice(0, -1).map((token, i): ControlledEvaluateInputItem =>
        i >= first - 1 && i < input.length - 1
          ? [
              token,
              {
                generateNext: {
                  probabilities: true,
                  options: { temperature: 1, topK: 0, topP: 1, minP: 0 },
                },
              },
            ]
          : token,
      ),
    );
    let sum = 0;
    for (let i = first - 1; i < input.length - 1; i++) {
      const probability = out[i]?.next?.probabilities?.get(input[i + 1]!) ?? 0;
      sum += -Math.log(Math.max(probability, 1e-12));
    }
    return sum / (answer.length + 1);
  };
  let alone = 0;
  let packed = 0;
  let exact = 0;
  const before = Number(values.before);
  for (const [i, segments] of heldSamples.entries()) {
    alone += await answerLoss([], segments);
    // The conversations a packed window would hold before it: whole training conversations.
    const prefix = Array.from({ length: before }, (_, k) =>
      tokensOf(trainSamples[(i * 7 + k * 3) % trainSamples.length]!).flat(),
    ).flat();
    packed += await answerLoss(prefix, segments);
    await sequence.clearHistory();
    const generated: Token[] = [];
    for await (const token of sequence.evaluate(tokensOf(segments)[0]!, { temperature: 0 })) {
      if (model.isEogToken(token) || generated.length >= datesTask.maxTokens) break;
      generated.push(token);
    }
    if (datesTask.correct(model.detokenize(generated), held[i]!)) exact += 1;
  }
  // The scorer against the trainer's own per-example loss, on training pairs (a packed-window measure):
  // close values say both measure the same thing.
  const check = Math.min(8, trainSamples.length);
  let scorer = 0;
  let trainer = 0;
  for (let i = 0; i < check; i++) {
    scorer += await answerLoss([], trainSamples[i]!);
    trainer += outcome.examples.train[i]?.loss ?? Number.NaN;
  }
  await context.dispose();
  await model.dispose();
  await llama.dispose();

  const { stats } = outcome;
  console.log(
    `model ${path.basename(base)}; dates task, ${train.length} training pairs, ${held.length} held out; LoRA rank 16, ` +
      `lr 0.001, ${values.epochs} epochs, ${values.threads} thread(s)`,
  );
  console.log(
    `trained with packing: ${stats.steps} steps in ${seconds.toFixed(0)} s (${Math.round(stats.tokensPerSecond)} tok/s); ` +
      `one conversation per window would take ${train.length * Number(values.epochs)} steps ` +
      `(${((train.length * Number(values.epochs)) / stats.steps).toFixed(1)}x)`,
  );
  console.log(
    `held-out answer loss: alone ${(alone / held.length).toFixed(4)} nats/token, after ${before} other conversations ` +
      `${(packed / held.length).toFixed(4)} (ratio ${(packed / alone).toFixed(3)}); exact match alone ${exact}/${held.length}`,
  );
  console.log(
    `check: first ${check} training pairs scored alone ${(scorer / check).toFixed(4)}, by the trainer ${(trainer / check).toFixed(4)} ` +
      "(both count the answer and the end label)",
  );
} finally {
  fs.rmSync(dir, { recursive: true, force: true });
}
