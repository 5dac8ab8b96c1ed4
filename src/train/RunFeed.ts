import { activeStatuses, type RunStats, type RunStatus } from "../contract/runs.ts";
import { isDatabaseUnavailable } from "../errors.ts";
import { FollowCursor, type RunFollowEvent } from "./FollowCursor.ts";

/** How soon a feed reads again after the database was unavailable. */
const RETRY_MS = 1000;

/** What a feed reads of its run (the run repository's reads, for one run of one user). */
export interface RunFeedSource {
  /** The run's status, error and stats, and the seq of its last log line; undefined when there is no such run. */
  state(): Promise<
    { status: RunStatus; error: string | null; stats: RunStats; lastLogSeq: number } | undefined
  >;
  /** Log lines after `afterSeq`, in order, at most `limit`, none after `untilSeq` when it is given. */
  logsSince(afterSeq: number, limit: number, untilSeq?: number): Promise<{ seq: number; line: string }[]>;
  /** Calls `wake` after each write of the run until the returned function is called. */
  subscribe(wake: () => void): () => void;
}

export interface RunFeedOptions {
  /** Events kept for followers that are a little behind; one further behind catches up from the database. Defaults to `256`. */
  keptEvents?: number;
  /** Log lines read at once. Defaults to `500`. */
  logPage?: number;
}

/** The run as the feed last read it, and where its events stood then. */
interface Snapshot {
  status: RunStatus | "DELETED";
  error: string | null;
  stats: RunStats;
  /** The seq of the last log line sent as an event (or, for the first read, of the last line then). */
  seq: number;
  /** The feed's cursor then, i.e. the id of its last event. */
  id: string;
  /** The index the next event got. */
  index: number;
}

/** The id of a follower that has nothing yet. */
const START = FollowCursor.parse(undefined).id;

function ends(event: RunFollowEvent): boolean {
  return event.type === "status" && !(activeStatuses as readonly string[]).includes(event.status);
}

/**
 * The events of one followed run, read once for all its followers: on each change of the run the feed reads
 * its state (and its new log lines, when there are any) and makes the events, which every follower then
 * takes as they are, the same objects in the same order. The feed starts at the run's present: a follower
 * first catches up to it, reading the log lines it lacks from the database as it takes them (the stats and
 * status come from the feed's last read), then takes the feed's events. The feed keeps its last
 * `keptEvents` events for followers that are a little behind (a slow client, a reconnection with
 * `Last-Event-ID`); one that falls further behind catches up again the same way. So a follower holds its
 * cursor and nothing else, however slowly it reads, and a change costs the same reads for one follower as
 * for a thousand.
 *
 * `RunService.follow` makes one per followed run and drops it when its last follower leaves.
 */
export class RunFeed {
  private readonly head = FollowCursor.parse(undefined);
  private readonly keptEvents: number;
  private readonly logPage: number;
  /** The last events; `kept[0]` has index `first`. */
  private kept: RunFollowEvent[] = [];
  private first = 0;
  private snapshot: Snapshot | undefined;
  /**
   * The catch-up from the start of the run to the last read, when its lines fit in one page: a crowd that
   * arrives at once (a run's page shared with a team) reads and serializes it once, not once per follower.
   */
  private replay: { snapshot: Snapshot; events: Promise<RunFollowEvent[]> } | undefined;
  /** The run was written since the feed last started reading it. */
  private dirty = true;
  private reading = false;
  private readsStarted = 0;
  private readsDone = 0;
  private failure: { error: unknown } | undefined;
  private readonly waiting = new Set<() => void>();
  private readonly unsubscribe: () => void;
  private followers = 0;
  private closed = false;

  constructor(
    private readonly source: RunFeedSource,
    /** Called once the feed is done with: its last follower left, or a read failed. */
    private readonly onClose: () => void,
    options: RunFeedOptions = {},
  ) {
    this.keptEvents = options.keptEvents ?? 256;
    this.logPage = options.logPage ?? 500;
    this.unsubscribe = source.subscribe(() => {
      this.dirty = true;
      this.pump();
    });
    this.pump();
  }

  /**
   * Adds a follower and waits until the feed has read the run since the last change it heard of (at once if it
   * has). False when there is no such run; the follower has then left already. Throws what the read threw.
   */
  async join(signal?: AbortSignal): Promise<boolean> {
    this.followers++;
    try {
      // A read that began after the last change heard of (the feed's first read, for a new feed).
      const target = this.dirty ? this.readsStarted + 1 : Math.max(this.readsDone, 1);
      while (this.readsDone < target && !signal?.aborted) {
        if (this.failure) throw this.failure.error;
        await this.changed(signal);
      }
      if (this.failure) throw this.failure.error;
      if (this.snapshot?.status === "DELETED" || !this.snapshot) {
        this.leave();
        return false;
      }
      return true;
    } catch (error) {
      this.leave();
      throw error;
    }
  }

  /** A follower is done; the last one closes the feed. */
  leave(): void {
    if (--this.followers <= 0) this.close();
  }

  /**
   * The events after `cursor` (a joined follower's), until the run ends or is deleted, or `signal` aborts: first
   * what the follower lacks of the run as the feed last read it, then the feed's own events.
   */
  async *events(cursor: FollowCursor, signal?: AbortSignal): AsyncGenerator<RunFollowEvent> {
    let index = this.indexAfter(cursor.id);
    let id = cursor.id;
    while (!signal?.aborted) {
      if (this.failure) throw this.failure.error;
      if (index === undefined || index < this.first) {
        // Behind the feed, or not on its way: it catches up to the feed's last read.
        const behind = FollowCursor.parse(id);
        const snapshot = this.snapshot as Snapshot;
        if (id === START && snapshot.status !== "DELETED" && snapshot.seq < this.logPage) {
          const events = await this.replayFromStart(snapshot);
          for (const event of events) yield event;
          if (!activeStatuses.includes(snapshot.status)) return;
          id = events.at(-1)?.id ?? id;
          index = snapshot.index;
          continue;
        }
        // The lines it lacks, in pages as it takes them: a long log is not held in memory at once. A deleted
        // run's follower gets none (they are gone), only the status.
        while (snapshot.status !== "DELETED" && behind.seq < snapshot.seq) {
          const lines = await this.source.logsSince(behind.seq, this.logPage, snapshot.seq);
          if (lines.length === 0) break;
          for (const { seq, line } of lines) yield behind.log(seq, line);
        }
        const stats = snapshot.status === "DELETED" ? undefined : behind.stats(snapshot.stats);
        if (stats) yield stats;
        const status = behind.status(snapshot.status, snapshot.error);
        if (status) yield status;
        if (snapshot.status === "DELETED" || !activeStatuses.includes(snapshot.status)) return;
        id = behind.id;
        index = snapshot.index;
        continue;
      }
      if (index < this.first + this.kept.length) {
        const event = this.kept[index - this.first] as RunFollowEvent;
        index++;
        id = event.id;
        yield event;
        if (ends(event)) return;
        continue;
      }
      // Everything taken, and the run has ended (a stream resumed after its last event): nothing will come.
      const status = (this.snapshot as Snapshot).status;
      if (status === "DELETED" || !activeStatuses.includes(status)) return;
      await this.changed(signal);
    }
  }

  /** The events from the start of the run to `snapshot` (whose lines fit in one page), made once per snapshot. */
  private replayFromStart(snapshot: Snapshot): Promise<RunFollowEvent[]> {
    if (this.replay?.snapshot !== snapshot) {
      const events = this.source.logsSince(-1, this.logPage, snapshot.seq).then((lines) => {
        const cursor = FollowCursor.parse(START);
        const replayed = lines.map(({ seq, line }) => cursor.log(seq, line));
        const stats = cursor.stats(snapshot.stats);
        if (stats) replayed.push(stats);
        const status = cursor.status(snapshot.status, snapshot.error);
        if (status) replayed.push(status);
        return replayed;
      });
      const replay = { snapshot, events };
      // A failed read is not remembered: the next follower tries again.
      events.catch(() => {
        if (this.replay === replay) this.replay = undefined;
      });
      this.replay = replay;
    }
    return this.replay.events;
  }

  /** Where a follower whose cursor is `id` goes on in the feed's events, when the feed has that place. */
  private indexAfter(id: string): number | undefined {
    if (this.snapshot?.id === id) return this.snapshot.index;
    for (let i = this.kept.length - 1; i >= 0; i--) if (this.kept[i]?.id === id) return this.first + i + 1;
    return undefined;
  }

  /** Resolves after the feed's next read, or when `signal` aborts. */
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

  private wakeAll(): void {
    for (const wake of [...this.waiting]) wake();
  }

  /** Reads until the run has not changed since the last read began; one reader at a time. */
  private pump(): void {
    if (this.reading || this.closed) return;
    this.reading = true;
    void this.readWhileDirty().then(
      () => {
        this.reading = false;
        // A change heard after the loop's last check, before this callback.
        if (this.dirty) this.pump();
      },
      (error: unknown) => {
        this.reading = false;
        // The database away: followers wait (their streams stay open), and the feed reads again in a second.
        if (isDatabaseUnavailable(error)) {
          this.dirty = true;
          setTimeout(() => this.pump(), RETRY_MS).unref();
          return;
        }
        this.failure = { error };
        this.wakeAll();
        this.close();
      },
    );
  }

  private async readWhileDirty(): Promise<void> {
    while (this.dirty && !this.closed) {
      this.dirty = false;
      this.readsStarted++;
      await this.read();
      this.readsDone++;
      this.wakeAll();
    }
  }

  /** One read of the run: the events of what changed since the last one. */
  private async read(): Promise<void> {
    const state = await this.source.state();
    if (!state) {
      const deleted = this.head.status("DELETED", null);
      if (deleted) this.push(deleted);
      this.snapshot = { status: "DELETED", error: null, stats: {}, ...this.place() };
      return;
    }
    if (!this.snapshot) {
      // The first read: the feed starts at the run's present, which its followers catch up to.
      this.head.seq = state.lastLogSeq;
      this.head.stats(state.stats);
      this.head.status(state.status, state.error);
    } else {
      // Every new line before the stats and the status: a follower ends at a final status.
      while (state.lastLogSeq > this.head.seq) {
        const lines = await this.source.logsSince(this.head.seq, this.logPage);
        for (const { seq, line } of lines) this.push(this.head.log(seq, line));
        if (lines.length < this.logPage) break;
      }
      const stats = this.head.stats(state.stats);
      if (stats) this.push(stats);
      const status = this.head.status(state.status, state.error);
      if (status) this.push(status);
    }
    this.snapshot = { status: state.status, error: state.error, stats: state.stats, ...this.place() };
  }

  private place(): { seq: number; id: string; index: number } {
    return { seq: this.head.seq, id: this.head.id, index: this.first + this.kept.length };
  }

  private push(event: RunFollowEvent): void {
    this.kept.push(event);
    if (this.kept.length > this.keptEvents) {
      this.kept.shift();
      this.first++;
    }
  }

  private close(): void {
    if (this.closed) return;
    this.closed = true;
    this.unsubscribe();
    this.onClose();
  }
}
