import { ConduitError } from "../errors.ts";
import { RUN_EVENT_ID_PATTERN, type RunStats, type RunStatus } from "../contract/runs.ts";

/** One event of `RunService.follow`; `id` says what the client has once it has this event. */
export type RunFollowEvent =
  | { type: "log"; id: string; seq: number; line: string }
  /** The run's stats, with only the loss points after those already sent (`seriesReset`: all of them). */
  | { type: "stats"; id: string; stats: RunStats }
  | { type: "status"; id: string; status: RunStatus | "DELETED"; error: string | null };

/** Steps of a series that has none yet. */
const NONE = -1;

/** FNV-1a, 32 bits, in base 36: tells one stats snapshot from the next (not a security hash). */
function hash(text: string): string {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0).toString(36);
}

const ID = new RegExp(RUN_EVENT_ID_PATTERN);

/**
 * Where a follower of a run stands, which is also every event's id: `<log seq>.<last train step>.<last
 * eval step>.<stats hash>.<status>`, e.g. `41.120.100.1x3kq9a.RUNNING` (`-1` and empty parts: none yet).
 * Each part only grows or changes with what was sent, so a stream that starts from an id sends the log
 * lines after its seq, the stats if they are not the ones it names (with the loss points after its
 * steps), and the status if it is not its status: exactly what followed that event.
 */
export class FollowCursor {
  private constructor(
    public seq: number,
    private train: number,
    private evalStep: number,
    private statsHash: string,
    private lastStatus: string,
  ) {}

  /** The cursor of an event id (`Last-Event-ID`); none is the start of the run. */
  static parse(id: string | undefined): FollowCursor {
    if (id === undefined || id === "") return new FollowCursor(NONE, NONE, NONE, "", "");
    const match = ID.exec(id);
    if (!match)
      throw new ConduitError(
        "invalid_request",
        `"${id.slice(0, 100)}" is not an event id of this stream; send the id of the last event received`,
        { param: "Last-Event-ID" },
      );
    const [, seq, train, evalStep, statsHash, status] = match as unknown as [string, ...string[]];
    return new FollowCursor(Number(seq), Number(train), Number(evalStep), statsHash ?? "", status ?? "");
  }

  get id(): string {
    return `${this.seq}.${this.train}.${this.evalStep}.${this.statsHash}.${this.lastStatus}`;
  }

  log(seq: number, line: string): RunFollowEvent {
    this.seq = seq;
    return { type: "log", id: this.id, seq, line };
  }

  /** The stats event, if `stats` are not the ones sent last. */
  stats(stats: RunStats): RunFollowEvent | undefined {
    const statsHash = hash(JSON.stringify(stats));
    if (statsHash === this.statsHash) return undefined;
    const train = stats.lossSeries ?? [];
    const evals = stats.evalLossSeries ?? [];
    const lastTrain = train.at(-1)?.step ?? NONE;
    const lastEval = evals.at(-1)?.step ?? NONE;
    // A run that started over (a worker lost it, another trains it from the start) has fewer steps.
    const reset = lastTrain < this.train || lastEval < this.evalStep;
    const out: RunStats = { ...stats, ...(reset ? { seriesReset: true } : {}) };
    if (stats.lossSeries) out.lossSeries = reset ? train : train.filter((p) => p.step > this.train);
    if (stats.evalLossSeries)
      out.evalLossSeries = reset ? evals : evals.filter((p) => p.step > this.evalStep);
    this.train = lastTrain;
    this.evalStep = lastEval;
    this.statsHash = statsHash;
    return { type: "stats", id: this.id, stats: out };
  }

  /** The status event, if `status` is not the one sent last. */
  status(status: RunStatus | "DELETED", error: string | null): RunFollowEvent | undefined {
    if (status === this.lastStatus) return undefined;
    this.lastStatus = status;
    return { type: "status", id: this.id, status, error };
  }
}
