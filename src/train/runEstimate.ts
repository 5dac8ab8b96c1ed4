/**
 * The estimate a run gets when it is created (`RunPlan`), before anything is tokenized: its tokens planned from
 * the dataset's size the way the trainers plan windows (`core/trainingPlan.ts`), and its rate measured on the
 * server's earlier runs of the same trainer, base model and method, or else its trainer's prior (scaled from the
 * trainer's benchmarks by the model's size and the threads: `TrainerBackend.prior`). How the plan is refined while the run trains is
 * `currentEstimate` (src/contract/estimate.ts).
 */
import fs from "node:fs/promises";
import { GgufFileType, readGgufFileInfo } from "node-llama-cpp";
import type { RunPlan } from "../contract/estimate.ts";
import type { TrainMethod } from "../contract/runs.ts";
import type { FinishedRun } from "../store/RunRepository.ts";
import type { EstimatePrior, ModelSize } from "./core/TrainerBackend.ts";

/** What the estimate reads from a base model's GGUF header. */
export interface ModelCost extends ModelSize {
  vocabSize: number;
  /** `{arch}.context_length`; 0 when the header has none. */
  contextLength: number;
}

/** The header's big arrays, which none of the fields above need. */
const IGNORED_KEYS = [
  "tokenizer.ggml.tokens",
  "tokenizer.ggml.scores",
  "tokenizer.ggml.token_type",
  "tokenizer.ggml.merges",
];
const costs = new Map<string, Promise<ModelCost>>();

/** A model file's size and shape (read once per version of the file). */
export async function readModelCost(file: string): Promise<ModelCost> {
  const stat = await fs.stat(file);
  const key = `${file}\0${stat.size}\0${stat.mtimeMs}`;
  let cost = costs.get(key);
  if (!cost) {
    cost = (async () => {
      const info = await readGgufFileInfo(file, {
        readTensorInfo: true,
        ignoreKeys: IGNORED_KEYS,
        logWarnings: false,
      });
      let parameters = 0;
      let vocabSize = 0;
      for (const tensor of info.fullTensorInfo ?? []) {
        parameters += tensor.dimensions.reduce<number>((product, d) => product * Number(d), 1);
        if (tensor.name === "token_embd.weight") vocabSize = Number(tensor.dimensions[1] ?? 0);
      }
      const context = (info.architectureMetadata as { context_length?: unknown }).context_length;
      const fileType = info.metadata.general?.file_type;
      const name =
        typeof fileType === "number"
          ? ((GgufFileType as unknown as Record<number, string | undefined>)[fileType] ?? null)
          : null;
      return {
        parameters,
        vocabSize,
        contextLength: typeof context === "number" ? context : 0,
        fileType: name === null ? null : name.replace(/^(MOSTLY|ALL)_/, ""),
        sizeBytes: stat.size,
      };
    })();
    cost.catch(() => costs.delete(key));
    if (costs.size >= 100) costs.delete(costs.keys().next().value as string);
    costs.set(key, cost);
  }
  return cost;
}

/** Pairs and bytes of a set of dataset files. */
export interface FileSet {
  pairs: number;
  /** The files' bytes less their format's characters around each pair (`{"input":…}`, CSV's commas). */
  textBytes: number;
}

/** Characters a file format puts around one pair: `{"input":"","output":""}` and its line break; CSV's comma and line break. */
export function formatOverhead(format: string): number {
  return format === "csv" ? 2 : 25;
}

export interface PlanInput {
  /** The run's trainer's prior, its speed before any run was measured here. */
  prior: EstimatePrior;
  method: TrainMethod;
  model: ModelCost;
  /** The pairs trained on (the dataset's, less its own validation file). */
  train: FileSet;
  /** A validation file's pairs; `null` holds out `evalFraction` of `train` once it has `minPairsForEval`. */
  validation: FileSet | null;
  evalFraction: number;
  minPairsForEval: number;
  epochs: number;
  /** The cap on optimizer steps; `null` for none. */
  steps: number | null;
  /** The longest training window (`config.contextSize`). */
  contextSize: number;
  /** Tokens the chat template (and the run's system prompt) adds to each pair. */
  templateTokens: number;
  /** Compute threads of the trainer. */
  threads: number;
  /** The latest READY runs of the same trainer, base model and method, newest first. */
  history: readonly FinishedRun[];
}

/** Window sizes are multiples of this (as `trainingPlan.ts` chooses them). */
const WINDOW_MULTIPLE = 256;
/** Epochs longer than this many steps are evaluated every quarter too (`trainingPlan.ts`). */
const LONG_EPOCH_STEPS = 100;

/**
 * Bytes of text per token: English in a byte-pair vocabulary of 16k tokens and more is about 4; small
 * vocabularies (the 510-token test model, stories260K's 512) split text into bytes and short pieces.
 */
export function bytesPerToken(vocabSize: number): number {
  if (vocabSize >= 16_000) return 4;
  if (vocabSize <= 256) return 1;
  return 1 + (3 * Math.log(vocabSize / 256)) / Math.log(16_000 / 256);
}

/**
 * Tokens of a chat template's text for one pair (`rendered`, the pair's own text left empty): each
 * control-token-like piece (`<|im_start|>`, `<s>`, `<start_of_turn>`) is one token, the rest is text.
 */
export function templateTokens(rendered: string, vocabSize: number): number {
  const controls = rendered.match(/<\|?[\w./-]{1,40}\|?>/g) ?? [];
  const text = rendered.replace(/<\|?[\w./-]{1,40}\|?>/g, "");
  return controls.length + text.length / bytesPerToken(vocabSize);
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}

/**
 * What the earlier runs measured: their training loop's rate (training tokens per second of steps and
 * evaluations), the seconds around it (`runSeconds` less the loop's: preparing the examples, starting the
 * trainer, loading, tokenizing, per-example losses, saving), and how many sample
 * tokens they trained against what their plans said (the tokenizer's true bytes per token, and the template's
 * tokens). `undefined` when none has the totals.
 */
export function measured(
  history: readonly FinishedRun[],
): { tokensPerSecond: number; overheadSeconds: number; tokenRatio: number; runs: number } | undefined {
  // The whole attempt's seconds; runs trained before those were recorded have the trainer's own.
  const wholeSeconds = (final: FinishedRun["final"]) => final.runSeconds ?? final.elapsedSeconds ?? 0;
  const usable = history.filter(
    ({ final }) =>
      (final.trainTokens ?? 0) > 0 &&
      (final.trainSeconds ?? 0) > 0 &&
      wholeSeconds(final) >= (final.trainSeconds ?? 0),
  );
  if (usable.length === 0) return undefined;
  let tokens = 0;
  let seconds = 0;
  for (const { final } of usable) {
    tokens += final.trainTokens!;
    seconds += final.trainSeconds!;
  }
  // Only whole runs say how many tokens a plan meant: not one resumed, stopped early or planned before estimates.
  const ratios = usable.flatMap(({ final, plan }) =>
    plan !== null &&
    plan.sampleTokens > 0 &&
    (final.sampleTokens ?? 0) > 0 &&
    !final.stoppedEarly &&
    (final.resumedFromStep ?? 0) === 0
      ? [(final.sampleTokens! / plan.sampleTokens) * (plan.tokenRatio ?? 1)]
      : [],
  );
  return {
    tokensPerSecond: tokens / seconds,
    overheadSeconds: median(usable.map(({ final }) => wholeSeconds(final) - final.trainSeconds!)),
    tokenRatio: ratios.length > 0 ? median(ratios) : 1,
    runs: usable.length,
  };
}

/** The windows, steps and tokens a run will train, as the trainers plan them, from the dataset's size. */
export function planTokens(input: PlanInput, tokenRatio = 1) {
  const perToken = bytesPerToken(input.model.vocabSize);
  const tokensOf = (set: FileSet) =>
    set.pairs > 0
      ? Math.max(1, (set.textBytes / set.pairs / perToken + input.templateTokens) * tokenRatio)
      : 0;
  let trainPairs = input.train.pairs;
  let evalPairs = 0;
  let evalTokensPerPair = 0;
  const trainTokensPerPair = tokensOf(input.train);
  if (input.validation !== null) {
    evalPairs = input.validation.pairs;
    evalTokensPerPair = tokensOf(input.validation);
  } else if (trainPairs >= input.minPairsForEval && input.evalFraction > 0) {
    evalPairs = Math.max(1, Math.floor(trainPairs * input.evalFraction));
    trainPairs -= evalPairs;
    evalTokensPerPair = trainTokensPerPair;
  }
  trainPairs = Math.max(1, trainPairs);

  // The longest example sets the window: guessed at twice the mean.
  const cap = Math.max(
    1,
    Math.min(
      input.contextSize,
      input.model.contextLength > 0 ? input.model.contextLength : input.contextSize,
    ),
  );
  const longest = Math.min(cap, 2 * Math.max(trainTokensPerPair, evalTokensPerPair));
  const windowSize = Math.max(WINDOW_MULTIPLE, Math.ceil(longest / WINDOW_MULTIPLE) * WINDOW_MULTIPLE);
  const capacity = Math.min(windowSize, cap);
  // Examples are packed in order until the next does not fit: about half an example is left empty per window.
  const windows = (pairs: number, perPair: number) => {
    if (pairs === 0) return 0;
    const perWindow = perPair >= capacity ? 1 : Math.max(1, (capacity - perPair / 2) / Math.max(1, perPair));
    return Math.ceil(pairs / perWindow);
  };
  const stepsPerEpoch = windows(trainPairs, trainTokensPerPair);
  const steps = Math.min(input.epochs * stepsPerEpoch, input.steps ?? Number.POSITIVE_INFINITY);
  const epochs = steps / stepsPerEpoch;
  const evalWindows = windows(evalPairs, evalTokensPerPair);
  const evaluations = Math.ceil(epochs) * (stepsPerEpoch > LONG_EPOCH_STEPS ? 4 : 1);
  return {
    windowSize,
    steps,
    tokens: steps * windowSize,
    sampleTokens: Math.round(trainPairs * trainTokensPerPair * epochs),
    /** Window positions evaluated (forward only) during training. */
    evalTokens: evalWindows * windowSize * evaluations,
    /** Window positions of the per-example losses measured once training ends (forward only). */
    lossTokens: (stepsPerEpoch + evalWindows) * windowSize,
  };
}

/** The run's plan: its tokens, and its seconds at the measured rate, or the prior's. */
export function planRun(input: PlanInput): RunPlan {
  const earlier = measured(input.history);
  const planned = planTokens(input, earlier?.tokenRatio ?? 1);
  const base = {
    tokens: planned.tokens,
    sampleTokens: planned.sampleTokens,
    tokenRatio: earlier?.tokenRatio ?? 1,
    steps: planned.steps,
    windowSize: planned.windowSize,
  };
  if (earlier !== undefined) {
    // The measured rate counts the evaluations (their time is in the loop's); the overhead, the per-example losses.
    const seconds = earlier.overheadSeconds + planned.tokens / earlier.tokensPerSecond;
    return {
      basis: "measured",
      seconds,
      ...base,
      tokensPerSecond: earlier.tokensPerSecond,
      overheadSeconds: earlier.overheadSeconds,
      measuredRuns: earlier.runs,
    };
  }
  const { prior } = input;
  const rate = prior.tokensPerSecond(input.method, input.model, input.threads);
  // The loop steps and evaluates; per-example losses come after it, with the loading and saving.
  const forward = prior.forwardShare;
  const loopSeconds = (planned.tokens + forward * planned.evalTokens) / rate;
  const overheadSeconds = prior.overheadSeconds(input.model) + (forward * planned.lossTokens) / rate;
  return {
    basis: "prior",
    seconds: overheadSeconds + loopSeconds,
    ...base,
    tokensPerSecond: planned.tokens / loopSeconds,
    overheadSeconds,
    measuredRuns: 0,
  };
}
