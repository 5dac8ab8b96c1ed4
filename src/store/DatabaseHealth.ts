import { setTimeout as delay } from "node:timers/promises";
import { isDatabaseUnavailable } from "../errors.ts";

/** Waits between tries of a write the database could not take: from 0.5 s, doubling, up to 5 s. */
const FIRST_WAIT_MS = 500;
const LONGEST_WAIT_MS = 5000;

/**
 * What this process has seen of its database's outages (a PostgreSQL restart, a dropped connection, SQLite busy
 * past its timeout), for the work that outlives a request:
 * - writes that must not be lost (a run's end, its log, an eval's results) wait for the database to come back
 *   ({@link retry});
 * - judgements made from another server's silence (a run's lease expired, an eval run not written for a minute)
 *   wait until the database has been back for as long as that silence must last ({@link upFor}): during an outage
 *   no server could write, so silence then says nothing about whether it stopped.
 */
export class DatabaseHealth {
  private lastOutage = -Infinity;

  /** Notes an error; true when it says the database is unavailable. */
  saw(error: unknown): boolean {
    if (!isDatabaseUnavailable(error)) return false;
    this.lastOutage = Date.now();
    return true;
  }

  /** Whether no outage has been seen for the last `ms` milliseconds. */
  upFor(ms: number): boolean {
    return Date.now() - this.lastOutage >= ms;
  }

  /**
   * Runs `work` until it succeeds, trying again while it fails because the database is unavailable; any other
   * error is thrown at once. `stop` (the process shutting down) ends the waiting: the last error is thrown.
   */
  async retry<T>(work: () => Promise<T>, stop?: () => boolean): Promise<T> {
    for (let wait = FIRST_WAIT_MS; ; wait = Math.min(wait * 2, LONGEST_WAIT_MS)) {
      try {
        return await work();
      } catch (error) {
        if (!this.saw(error) || stop?.()) throw error;
      }
      await delay(wait, undefined, { ref: false });
    }
  }
}
