/**
 * What a training job will do, decided from its tokenized samples before any weight is touched: the window
 * size, every epoch's sample order and windows, the steps, and the steps after which it evaluates. Both
 * trainer backends follow the same plan (the llama.cpp trainer window by window; the PyTorch worker from
 * windows written to disk), so a run trains on the same windows in the same order whichever computes it.
 */
import type { TrainerJob } from "./trainerJob.ts";
import { seededRandom, shuffledIndices } from "../../random.ts";
import { packWindows, planWindows, type TokenizedSample, type TrainingWindow } from "./packWindows.ts";
import type { TokenStore } from "./sampleStore.ts";

/** Window sizes are multiples of this: llama.cpp pads a context's size to it. */
const WINDOW_MULTIPLE = 256;
/** Epochs longer than this many steps are also evaluated and checkpointed every quarter. */
const LONG_EPOCH_STEPS = 100;

/** What a plan reads of a job: the same at a run's creation (its estimate) as in its trainer. */
export type PlanSettings = Pick<
  TrainerJob,
  "seed" | "contextSize" | "packing" | "epochs" | "maxSteps" | "maxTrainTokens"
>;

/** A plan in numbers: what a run's estimate counts, and what its trainer will run. */
export interface PlanSummary {
  windowSize: number;
  stepsPerEpoch: number[];
  /** Optimizer steps in all (one window each). */
  steps: number;
  /** Sample tokens trained on, padding excluded (`stats.final.sampleTokens` of a whole run). */
  sampleTokens: number;
  /** Windows of the eval set, evaluated at every evaluation point. */
  evalWindows: number;
  /** Evaluation points (epoch ends, and quarters of long epochs). */
  evaluations: number;
  /** Windows the per-example losses are measured on once training ends (training and eval samples in order). */
  lossWindows: number;
  /**
   * Preference tuning: every window is one of a pair (the preferred and the non-preferred conversation), both
   * trained, evaluated and measured, and the pairs' reference log-probabilities take one more forward pass of each
   * before training. Absent: the supervised loss.
   */
  pairs?: true;
}

/** One epoch's order of the training samples and the windows it packs into. */
export interface EpochPlan {
  epoch: number;
  /** Sample indices in the order they are packed. */
  order: Uint32Array;
  /** Where each window starts in `order` (see {@link planWindows}). */
  windows: number[];
  /** Windows trained this epoch (fewer than `windows` when `maxSteps` cuts it). */
  steps: number;
  /** Evaluation (and checkpoint) every this many windows, and after the last. */
  evaluationInterval: number;
}

export class TrainingPlan {
  private constructor(
    readonly train: TokenStore,
    readonly evalSet: TokenStore,
    private readonly seed: number,
    private readonly packing: boolean,
    readonly windowSize: number,
    /** Positions of a window that hold samples (the rest is padding). */
    readonly capacity: number,
    readonly stepsPerEpoch: number[],
    readonly totalSteps: number,
    /** Sample tokens the run trains on (the last epoch may be cut by `maxSteps`). */
    readonly plannedTokens: number,
    /** The eval set's windows, samples in order. */
    readonly evalWindows: number[],
    readonly endToken: number,
  ) {}

  /**
   * Plans a job. Throws when an example is longer than the window allows, or when the run would train on
   * more tokens than `maxTrainTokens`, with the numbers.
   */
  static create(
    job: PlanSettings,
    train: TokenStore,
    evalSet: TokenStore,
    modelContext: number,
    endToken: number,
  ): TrainingPlan {
    if (train.tokens === 0) throw new Error("trainer: no training samples");
    const { windowSize, capacity } = chooseWindow(train, evalSet, job.contextSize, modelContext);
    const evalWindows = planWindows(evalSet.size, (p) => evalSet.length(p), capacity, job.packing);
    // Sample order is reshuffled every epoch. Every order is drawn once up front so that totalSteps is
    // exact, and drawn again from the same seed when its epoch comes: one order is in memory at a time.
    const random = seededRandom(job.seed);
    const stepsPerEpoch: number[] = [];
    let totalSteps = 0;
    let plannedTokens = 0;
    while (stepsPerEpoch.length < job.epochs && (job.maxSteps === null || totalSteps < job.maxSteps)) {
      const order = shuffledIndices(train.size, random);
      const plan = planWindows(order.length, (p) => train.length(order[p]!), capacity, job.packing);
      const steps = job.maxSteps === null ? plan.length : Math.min(plan.length, job.maxSteps - totalSteps);
      if (steps === plan.length) plannedTokens += train.tokens;
      else for (let p = 0; p < plan[steps]!; p++) plannedTokens += train.length(order[p]!);
      stepsPerEpoch.push(steps);
      totalSteps += steps;
    }
    const epochs = stepsPerEpoch.length;
    if (job.maxTrainTokens !== null && plannedTokens > job.maxTrainTokens)
      throw new Error(
        `trainer: the run would train on ${plannedTokens} tokens (${train.size} examples of ` +
          `${train.tokens} tokens in all, ${epochs} epochs${job.maxSteps === null ? "" : ` within ${job.maxSteps} steps`}), ` +
          `more than a run may train on (CONDUIT_MAX_RUN_TOKENS: ${job.maxTrainTokens}); ` +
          "train on fewer pairs or epochs, or set steps",
      );
    return new TrainingPlan(
      train,
      evalSet,
      job.seed,
      job.packing,
      windowSize,
      capacity,
      stepsPerEpoch,
      totalSteps,
      plannedTokens,
      evalWindows,
      endToken,
    );
  }

  get epochs(): number {
    return this.stepsPerEpoch.length;
  }

  /** The epochs' plans in order, from `first` (the orders of the epochs before it are drawn and skipped). */
  *epochPlans(first = 0): Generator<EpochPlan> {
    const random = seededRandom(this.seed);
    for (let epoch = 0; epoch < this.epochs; epoch++) {
      const order = shuffledIndices(this.train.size, random);
      if (epoch < first) continue;
      const windows = planWindows(
        order.length,
        (p) => this.train.length(order[p]!),
        this.capacity,
        this.packing,
      );
      const steps = Math.min(windows.length, this.stepsPerEpoch[epoch] ?? 0);
      yield { epoch, order, windows, steps, evaluationInterval: evaluationInterval(steps) };
    }
  }

  /** The plan in numbers. */
  summary(): PlanSummary {
    return {
      windowSize: this.windowSize,
      stepsPerEpoch: [...this.stepsPerEpoch],
      steps: this.totalSteps,
      sampleTokens: this.plannedTokens,
      evalWindows: this.evalWindows.length,
      evaluations: this.stepsPerEpoch.reduce(
        (sum, steps) => sum + (steps > 0 ? Math.ceil(steps / evaluationInterval(steps)) : 0),
        0,
      ),
      lossWindows: this.inOrder(this.train).windows.length + this.inOrder(this.evalSet).windows.length,
    };
  }

  /** Whether the window at `index` of an epoch is followed by an evaluation point. */
  static evaluatesAfter(epoch: EpochPlan, index: number): boolean {
    return index === epoch.steps - 1 || (index + 1) % epoch.evaluationInterval === 0;
  }

  /** The training window `k` of an epoch. */
  trainWindow(epoch: EpochPlan, k: number): TrainingWindow {
    return this.windowAt(this.train, epoch.order, epoch.windows, k, epoch.order.length);
  }

  /** The eval window `k` (the eval samples in order). */
  evalWindow(k: number): TrainingWindow {
    return this.windowAt(this.evalSet, null, this.evalWindows, k, this.evalSet.size);
  }

  /** The windows of a split's samples in order (per-example losses are measured on them). */
  inOrder(store: TokenStore): { windows: number[]; window: (k: number) => TrainingWindow } {
    const windows = planWindows(store.size, (p) => store.length(p), this.capacity, this.packing);
    return { windows, window: (k) => this.windowAt(store, null, windows, k, store.size) };
  }

  /** Window `k` of `windows` over `store`, the samples taken in `order` (by index when `null`). */
  private windowAt(
    store: TokenStore,
    order: Uint32Array | null,
    windows: readonly number[],
    k: number,
    count: number,
  ): TrainingWindow {
    const end = windows[k + 1] ?? count;
    const indices: number[] = [];
    const samples: TokenizedSample[] = [];
    for (let p = windows[k]!; p < end; p++) {
      const index = order === null ? p : order[p]!;
      if (store.length(index) === 0) continue;
      indices.push(index);
      samples.push(store.read(index));
    }
    const packed = packWindows(
      samples,
      samples.map((_, i) => i),
      this.windowSize,
      this.endToken,
      true,
      this.capacity,
    );
    const window = packed[0];
    if (packed.length !== 1 || window === undefined)
      throw new Error(`trainer: window ${k} planned for one window packed into ${packed.length}`);
    for (const span of window.spans) span.sample = indices[span.sample]!;
    return window;
  }
}

/** Long epochs are evaluated (and checkpointed) every quarter too; others at their end. */
function evaluationInterval(steps: number): number {
  return steps > LONG_EPOCH_STEPS ? Math.ceil(steps / 4) : steps;
}

/**
 * The training window: the smallest multiple of 256 (llama.cpp pads a context to that) that holds the
 * longest example, and how many of its positions hold examples: all of them, unless the model was
 * trained on a shorter context (then the rest is padding that never counts). An example longer than
 * `maxWindow` or the model's trained context is an error naming it.
 */
function chooseWindow(
  train: TokenStore,
  evalSet: TokenStore,
  maxWindow: number,
  modelContext: number,
): { windowSize: number; capacity: number } {
  const cap = Math.max(1, Math.min(maxWindow, modelContext > 0 ? modelContext : maxWindow));
  let longest = 1;
  for (const [split, samples] of [
    ["training", train],
    ["validation", evalSet],
  ] as const)
    for (let i = 0; i < samples.size; i++) {
      const length = samples.length(i);
      if (length > cap)
        throw new Error(
          `trainer: ${split} example ${i + 1} is ${length} tokens long, more than the longest training window ` +
            `of ${cap} tokens (${cap === modelContext ? "the model's trained context" : "the run's contextSize"}); ` +
            "shorten or remove it",
        );
      longest = Math.max(longest, length);
    }
  const windowSize = Math.ceil(longest / WINDOW_MULTIPLE) * WINDOW_MULTIPLE;
  return { windowSize, capacity: Math.min(windowSize, cap) };
}
