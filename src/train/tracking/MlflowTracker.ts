import type { EventEmitter } from "node:events";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "pino";
import type { MlflowRunRef, RunRepository } from "../../store/RunRepository.ts";
import type { Run } from "../../domain/runs.ts";
import type { TrainerProgress } from "../core/trainerJob.ts";
import type { RunEnd, RunEvents } from "../runEvents.ts";
import {
  MlflowError,
  mlflowLimits,
  type MlflowClient,
  type MlflowMetric,
  type MlflowParam,
  type MlflowRunStatus,
} from "./MlflowClient.ts";
import { parseTimestamp } from "../../domain/time.ts";

export interface MlflowTrackerOptions {
  /** Experiment of runs that name no `trackerProject`. */
  defaultExperiment: string;
  /** Tries of a call before what is queued for the run is given up. Defaults to `6`. */
  maxAttempts?: number;
  /** Wait before the first retry; it doubles with each one up to `maxRetryDelayMs`. Defaults to `1000` ms. */
  retryDelayMs?: number;
  /** Longest wait between two tries. Defaults to `30000` ms. */
  maxRetryDelayMs?: number;
  /** How long metric points gather before they go in one batch. Defaults to `1000` ms. */
  flushIntervalMs?: number;
  /** Metric points queued per run; past it the oldest are dropped (and reported). Defaults to `10000`. */
  maxQueuedMetrics?: number;
  /** On close, how long what is queued may still take to send. Defaults to `5000` ms. */
  closeTimeoutMs?: number;
}

const mlflowStatus: Record<RunEnd, MlflowRunStatus> = {
  READY: "FINISHED",
  FAILED: "FAILED",
  CANCELLED: "KILLED",
};

/** What a run had that did not reach MLflow, since it was last reported. */
interface Undelivered {
  params: boolean;
  metrics: number;
  firstStep: number | undefined;
  lastStep: number | undefined;
  end: RunEnd | undefined;
}

/** One run's mirror: its MLflow run once known, and what still has to be sent. */
interface RunState {
  runId: string;
  /** The run as created here (its config becomes the params); read from the database otherwise. */
  run: Run | undefined;
  ref: MlflowRunRef | undefined;
  /** Params still to send once the MLflow run is known; `undefined`: not read yet (all to send). */
  params: MlflowParam[] | undefined;
  /** The run was just created: its MLflow run and params are wanted even before any metric. */
  startWanted: boolean;
  metrics: MlflowMetric[];
  /** The final status to send. */
  end: RunEnd | undefined;
  ended: boolean;
  /** This process trains the run (progress came). */
  training: boolean;
  undelivered: Undelivered;
  /** Why MLflow refused this run for good (no permission, a deleted experiment): nothing more is sent. */
  refused: string | undefined;
  /** Why MLflow refused a batch after the first refusal was reported; reported again when the run ends. */
  quietReason: string | undefined;
  /** No new try before this time after giving up (a long outage is then a log line a minute, not a flood). */
  coolUntil: number;
  timer: NodeJS.Timeout | undefined;
  pumping: Promise<void> | undefined;
}

function nothingUndelivered(): Undelivered {
  return { params: false, metrics: 0, firstStep: undefined, lastStep: undefined, end: undefined };
}

function isEmpty(undelivered: Undelivered): boolean {
  return !undelivered.params && undelivered.metrics === 0 && undelivered.end === undefined;
}

/**
 * Mirrors every run to an MLflow tracking server (`CONDUIT_MLFLOW_TRACKING_URI`), driven by the
 * run events (`created`, `progress`, `ended`): the experiment named by `trackerProject` (else the
 * default) is found or created, the run created with its tags, the effective config logged as
 * params, train/eval loss, learning rate and tokens/s as metrics by step (batched), and the
 * final status set. The MLflow run is recorded with the run (so a restart logs to the same one)
 * and becomes its `trackerURL`.
 *
 * A tracker that is down or refuses never fails or slows a run: event handlers only queue (a
 * bounded queue per run); sending happens apart, one call at a time per run, retried with
 * exponential backoff; when it gives up, the run's log (and the server log) says what was not
 * delivered.
 */
export class MlflowTracker {
  private readonly states = new Map<string, RunState>();
  /** Runs that ended lately: a late progress report or a second `ended` is not a new mirror. */
  private readonly over = new Set<string>();
  private readonly experiments = new Map<string, Promise<string>>();
  private readonly shutdown = new AbortController();
  private readonly maxAttempts: number;
  private readonly retryDelayMs: number;
  private readonly maxRetryDelayMs: number;
  private readonly flushIntervalMs: number;
  private readonly maxQueuedMetrics: number;
  private readonly closeTimeoutMs: number;
  private events: EventEmitter<RunEvents> | undefined;
  private closing = false;

  private readonly onCreated = this.guarded((run: Run) => {
    const state = this.state(run.id);
    state.run = run;
    state.startWanted = true;
    this.schedule(state, 0);
  });

  private readonly onProgress = this.guarded((runId: string, progress: TrainerProgress) => {
    if (this.over.has(runId)) return;
    const state = this.state(runId);
    state.training = true;
    if (state.refused) return;
    const timestamp = Date.now();
    const points: [string, number | undefined][] = [
      ["train_loss", progress.trainLoss],
      ["eval_loss", progress.evalLoss],
      ["learning_rate", progress.learningRate],
      ["tokens_per_second", progress.tokensPerSecond],
      ["epoch", progress.epoch],
      // Preference tuning: train_loss and eval_loss are DPO losses.
      ["reward_margin", progress.rewardMargin],
      ["reward_accuracy", progress.rewardAccuracy],
      ["eval_reward_margin", progress.evalRewardMargin],
      ["eval_reward_accuracy", progress.evalRewardAccuracy],
    ];
    for (const [key, value] of points)
      // JSON has no NaN or Infinity; MLflow would refuse the whole batch.
      if (value !== undefined && Number.isFinite(value))
        state.metrics.push({ key, value, timestamp, step: progress.step });
    const over = state.metrics.length - this.maxQueuedMetrics;
    if (over > 0) {
      // The oldest tenth goes at once, so that a full queue does not cost a shift per report.
      this.noteMetrics(state, state.metrics.splice(0, over + Math.floor(this.maxQueuedMetrics / 10)));
      state.quietReason ??= `more than ${this.maxQueuedMetrics} metric points were waiting for MLflow`;
    }
    this.schedule(state, this.flushIntervalMs);
  });

  private readonly onEnded = this.guarded((runId: string, status: RunEnd) => {
    if (this.over.has(runId)) return;
    this.over.add(runId);
    // Remembered for a while, not forever.
    if (this.over.size > 1000) this.over.delete(this.over.values().next().value as string);
    const state = this.state(runId);
    state.end = status;
    state.ended = true;
    state.coolUntil = 0;
    this.schedule(state, 0);
  });

  constructor(
    private readonly client: MlflowClient,
    private readonly runs: RunRepository,
    private readonly log: Logger,
    private readonly options: MlflowTrackerOptions,
  ) {
    this.maxAttempts = Math.max(1, options.maxAttempts ?? 6);
    this.retryDelayMs = options.retryDelayMs ?? 1000;
    this.maxRetryDelayMs = options.maxRetryDelayMs ?? 30_000;
    this.flushIntervalMs = options.flushIntervalMs ?? 1000;
    this.maxQueuedMetrics = options.maxQueuedMetrics ?? 10_000;
    this.closeTimeoutMs = options.closeTimeoutMs ?? 5000;
  }

  /** Follows the runs of this process. */
  follow(events: EventEmitter<RunEvents>): void {
    this.events = events;
    events.on("created", this.onCreated);
    events.on("progress", this.onProgress);
    events.on("ended", this.onEnded);
  }

  /** Runs a handler so that nothing it throws reaches the emitter (the scheduler, mid-run). */
  private guarded<A extends unknown[]>(handler: (...args: A) => void): (...args: A) => void {
    return (...args) => {
      try {
        handler(...args);
      } catch (error) {
        this.log.error({ err: error }, "MLflow tracking failed");
      }
    };
  }

  /**
   * Stops following runs and sends what is queued, for at most `closeTimeoutMs`; what is still
   * undelivered then is reported in the runs' logs.
   */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    this.events?.off("created", this.onCreated);
    this.events?.off("progress", this.onProgress);
    this.events?.off("ended", this.onEnded);
    const sendNow = () => {
      for (const state of this.states.values()) {
        state.coolUntil = 0;
        if (this.hasWork(state)) this.schedule(state, 0);
      }
      return [...this.states.values()].flatMap((state) => (state.pumping ? [state.pumping] : []));
    };
    const deadline = Date.now() + this.closeTimeoutMs;
    for (let pumps = sendNow(); pumps.length > 0 && Date.now() < deadline; pumps = sendNow()) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        Promise.all(pumps),
        new Promise((resolve) => (timer = setTimeout(resolve, deadline - Date.now()))),
      ]);
      clearTimeout(timer);
    }
    // Past the deadline: calls under way are aborted, and what is left is reported as not delivered.
    this.shutdown.abort();
    await Promise.all(sendNow());
  }

  private state(runId: string): RunState {
    let state = this.states.get(runId);
    if (!state) {
      state = {
        runId,
        run: undefined,
        ref: undefined,
        params: undefined,
        startWanted: false,
        metrics: [],
        end: undefined,
        ended: false,
        training: false,
        undelivered: nothingUndelivered(),
        refused: undefined,
        quietReason: undefined,
        coolUntil: 0,
        timer: undefined,
        pumping: undefined,
      };
      this.states.set(runId, state);
    }
    return state;
  }

  /** Starts sending after `delayMs` (or at once), unless a send is under way: it takes the new data along. */
  private schedule(state: RunState, delayMs: number): void {
    if (state.pumping) return;
    const delay = this.shutdown.signal.aborted ? 0 : Math.max(delayMs, state.coolUntil - Date.now());
    if (delay <= 0) {
      clearTimeout(state.timer);
      state.timer = undefined;
      this.pump(state);
    } else
      state.timer ??= setTimeout(() => {
        state.timer = undefined;
        this.pump(state);
      }, delay).unref();
  }

  private hasWork(state: RunState): boolean {
    return (
      state.refused === undefined &&
      (state.startWanted || state.metrics.length > 0 || state.end !== undefined)
    );
  }

  private pump(state: RunState): void {
    state.pumping = (async () => {
      let failures = 0;
      while (this.hasWork(state)) {
        if (this.shutdown.signal.aborted) {
          this.dropAll(state);
          await this.report(state, "the server shut down before they were sent");
          break;
        }
        try {
          const sent = await this.sendNext(state);
          failures = 0;
          // Metric points go in a batch per flush interval, unless a whole call's worth waits.
          if (
            sent === "metrics" &&
            !this.closing &&
            state.end === undefined &&
            state.metrics.length < mlflowLimits.metricsPerBatch
          )
            break;
        } catch (error) {
          if (error instanceof MlflowError && !error.retryable) {
            await this.refusal(state, error);
            continue;
          }
          failures++;
          const reason = error instanceof Error ? error.message : String(error);
          if (failures >= this.maxAttempts) {
            this.dropAll(state);
            await this.report(state, `MLflow did not answer after ${failures} tries (${reason})`);
            state.coolUntil = Date.now() + this.maxRetryDelayMs;
            break;
          }
          const delay = Math.min(this.retryDelayMs * 2 ** (failures - 1), this.maxRetryDelayMs);
          await sleep(delay, undefined, { signal: this.shutdown.signal, ref: false }).catch(() => undefined);
        }
      }
      // What was refused quietly (or pushed out of a full queue) is told once the run is over here.
      if ((state.ended || !state.training) && !isEmpty(state.undelivered))
        await this.report(state, state.quietReason ?? "MLflow refused them");
    })()
      .catch((error: unknown) => this.log.error({ err: error, runId: state.runId }, "MLflow tracking failed"))
      .finally(() => {
        state.pumping = undefined;
        if (this.hasWork(state)) {
          if (!this.shutdown.signal.aborted) this.schedule(state, this.flushIntervalMs);
        } else if (state.ended || (!state.training && !state.refused)) {
          // Over, or only created here: whoever trains it finds its MLflow run in the database.
          clearTimeout(state.timer);
          if (this.states.get(state.runId) === state) this.states.delete(state.runId);
        }
      });
  }

  /** One call: create the MLflow run, or send params, a metric batch or the final status. */
  private async sendNext(state: RunState): Promise<"run" | "params" | "metrics" | "end" | undefined> {
    const signal = this.shutdown.signal;
    if (!state.ref) {
      await this.ensureRun(state);
      return "run";
    }
    if (state.params === undefined) {
      const run = state.run ?? (await this.runs.getById(state.runId));
      state.params = run ? paramsOf(run) : [];
      state.run = undefined;
    }
    if (state.params.length > 0) {
      const params = state.params.slice(0, mlflowLimits.paramsPerBatch);
      await this.client.logBatch(state.ref.runId, { params }, signal);
      state.params.splice(0, params.length);
      return "params";
    }
    state.startWanted = false;
    if (state.metrics.length > 0) {
      const metrics = state.metrics.slice(0, mlflowLimits.metricsPerBatch);
      await this.client.logBatch(state.ref.runId, { metrics }, signal);
      state.metrics.splice(0, metrics.length);
      return "metrics";
    }
    if (state.end) {
      await this.client.updateRun(state.ref.runId, mlflowStatus[state.end], Date.now(), signal);
      state.end = undefined;
      return "end";
    }
    return undefined;
  }

  /**
   * Finds the run's MLflow run (recorded by this or an earlier process) or creates it, records it
   * and makes it the run's `trackerURL`. When another process recorded one first, ours is deleted.
   */
  private async ensureRun(state: RunState): Promise<void> {
    const recorded = await this.runs.mlflowRun(state.runId);
    if (recorded) {
      state.ref = recorded;
      return;
    }
    const run = recorded === undefined ? undefined : (state.run ?? (await this.runs.getById(state.runId)));
    if (!run) {
      // Deleted: nothing to mirror.
      state.refused = "the run was deleted";
      state.metrics = [];
      state.end = undefined;
      return;
    }
    state.run = run;
    const experimentName = stringField(run.config, "trackerProject") ?? this.options.defaultExperiment;
    const experimentId = await this.experimentId(experimentName);
    const signal = this.shutdown.signal;
    let runId: string;
    try {
      runId = await this.client.createRun(
        { experimentId, runName: run.name, startTime: parseTimestamp(run.createdAt), tags: tagsOf(run) },
        signal,
      );
    } catch (error) {
      // The experiment may have been deleted since it was looked up: look again next time.
      if (error instanceof MlflowError && !error.retryable) this.experiments.delete(experimentName);
      throw error;
    }
    const ref = { experimentId, runId };
    const url = this.client.runPageUrl(experimentId, runId);
    const kept = (await this.runs.recordMlflowRun(run.id, ref, url)) ?? ref;
    state.ref = kept;
    if (kept.runId !== runId) {
      await this.client.deleteRun(runId, signal).catch(() => undefined);
      return;
    }
    this.log.info({ runId: run.id, mlflowRunId: runId, experimentId }, "run mirrored to MLflow");
    await this.appendLog(run.id, `mirrored to MLflow run ${runId} in experiment "${experimentName}": ${url}`);
  }

  /** The experiment's id, found by name or created (once per name and process). */
  private experimentId(name: string): Promise<string> {
    let id = this.experiments.get(name);
    if (!id) {
      id = this.findOrCreateExperiment(name);
      this.experiments.set(name, id);
      id.catch(() => this.experiments.delete(name));
    }
    return id;
  }

  private async findOrCreateExperiment(name: string): Promise<string> {
    const signal = this.shutdown.signal;
    const found = async () => {
      const experiment = await this.client.experimentByName(name, signal);
      if (experiment?.lifecycleStage === "deleted")
        throw new MlflowError(
          `experiment "${name}" is deleted in MLflow; restore it there, or name another trackerProject`,
          false,
        );
      return experiment?.experimentId;
    };
    const existing = await found();
    if (existing) return existing;
    try {
      return await this.client.createExperiment(name, signal);
    } catch (error) {
      // Another process created it in between.
      if (error instanceof MlflowError && error.code === "RESOURCE_ALREADY_EXISTS") {
        const again = await found();
        if (again) return again;
      }
      throw error;
    }
  }

  /**
   * MLflow refused a call: the same call would be refused again. Without an MLflow run (no
   * permission, a deleted experiment) nothing of the run can be sent; a refused batch is dropped.
   */
  private async refusal(state: RunState, error: MlflowError): Promise<void> {
    if (!state.ref || error.status === 401 || error.status === 403) {
      state.refused = error.message;
      this.dropAll(state);
      await this.report(state, `MLflow refused them (${error.message}); nothing more of this run is sent`);
      return;
    }
    if (state.params && state.params.length > 0) {
      state.params.splice(0, mlflowLimits.paramsPerBatch);
      state.undelivered.params = true;
    } else if (state.metrics.length > 0)
      this.noteMetrics(state, state.metrics.splice(0, mlflowLimits.metricsPerBatch));
    else {
      state.undelivered.end = state.end;
      state.end = undefined;
    }
    if (state.quietReason === undefined) {
      state.quietReason = `MLflow refused them (${error.message})`;
      await this.report(state, state.quietReason);
    }
  }

  /**
   * Counts everything queued as undelivered and drops it. Params are sent again with the next
   * data (they can be read again; metric points cannot).
   */
  private dropAll(state: RunState): void {
    if (!state.ref || state.params === undefined || state.params.length > 0) {
      state.undelivered.params = true;
      state.params = undefined;
    }
    state.startWanted = false;
    this.noteMetrics(state, state.metrics.splice(0));
    if (state.end) state.undelivered.end = state.end;
    state.end = undefined;
  }

  private noteMetrics(state: RunState, metrics: MlflowMetric[]): void {
    const undelivered = state.undelivered;
    for (const metric of metrics) {
      undelivered.metrics++;
      undelivered.firstStep = Math.min(undelivered.firstStep ?? metric.step, metric.step);
      undelivered.lastStep = Math.max(undelivered.lastStep ?? metric.step, metric.step);
    }
  }

  /** Writes what was not delivered, and why, to the run's log and the server log. */
  private async report(state: RunState, why: string): Promise<void> {
    const { params, metrics, firstStep, lastStep, end } = state.undelivered;
    state.undelivered = nothingUndelivered();
    const parts: string[] = [];
    if (!state.ref) parts.push("the MLflow run (not created)");
    if (params) parts.push("the params");
    if (metrics > 0)
      parts.push(
        `${metrics} metric points (${firstStep === lastStep ? `step ${firstStep}` : `steps ${firstStep}-${lastStep}`})`,
      );
    if (end) parts.push(`the final status ${mlflowStatus[end]}`);
    if (parts.length === 0) return;
    const what = parts.length === 1 ? parts[0] : `${parts.slice(0, -1).join(", ")} and ${parts.at(-1)}`;
    this.log.warn({ runId: state.runId, reason: why }, `MLflow: not delivered: ${what}`);
    await this.appendLog(state.runId, `MLflow tracking: not delivered: ${what}; ${why}`);
  }

  private async appendLog(runId: string, message: string): Promise<void> {
    await this.runs
      .appendLog(runId, message)
      .catch((error: unknown) => this.log.warn({ err: error, runId }, "run log failed"));
  }
}

function stringField(config: object, key: string): string | undefined {
  const value = (config as Record<string, unknown>)[key];
  return typeof value === "string" && value !== "" ? value : undefined;
}

/** The run's tags: its Conduit id, name and tracker entity. */
function tagsOf(run: Run): MlflowParam[] {
  const tags: MlflowParam[] = [
    { key: "mlflow.runName", value: run.name },
    { key: "mlflow.source.name", value: "conduit" },
    { key: "conduit.runId", value: run.id },
  ];
  const entity = stringField(run.config, "trackerEntity");
  if (entity)
    tags.push({ key: "conduit.trackerEntity", value: entity }, { key: "mlflow.user", value: entity });
  return tags.map((tag) => ({ ...tag, value: tag.value.slice(0, mlflowLimits.tagValueLength) }));
}

/** The effective config as params: strings as they are, other values as JSON, cut to MLflow's length limit. */
function paramsOf(run: Run): MlflowParam[] {
  return Object.entries(run.config).map(([key, value]) => ({
    key: key.slice(0, mlflowLimits.paramKeyLength),
    value: (typeof value === "string" ? value : (JSON.stringify(value) ?? "null")).slice(
      0,
      mlflowLimits.paramValueLength,
    ),
  }));
}
