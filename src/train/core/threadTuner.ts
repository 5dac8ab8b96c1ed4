/**
 * Picks a trainer's thread count between optimizer steps by timing them, for a pool that spin-waits (OpenBLAS's):
 * on an idle 2-core machine two threads train 1.43× faster than one, while with a core busy elsewhere two made
 * 0.6× of one (bench/README.md). Every window of a run has the same size, so step times compare.
 *
 * It tries each candidate for `trialSteps` steps (the median of each counts), keeps the fastest for `settleSteps`
 * steps, and tries again after that, or sooner when the kept count's steps have become `slowdown` times slower than
 * when it was chosen (the machine got busier). A candidate whose first step in a trial is already over `slowdown` times
 * the fastest median so far is not timed further (threads spinning on a busy core made steps ~8× slower: one such
 * step is enough to know). The torch worker's `ThreadTuner` (worker.py) is the same policy; both are tested on
 * test/python/thread_tuner_cases.json.
 */
export interface ThreadTunerOptions {
  /** Steps timed per candidate in a trial. Defaults to 3. */
  trialSteps?: number;
  /** Steps the fastest candidate is kept before the next trial. Defaults to 40. */
  settleSteps?: number;
  /** How much slower the kept count's recent steps may get before a trial comes early. Defaults to 1.5. */
  slowdown?: number;
}

export class ThreadTuner {
  private readonly trialSteps: number;
  private readonly settleSteps: number;
  private readonly slowdown: number;
  /** The trial under way: each candidate's step times; undefined while settled. */
  private trial: Map<number, number[]> | undefined;
  private current: number;
  /** The count the last trial chose (0 before any) and its median step. */
  private chosen = 0;
  private chosenTime = Number.POSITIVE_INFINITY;
  private settledSteps = 0;
  private recent: number[] = [];
  /** Candidates of the trial under way that were stopped after one slow step. */
  private readonly dropped = new Set<number>();
  /** The first step allocates the graph: it is left out. */
  private warm = false;

  /** `candidates`: distinct thread counts, the one to start with first. */
  constructor(
    private readonly candidates: readonly number[],
    options: ThreadTunerOptions = {},
  ) {
    if (candidates.length === 0) throw new Error("ThreadTuner needs at least one candidate");
    this.trialSteps = options.trialSteps ?? 3;
    this.settleSteps = options.settleSteps ?? 40;
    this.slowdown = options.slowdown ?? 1.5;
    this.current = candidates[0]!;
    this.trial = candidates.length > 1 ? new Map() : undefined;
  }

  /** The thread count for the coming step. */
  threads(): number {
    return this.current;
  }

  /**
   * Records the step just taken with {@link threads} threads, `seconds` long (the first step is left out). Returns a
   * sentence when a trial ends on another count than the last one chose (for the run's log), else undefined.
   */
  observe(seconds: number): string | undefined {
    if (!this.warm) {
      this.warm = true;
      return undefined;
    }
    if (this.trial !== undefined) {
      const trial = this.trial;
      const times = trial.get(this.current) ?? [];
      times.push(seconds);
      trial.set(this.current, times);
      const fastest = Math.min(
        ...[...trial].filter(([c, t]) => c !== this.current && t.length > 0).map(([, t]) => median(t)),
      );
      const hopeless = times.length === 1 && seconds > this.slowdown * fastest;
      if (times.length < this.trialSteps && !hopeless) return undefined;
      if (hopeless) this.dropped.add(this.current);
      const next = this.candidates.find(
        (c) => !this.dropped.has(c) && (trial.get(c)?.length ?? 0) < this.trialSteps,
      );
      if (next !== undefined) {
        this.current = next;
        return undefined;
      }
      return this.settle();
    }
    if (this.candidates.length === 1) return undefined;
    this.settledSteps++;
    this.recent.push(seconds);
    if (this.recent.length > this.trialSteps) this.recent.shift();
    const slower =
      this.recent.length === this.trialSteps && median(this.recent) > this.slowdown * this.chosenTime;
    if (this.settledSteps >= this.settleSteps || slower) {
      this.trial = new Map();
      this.current = this.candidates[0]!;
    }
    return undefined;
  }

  private settle(): string | undefined {
    const medians = this.candidates.map((c) => ({ threads: c, seconds: median(this.trial!.get(c)!) }));
    const best = medians.reduce((a, b) => (b.seconds < a.seconds ? b : a));
    const before = this.chosen;
    this.trial = undefined;
    this.dropped.clear();
    this.current = best.threads;
    this.chosen = best.threads;
    this.chosenTime = best.seconds;
    this.settledSteps = 0;
    this.recent = [];
    if (before === best.threads) return undefined;
    return `${best.threads} thread${best.threads === 1 ? "" : "s"} (a step: ${medians
      .map((m) => `${m.threads} → ${m.seconds.toFixed(2)} s`)
      .join(", ")})`;
  }
}

/** The middle value (the mean of the two middle ones for an even count); used by the run estimate too. */
export function median(values: readonly number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  const middle = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[middle]! : (sorted[middle - 1]! + sorted[middle]!) / 2;
}
