/**
 * The torch worker's inputs of a preference-tuning (DPO) job. Each example is a pair of conversations that
 * share their prompt: the one ending with the preferred answer (the job's `sample`, planned into the run's steps
 * like any sample, one window each) and the one ending with the non-preferred answer (`rejected`). Both are
 * written as windows of one size, in example order, for the reference pass (each example's two log-probabilities
 * under the starting model, computed once), the evaluations and the per-example losses; the steps name the
 * example each trains on.
 */
import path from "node:path";
import type { TrainingHooks } from "../core/TrainerBackend.ts";
import type { PreferenceJobOptions, TrainerJob } from "../core/trainerJob.ts";
import { packWindows, type TrainingWindow } from "../core/packWindows.ts";
import type { TokenStore } from "../core/sampleStore.ts";
import { TrainingPlan } from "../core/trainingPlan.ts";

/** Window sizes are multiples of this, as the plan's. */
const WINDOW_MULTIPLE = 256;

/** What the worker is given of a preference job (`worker.py`'s `dpo`). */
export interface PreferenceWorkerJob {
  beta: number;
  /** The LoRA adapter GGUF the trained adapter starts from; `null`: a new adapter, the base is the reference. */
  initAdapter: string | null;
  /** The training examples in order: preferred and non-preferred windows, record k of each the example k. */
  train: { chosen: string; rejected: string; count: number };
  eval: { chosen: string; rejected: string; count: number } | null;
  /** The training example of every optimizer step's window, in step order (`train.file` holds its preferred window). */
  steps: number[];
}

/** One sample alone in a window of `size` positions (its first `capacity` hold it). */
function windowOf(
  store: TokenStore,
  index: number,
  size: number,
  capacity: number,
  end: number,
): TrainingWindow {
  const window = packWindows([store.read(index)], [0], size, end, true, capacity)[0];
  if (window === undefined) throw new Error(`trainer: example ${index + 1} is empty`);
  return window;
}

/**
 * The window size of a preference job: the plan's (which fits every preferred conversation), grown to fit the
 * non-preferred ones; one longer than the run's `contextSize` or the model's trained context is an error naming it.
 */
export function preferenceWindow(
  plan: TrainingPlan,
  rejected: { train: TokenStore; eval: TokenStore },
  contextSize: number,
  modelContext: number,
): { size: number; capacity: number } {
  const cap = Math.max(1, Math.min(contextSize, modelContext > 0 ? modelContext : contextSize));
  let longest = plan.windowSize;
  for (const [split, store] of [
    ["training", rejected.train],
    ["validation", rejected.eval],
  ] as const)
    for (let i = 0; i < store.size; i++) {
      const length = store.length(i);
      if (length > cap)
        throw new Error(
          `trainer: ${split} example ${i + 1}'s non-preferred conversation is ${length} tokens long, more than ` +
            `the longest training window of ${cap} tokens (${cap === modelContext ? "the model's trained context" : "the run's contextSize"}); ` +
            "shorten or remove it",
        );
      longest = Math.max(longest, length);
    }
  const size = Math.ceil(longest / WINDOW_MULTIPLE) * WINDOW_MULTIPLE;
  return { size, capacity: Math.min(size, cap) };
}

/**
 * Writes a preference job's windows to its work directory: every step's preferred window (`train.windows`, what
 * the worker's loop counts), each split's preferred and non-preferred windows in example order. `undefined`
 * when cancelled meanwhile. `write` writes windows to a file (the torch trainer's window format).
 */
export async function writePreferenceInputs(
  job: Pick<TrainerJob, "workDir"> & { preference: PreferenceJobOptions },
  plan: TrainingPlan,
  rejected: { train: TokenStore; eval: TokenStore },
  window: { size: number; capacity: number },
  write: (file: string, windows: Iterable<TrainingWindow>) => void,
  hooks: Pick<TrainingHooks, "isCancelled" | "yieldToEventLoop">,
): Promise<{ trainFile: string; evaluationPoints: number[]; dpo: PreferenceWorkerJob } | undefined> {
  const file = (name: string) => path.join(job.workDir, name);
  const { size, capacity } = window;
  const end = plan.endToken;
  const steps: number[] = [];
  const evaluationPoints: number[] = [];
  for (const epoch of plan.epochPlans()) {
    for (let k = 0; k < epoch.steps; k++) {
      // One example a window: the window's one span is the example.
      const span = plan.trainWindow(epoch, k).spans[0];
      if (span === undefined) throw new Error(`trainer: step ${steps.length + 1} has no example`);
      steps.push(span.sample);
      if (TrainingPlan.evaluatesAfter(epoch, k)) evaluationPoints.push(steps.length);
    }
    await hooks.yieldToEventLoop();
    if (hooks.isCancelled()) return undefined;
  }
  const trainFile = file("train.windows");
  write(
    trainFile,
    steps.map((index) => windowOf(plan.train, index, size, capacity, end)),
  );
  const inOrder = (store: TokenStore, name: string) => {
    const out = file(name);
    const windows = function* () {
      for (let i = 0; i < store.size; i++) yield windowOf(store, i, size, capacity, end);
    };
    write(out, windows());
    return out;
  };
  const split = (chosen: TokenStore, other: TokenStore, name: string) => {
    if (chosen.size !== other.size)
      throw new Error(
        `trainer: ${chosen.size} preferred and ${other.size} non-preferred ${name} conversations; they come in pairs`,
      );
    return {
      chosen: inOrder(chosen, `preference-${name}-chosen.windows`),
      rejected: inOrder(other, `preference-${name}-rejected.windows`),
      count: chosen.size,
    };
  };
  const train = split(plan.train, rejected.train, "train");
  const evalSplit = plan.evalSet.size > 0 ? split(plan.evalSet, rejected.eval, "eval") : null;
  if (hooks.isCancelled()) return undefined;
  return {
    trainFile,
    evaluationPoints,
    dpo: {
      beta: job.preference.beta,
      initAdapter: job.preference.initAdapterPath,
      train,
      eval: evalSplit,
      steps,
    },
  };
}
