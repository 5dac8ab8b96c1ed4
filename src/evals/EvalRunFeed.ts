import { isDatabaseUnavailable } from "../errors.ts";
import type { EvalRunProgress, EvalRunStatus, ModelTotals } from "../contract/evals.ts";

/** An event of an eval run's stream. */
export type EvalRunEvent =
  | { type: "progress"; progress: EvalRunProgress; results: ModelTotals[] }
  | { type: "status"; status: EvalRunStatus; error: string | null };

/** What a feed reads of its run; undefined when the run is gone. */
export interface EvalRunState {
  status: EvalRunStatus;
  error: string | null;
  progress: EvalRunProgress;
  results: ModelTotals[];
}

export interface EvalRunFeedSource {
  /** One read of the run's state. */
  read(): Promise<EvalRunState | undefined>;
  /** Calls `wake` whenever this process writes the run, until the returned function is called. */
  subscribe(wake: () => void): () => void;
}

const TERMINAL: readonly EvalRunStatus[] = ["COMPLETED", "FAILED", "CANCELLED"];

/**
 * The events of one followed eval run, read once for all its followers: each change of the run (heard in this
 * process, or seen by a poll every `pollMs` for runs another server answers) costs one read of its state, which
 * becomes at most one `progress` and one `status` event, the same objects for every follower (so a route can
 * serialize each once). Progress is a state, not a log: a follower that is behind gets the latest, never a queue.
 * While the database is unavailable its followers wait, and the feed reads again once it is back.
 * `EvalService.follow` makes one per followed run and drops it when its last follower leaves.
 */
export class EvalRunFeed {
  private progress: EvalRunEvent | undefined;
  private status: EvalRunEvent | undefined;
  private readsDone = 0;
  private dirty = true;
  private reading = false;
  private failure: { error: unknown } | undefined;
  private readonly waiting = new Set<() => void>();
  private readonly unsubscribe: () => void;
  private readonly poll: NodeJS.Timeout;
  private followers = 0;
  private closed = false;

  constructor(
    private readonly source: EvalRunFeedSource,
    /** Called once the feed is done with: its last follower left. */
    private readonly onClose: () => void,
    pollMs = 1000,
  ) {
    this.unsubscribe = source.subscribe(() => this.markDirty());
    this.poll = setInterval(() => this.markDirty(), pollMs);
    this.poll.unref();
    this.pump();
  }

  /**
   * The run's events for one follower, from its state now until it ends, is deleted, or `signal` aborts. Throws
   * what a read threw (the database went away); the follower has then left.
   */
  async *follow(signal?: AbortSignal): AsyncGenerator<EvalRunEvent> {
    this.followers++;
    try {
      let progress: EvalRunEvent | undefined;
      let status: EvalRunEvent | undefined;
      while (!signal?.aborted) {
        if (this.failure) throw this.failure.error;
        if (this.readsDone > 0) {
          if (this.progress !== progress && this.progress) yield (progress = this.progress);
          if (this.status !== status && this.status) {
            yield (status = this.status);
            if (status.type === "status" && TERMINAL.includes(status.status)) return;
          }
        }
        await this.changed(signal);
      }
    } finally {
      if (--this.followers <= 0) this.close();
    }
  }

  private markDirty(): void {
    this.dirty = true;
    this.pump();
  }

  private changed(signal?: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        this.waiting.delete(done);
        signal?.removeEventListener("abort", done);
        resolve();
      };
      this.waiting.add(done);
      signal?.addEventListener("abort", done, { once: true });
    });
  }

  /** Reads until the run has not changed since the last read began; one read at a time. */
  private pump(): void {
    if (this.reading || this.closed || !this.dirty) return;
    this.reading = true;
    void (async () => {
      while (this.dirty && !this.closed) {
        this.dirty = false;
        this.apply(await this.source.read());
        this.readsDone++;
        this.wakeAll();
      }
    })().then(
      () => {
        this.reading = false;
        this.pump();
      },
      (error: unknown) => {
        this.reading = false;
        // The database away: followers wait, and the next poll reads again.
        if (isDatabaseUnavailable(error)) return;
        this.failure = { error };
        this.wakeAll();
      },
    );
  }

  private apply(state: EvalRunState | undefined): void {
    if (!state) {
      if (this.status?.type !== "status" || this.status.error !== "the eval run was deleted")
        this.status = { type: "status", status: "CANCELLED", error: "the eval run was deleted" };
      return;
    }
    const progress = this.progress?.type === "progress" ? this.progress.progress : undefined;
    if (progress?.completed !== state.progress.completed || progress.model !== state.progress.model)
      this.progress = { type: "progress", progress: state.progress, results: state.results };
    const status = this.status?.type === "status" ? this.status : undefined;
    if (status?.status !== state.status || status.error !== state.error)
      this.status = { type: "status", status: state.status, error: state.error };
  }

  private wakeAll(): void {
    for (const wake of [...this.waiting]) wake();
  }

  private close(): void {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.poll);
    this.unsubscribe();
    this.wakeAll();
    this.onClose();
  }
}
