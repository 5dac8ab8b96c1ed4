import { ConduitError } from "../errors.ts";

/**
 * Request admission across all models: how many requests may wait (for a free sequence, or for their model to
 * load), and the `rate_limited` answer with a `retryAfter` estimate when too many do.
 */
export class Admission {
  /** Requests waiting for a free sequence. */
  private waiting = 0;
  /** Requests waiting for their model to load. */
  private loadWaiting = 0;
  /** Requests refused with `rate_limited` since start. */
  rejected = 0;
  /** Moving average of generation time in ms, for `retryAfter`. */
  private averageGenerationMs = 1000;

  /**
   * @param maxQueue requests that may wait for a free sequence across all models.
   * @param parallel sequences per model (generations that run at once).
   */
  constructor(
    private readonly maxQueue: number,
    private readonly parallel: number,
  ) {}

  /** Requests waiting for a sequence or for their model to load. */
  get queueDepth(): number {
    return this.waiting + this.loadWaiting;
  }

  /** Waits for `load()` (given up when `signal` aborts), or refuses at once when too many already wait for one. */
  async whileLoading<T>(load: () => Promise<T>, signal: AbortSignal | undefined): Promise<T> {
    // A burst for a cold model is bounded too: as many as will find a sequence once it is loaded, plus
    // the queue. (Counting them against the queue alone would refuse even the first request when
    // maxQueue is 0.)
    if (this.loadWaiting >= this.maxQueue + this.parallel) this.refuse();
    this.loadWaiting++;
    try {
      return await abortable(load(), signal);
    } finally {
      this.loadWaiting--;
    }
  }

  /**
   * Counts one more request waiting for a sequence while `wait()` runs, or refuses it with `rate_limited` when
   * the queue is full. `wait` is called synchronously, so a caller's check for a free sequence cannot race it.
   */
  async whileQueued<T>(wait: () => Promise<T>): Promise<T> {
    if (this.waiting >= this.maxQueue) this.refuse();
    this.waiting++;
    try {
      return await wait();
    } finally {
      this.waiting--;
    }
  }

  /** Feeds the `retryAfter` estimate with a finished generation's time. */
  recordGeneration(elapsedMs: number): void {
    this.averageGenerationMs = this.averageGenerationMs * 0.8 + elapsedMs * 0.2;
  }

  private refuse(): never {
    this.rejected++;
    throw new ConduitError("rate_limited", "Too many generations are waiting; retry later.", {
      retryAfter: this.retryAfterSeconds(),
    });
  }

  private retryAfterSeconds(): number {
    const rounds = Math.ceil((this.waiting + 1) / this.parallel);
    return Math.min(60, Math.max(1, Math.ceil((rounds * this.averageGenerationMs) / 1000)));
  }
}

/** Waits for `promise` but gives up (with the signal's reason) when `signal` aborts; the work itself goes on. */
export function abortable<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return promise;
  signal.throwIfAborted();
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => (signal.removeEventListener("abort", onAbort), resolve(value)),
      (error: unknown) => (signal.removeEventListener("abort", onAbort), reject(error)),
    );
  });
}
