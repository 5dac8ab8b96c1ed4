/**
 * Checks an adapter the torch worker trained elsewhere (a GPU) against llama.cpp serving it here on the CPU:
 * writes the GGUF adapter from the worker's raw tensors (the service's own writer), computes llama.cpp's
 * logits for the job's probe tokens (a held-out prompt and its expected answer) with and without it, and
 * compares them with the worker's logits for the same tokens.
 *
 *   node --import tsx bench/gpu/checkAdapter.ts JOB_DIR MODEL.gguf [RESULT_DIR]
 *
 * JOB_DIR holds job.json (bench/trainTorch.ts --export ... --task dates); RESULT_DIR (default JOB_DIR) the
 * worker's trained.adapter.f32 and probe.f32.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { loadLlamaLib } from "../../src/train/libllama/llamaLib.ts";
import { writeTrainedAdapter, type LoraWeight } from "../../src/train/core/loraAdapter.ts";
import { readModelFile } from "../../src/train/core/modelFile.ts";
import { llamaCppLogits } from "../../src/train/native/probeLogits.ts";
import { readAdapterValues } from "../../src/train/torch/runTorchTraining.ts";

const [jobDir, modelFile, resultArg] = process.argv.slice(2);
if (jobDir === undefined || modelFile === undefined) {
  console.error("usage: checkAdapter.ts JOB_DIR MODEL.gguf [RESULT_DIR]");
  process.exit(2);
}
const resultDir = resultArg ?? jobDir;
const job = JSON.parse(fs.readFileSync(path.join(jobDir, "job.json"), "utf8")) as {
  lora: { rank: number; alpha: number; targets: string[]; weights: LoraWeight[] };
  probe: { tokens: number[] };
};
const lib = loadLlamaLib();
const baseInfo = readModelFile(lib, modelFile);
const values = readAdapterValues(
  path.join(resultDir, "trained.adapter.f32"),
  job.lora.weights,
  job.lora.rank,
);
const adapter = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "conduit-check-")), "adapter.gguf");
const bytes = await writeTrainedAdapter(
  baseInfo,
  adapter,
  job.lora.weights,
  { rank: job.lora.rank, alpha: job.lora.alpha, targets: job.lora.targets as never, complexity: 1 },
  values,
  "F16",
);
const tokens = job.probe.tokens;
const llama = llamaCppLogits(modelFile, adapter, tokens);
const plain = llamaCppLogits(modelFile, null, tokens);
const vocab = llama[0]!.length;
const torchBytes = fs.readFileSync(path.join(resultDir, "probe.f32"));
const torch = new Float32Array(torchBytes.buffer, torchBytes.byteOffset, torchBytes.byteLength / 4);
if (torch.length !== tokens.length * vocab)
  throw new Error(`probe.f32 holds ${torch.length} values, not ${tokens.length} x ${vocab}`);
const argmax = (row: ArrayLike<number>, offset = 0) => {
  let best = 0;
  for (let v = 1; v < vocab; v++) if (row[offset + v]! > row[offset + best]!) best = v;
  return best;
};
// The answer: the positions after the last "<|im_start|>assistant\n" of the prompt (SmolLM2's template), up to the end.
let answerStart = 0;
for (let p = 0; p + 1 < tokens.length; p++) if (tokens[p] === 1) answerStart = p + 3;
let agree = 0;
let torchRight = 0;
let llamaRight = 0;
let plainRight = 0;
let worst = 0;
let scale = 0;
let moved = 0;
const answer = tokens.length - 1 - answerStart;
for (let p = 0; p < tokens.length; p++) {
  const t = argmax(torch, p * vocab);
  const l = argmax(llama[p]!);
  if (t === l) agree++;
  if (p >= answerStart && p + 1 < tokens.length) {
    if (t === tokens[p + 1]) torchRight++;
    if (l === tokens[p + 1]) llamaRight++;
    if (argmax(plain[p]!) === tokens[p + 1]) plainRight++;
  }
  for (let v = 0; v < vocab; v++) {
    worst = Math.max(worst, Math.abs(torch[p * vocab + v]! - llama[p]![v]!));
    moved = Math.max(moved, Math.abs(llama[p]![v]! - plain[p]![v]!));
    scale = Math.max(scale, Math.abs(torch[p * vocab + v]!));
  }
}
console.log(
  JSON.stringify({
    adapterBytes: bytes,
    positions: tokens.length,
    top1Agreement: `${agree}/${tokens.length}`,
    answerTokens: answer,
    answerRight: { torch: torchRight, llamaCpp: llamaRight, baseOnly: plainRight },
    largestLogitDifference: worst,
    largestLogit: scale,
    adapterMovedLogitsBy: moved,
  }),
);
