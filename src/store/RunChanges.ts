import { randomUUID } from "node:crypto";

/** The PostgreSQL channel on which a server says that it wrote to a run: payload `<server> <run id>`. */
export const RUN_CHANGES_CHANNEL = "conduit_run_changes";

/**
 * Who is waiting for news of which run, and the one place that wakes them: every write of the
 * run repository (logs, stats, status, delete) calls `changed`, and on PostgreSQL the writes of
 * other servers arrive here through `LISTEN` (`notified`). A follower costs a set entry, no query
 * and no timer, however long the run stays quiet.
 */
export class RunChanges {
  /** This process's name in notifications, so that it skips its own (it woke its followers already). */
  readonly origin = randomUUID();
  private readonly waiting = new Map<string, Set<() => void>>();

  /** Calls `wake` after each change of the run until the returned function is called. */
  subscribe(runId: string, wake: () => void): () => void {
    let set = this.waiting.get(runId);
    if (!set) this.waiting.set(runId, (set = new Set()));
    set.add(wake);
    return () => {
      set.delete(wake);
      if (set.size === 0 && this.waiting.get(runId) === set) this.waiting.delete(runId);
    };
  }

  /** A run was written (by this process, or by another one: `notified`). */
  changed(runId: string): void {
    for (const wake of [...(this.waiting.get(runId) ?? [])]) wake();
  }

  /** The payload of a notification; this process's own are skipped. */
  notified(payload: string): void {
    const space = payload.indexOf(" ");
    if (space < 0 || payload.slice(0, space) === this.origin) return;
    this.changed(payload.slice(space + 1));
  }

  /** Wakes every follower: notifications may have been missed (the listening connection was lost). */
  changedAll(): void {
    for (const runId of [...this.waiting.keys()]) this.changed(runId);
  }

  /** How many followers are waiting (tests, metrics). */
  get followers(): number {
    let count = 0;
    for (const set of this.waiting.values()) count += set.size;
    return count;
  }

  /** The payload that tells other servers about a change of `runId`. */
  payload(runId: string): string {
    return `${this.origin} ${runId}`;
  }
}
