/**
 * The estimate a run gets when it is created (`RunPlan`): its steps, windows and tokens from the plan its trainer
 * will run (`core/planTrainingData.ts`: the samples tokenized and planned as every trainer does), and its rate measured on the
 * server's earlier runs of the same trainer, base model and method, or else its trainer's prior (scaled from the
 * trainer's benchmarks by the model's size and the threads: `TrainerBackend.prior`), both for the share of the cores the
 * trainer can expect on a machine busy with other work ({@link cpuShare}). How the plan is refined while the run trains is
 * `currentEstimate` (src/contract/estimate.ts).
 */
import fs from "node:fs/promises";
import { GgufFileType, readGgufFileInfo } from "node-llama-cpp";
import type { RunPlan } from "../contract/estimate.ts";
import type { TrainMethod } from "../contract/runs.ts";
import type { FinishedRun } from "../store/RunRepository.ts";
import type { EstimatePrior, ModelSize } from "./core/TrainerBackend.ts";
import type { PlanSummary } from "./core/trainingPlan.ts";
import { median } from "./core/threadTuner.ts";

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
        file,
      };
    })();
    cost.catch(() => costs.delete(key));
    if (costs.size >= 100) costs.delete(costs.keys().next().value as string);
    costs.set(key, cost);
  }
  return cost;
}

export interface PlanInput {
  /** The run's trainer's prior, its speed before any run was measured here. */
  prior: EstimatePrior;
  method: TrainMethod;
  model: ModelCost;
  /** The run's plan: its samples tokenized and planned as its trainer will (`core/planTrainingData.ts`). */
  plan: PlanSummary;
  /** Compute threads of the trainer. */
  threads: number;
  /** The latest READY runs of the same trainer, base model and method, newest first. */
  history: readonly FinishedRun[];
  /** The share of their cores the trainer's threads can expect now ({@link cpuShare}). */
  cpuShare: number;
}

/**
 * The share of a core each of a trainer's `threads` can expect on `cores` cores with `load` other runnable threads
 * (their recent average when the run is created, `RecentLoad`): a core each while they all fit, else an even split. A
 * machine that serves chats, runs evals or another run while it trains gives the run less than its benchmarks had.
 */
export function cpuShare(load: number, cores: number, threads: number): number {
  return Math.min(1, cores / (Math.max(0, load) + threads));
}

/**
 * What the earlier runs measured: their training loop's rate (training tokens per second of steps and
 * evaluations) and the seconds around it (`runSeconds` less the loop's: preparing the examples, starting the
 * trainer, loading, tokenizing, per-example losses, saving), as on cores of their own: each run's seconds times
 * the CPU share its plan expected (`1` for plans made before they counted it). `undefined` when none has the totals.
 */
export function measured(
  history: readonly FinishedRun[],
): { tokensPerSecond: number; overheadSeconds: number; runs: number } | undefined {
  // The whole attempt's seconds; runs trained before those were recorded have the trainer's own.
  const wholeSeconds = (final: FinishedRun["final"]) => final.runSeconds ?? final.elapsedSeconds ?? 0;
  const usable = history.filter(
    ({ final }) =>
      (final.trainTokens ?? 0) > 0 &&
      (final.trainSeconds ?? 0) > 0 &&
      wholeSeconds(final) >= (final.trainSeconds ?? 0),
  );
  if (usable.length === 0) return undefined;
  const share = (plan: RunPlan | null) => plan?.cpuShare ?? 1;
  let tokens = 0;
  let seconds = 0;
  for (const { final, plan } of usable) {
    tokens += final.trainTokens!;
    seconds += final.trainSeconds! * share(plan);
  }
  return {
    tokensPerSecond: tokens / seconds,
    overheadSeconds: median(
      usable.map(({ final, plan }) => (wholeSeconds(final) - final.trainSeconds!) * share(plan)),
    ),
    runs: usable.length,
  };
}

/** The window positions a plan trains, evaluates during training and measures per-example losses on. */
export function planTokens(plan: PlanSummary) {
  // A preference pair is two windows; its reference pass is a forward pass more of each, once.
  const windows = plan.pairs ? 2 : 1;
  return {
    tokens: plan.steps * plan.windowSize * windows,
    /** Window positions evaluated (forward only) during training. */
    evalTokens: plan.evalWindows * plan.windowSize * plan.evaluations * windows,
    /** Window positions of the per-example losses (and of a preference run's reference pass), forward only. */
    lossTokens: plan.lossWindows * plan.windowSize * windows * windows,
  };
}

/** The run's plan: its tokens, and its seconds at the measured rate, or the prior's, times the CPU share. */
export function planRun(input: PlanInput): RunPlan {
  const earlier = measured(input.history);
  const share = input.cpuShare;
  const planned = planTokens(input.plan);
  const base = {
    tokens: planned.tokens,
    sampleTokens: input.plan.sampleTokens,
    tokenRatio: 1,
    steps: input.plan.steps,
    windowSize: input.plan.windowSize,
    cpuShare: share,
  };
  if (earlier !== undefined) {
    // The measured rate counts the evaluations (their time is in the loop's); the overhead, the per-example losses.
    const tokensPerSecond = earlier.tokensPerSecond * share;
    const overheadSeconds = earlier.overheadSeconds / share;
    return {
      basis: "measured",
      seconds: overheadSeconds + planned.tokens / tokensPerSecond,
      ...base,
      tokensPerSecond,
      overheadSeconds,
      measuredRuns: earlier.runs,
    };
  }
  const { prior } = input;
  const rate = prior.tokensPerSecond(input.method, input.model, input.threads) * share;
  // The loop steps and evaluates; per-example losses come after it, with the loading and saving.
  const forward = prior.forwardShare;
  const loopSeconds = (planned.tokens + forward * planned.evalTokens) / rate;
  const overheadSeconds = prior.overheadSeconds(input.model) / share + (forward * planned.lossTokens) / rate;
  return {
    basis: "prior",
    seconds: overheadSeconds + loopSeconds,
    ...base,
    tokensPerSecond: planned.tokens / loopSeconds,
    overheadSeconds,
    measuredRuns: 0,
  };
}
