/**
 * How long a run takes: the plan made when it is created (`RunPlan`, from the dataset's size, the run's
 * settings and the rate of its trainer on its base model) and what a reader is shown at any moment
 * (`RunEstimate`: the plan while the run waits, the trainer's own pace once it trains, the actual time once it
 * is READY). Pure functions on plain data: the server, the CLI and the dashboard share them.
 */
import type { RunStats, RunStatus } from "./runs.ts";

/** Where an estimate's seconds come from. */
export const ESTIMATE_BASES = ["prior", "measured", "training", "final"] as const;
export type EstimateBasis = (typeof ESTIMATE_BASES)[number];

/** The estimate made when a run is created, kept with the run (`estimate.planned` on the wire). */
export interface RunPlan {
  /**
   * `measured`: the rate of the server's earlier READY runs of the same trainer, base model and method;
   * `prior`: none yet, a rate scaled from the trainer's benchmarks by the model's size and the threads.
   */
  basis: "prior" | "measured";
  /**
   * Seconds the run is expected to take from its start on a worker to READY: preparing its examples, the
   * trainer (loading the base, training, evaluating, saving) and the per-example losses.
   */
  seconds: number;
  /** Training tokens planned: window positions, padding included (what `stats.final.trainTokens` counts). */
  tokens: number;
  /** Sample tokens planned, padding excluded (`stats.final.sampleTokens`). */
  sampleTokens: number;
  /**
   * Sample tokens the earlier runs trained per token their plans counted from their files' bytes (the
   * tokenizer's real bytes per token and the template's tokens); `sampleTokens` is multiplied by it. `1` with a prior.
   */
  tokenRatio: number;
  steps: number;
  windowSize: number;
  /** Training tokens per second assumed for the training loop. */
  tokensPerSecond: number;
  /**
   * Seconds assumed outside the training loop: preparing the examples, starting the trainer, loading and
   * converting the base, tokenizing, per-example losses, saving.
   */
  overheadSeconds: number;
  /** Earlier runs the rate was measured on; `0` with a prior. */
  measuredRuns: number;
  /**
   * The share of a core each trainer thread was expected to get at creation, from the recent load (`1`: a core
   * each); `tokensPerSecond` and `overheadSeconds` are scaled by it. Absent in plans made before it was counted.
   */
  cpuShare?: number;
}

/**
 * A run's estimated duration as the API shows it (`run.estimate`); `null` where none can be made. It changes
 * only when the run does (its status, its stats), so that two reads of an unchanged run are the same.
 */
export interface RunEstimate {
  /**
   * `prior` or `measured` (the plan: the run has not trained a step yet), `training` (the trainer's own pace:
   * seconds elapsed plus its `etaSeconds`), `final` (a READY run: its actual seconds).
   */
  basis: EstimateBasis;
  /** The run's whole time, from its start on a worker to READY (while it trains: the trainer's part). */
  seconds: number;
  /**
   * Seconds still to go when the run was last updated (`updatedAt`); `0` once READY. Before its first step a
   * RUNNING run's planned seconds count down from the attempt's start (`0` once it takes longer than planned).
   */
  remainingSeconds: number;
  /**
   * When a RUNNING run should be READY (`YYYY-MM-DD HH:MM:SS.mmm`, UTC): its last update plus
   * `remainingSeconds`. `null` otherwise: a QUEUED run's seconds count from its start, and the runs ahead of it
   * in the queue are not counted.
   */
  finishAt: string | null;
  /** Earlier runs the plan's rate was measured on; `0` with a prior. */
  measuredRuns: number;
  /** The plan made at creation; `null` for runs created before Conduit planned them. */
  planned: RunPlan | null;
}

/** What `currentEstimate` looks at besides the plan. */
export interface EstimateContext {
  status: RunStatus;
  stats: RunStats;
  /** When the run was last written (ms since the epoch): a RUNNING run's stats and `etaSeconds` are from then. */
  updatedAt: number;
}

/** `YYYY-MM-DD HH:MM:SS.mmm` (UTC), the API's timestamps. */
function timestampOf(ms: number): string {
  return new Date(ms).toISOString().replace("T", " ").slice(0, 23);
}

const positive = (value: unknown): value is number =>
  typeof value === "number" && Number.isFinite(value) && value >= 0;

/**
 * The estimate a run shows: the plan while QUEUED (and while RUNNING before its first step), the trainer's
 * pace once it has stepped, the actual seconds once READY; `null` for a FAILED or CANCELLED run, and where
 * there is neither a plan nor training stats.
 */
export function currentEstimate(planned: RunPlan | null, context: EstimateContext): RunEstimate | null {
  const { status, stats, updatedAt } = context;
  const measuredRuns = planned?.measuredRuns ?? 0;
  if (status === "READY") {
    // Runs trained before `runSeconds` have the trainer's own seconds.
    const final = stats.final as { runSeconds?: unknown; elapsedSeconds?: unknown } | undefined;
    const seconds = positive(final?.runSeconds) ? final.runSeconds : final?.elapsedSeconds;
    if (!positive(seconds)) return null;
    return { basis: "final", seconds, remainingSeconds: 0, finishAt: null, measuredRuns, planned };
  }
  if (status !== "QUEUED" && status !== "RUNNING") return null;
  // A re-queued run's stats are its previous attempt's: it waits again, so the plan stands.
  if (
    status === "RUNNING" &&
    typeof stats.step === "number" &&
    stats.step >= 1 &&
    positive(stats.etaSeconds) &&
    positive(stats.elapsedSeconds)
  )
    return {
      basis: "training",
      seconds: stats.elapsedSeconds + stats.etaSeconds,
      remainingSeconds: stats.etaSeconds,
      finishAt: timestampOf(updatedAt + stats.etaSeconds * 1000),
      measuredRuns,
      planned,
    };
  if (planned === null) return null;
  if (status === "RUNNING") {
    // Waiting for its first step (preparing, loading the base): the plan counts down from the attempt's start,
    // and once it is overdue the run is due now. A run whose start is not recorded counts from its last update.
    const started = typeof stats.startedAt === "string" ? parseTimestamp(stats.startedAt) : Number.NaN;
    const from = Number.isFinite(started) && started <= updatedAt ? started : updatedAt;
    const remainingSeconds = Math.max(0, planned.seconds - (updatedAt - from) / 1000);
    return {
      basis: planned.basis,
      seconds: planned.seconds,
      remainingSeconds,
      finishAt: timestampOf(updatedAt + remainingSeconds * 1000),
      measuredRuns,
      planned,
    };
  }
  return {
    basis: planned.basis,
    seconds: planned.seconds,
    remainingSeconds: planned.seconds,
    finishAt: null,
    measuredRuns,
    planned,
  };
}

/** Milliseconds since the epoch of a `YYYY-MM-DD HH:MM:SS.mmm` (UTC) timestamp; `NaN` when it is not one. */
function parseTimestamp(text: string): number {
  return Date.parse(`${text.replace(" ", "T")}Z`);
}

/** A duration as people say it: `about 40 s`, `about 3 min`, `about 1 h 20 min`. */
export function aboutDuration(seconds: number): string {
  if (seconds < 10) return "a few seconds";
  if (seconds < 90) return `about ${Math.round(seconds / 5) * 5} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `about ${minutes} min`;
  const hours = Math.floor(minutes / 60);
  const rest = Math.round((minutes - hours * 60) / 10) * 10;
  return rest === 0 || rest === 60
    ? `about ${hours + (rest === 60 ? 1 : 0)} h`
    : `about ${hours} h ${rest} min`;
}

/** A time as `1m05s` or `42s`. */
export function clockDuration(seconds: number): string {
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}

/** Where a plan's rate came from, in words, and how busy the machine was. */
function planSource(estimate: RunEstimate): string {
  const source =
    estimate.basis === "measured"
      ? `measured on ${estimate.measuredRuns} earlier run${estimate.measuredRuns === 1 ? "" : "s"}`
      : "no earlier run to measure: a prior from the trainer's benchmarks";
  const share = estimate.planned?.cpuShare ?? 1;
  return share < 1 ? `${source}; a busy machine: ${Math.round(share * 100)} % of a core per thread` : source;
}

/**
 * One line for people: `about 3 min (measured on 2 earlier runs)`, `about 2 min left (at the trainer's pace)`,
 * `took 2m41s (estimated about 3 min)`.
 */
export function describeEstimate(estimate: RunEstimate): string {
  switch (estimate.basis) {
    case "final":
      return estimate.planned
        ? `took ${clockDuration(estimate.seconds)} (estimated ${aboutDuration(estimate.planned.seconds)})`
        : `took ${clockDuration(estimate.seconds)}`;
    case "training":
      return `${aboutDuration(estimate.remainingSeconds)} left (at the trainer's pace)`;
    default:
      // A RUNNING run before its first step has a finish time: the plan counts down.
      if (estimate.finishAt !== null)
        return estimate.remainingSeconds > 0
          ? `${aboutDuration(estimate.remainingSeconds)} left, waiting for the first step (${planSource(estimate)})`
          : `waiting for the first step, longer than planned (${aboutDuration(estimate.seconds)}: ${planSource(estimate)})`;
      return `${aboutDuration(estimate.seconds)} (${planSource(estimate)})`;
  }
}
