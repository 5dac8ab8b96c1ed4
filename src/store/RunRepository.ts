import { sql, type Kysely } from "kysely";
import type { ReadCommitted } from "./committedReads.ts";
import type { Db, Dialect } from "./database.ts";
import type { Page } from "./DatasetRepository.ts";
import type { Database, RunTable } from "./schema.ts";
import { precompile } from "./precompiled.ts";
import { RUN_CHANGES_CHANNEL, RunChanges } from "./RunChanges.ts";
import { timestamp } from "../domain/time.ts";
import {
  activeStatuses,
  type RunStats,
  type RunStatus,
  type RunTotals,
  type TrainMethod,
} from "../contract/runs.ts";
import { type RunConfig, type TrainerName } from "../domain/runs.ts";
import type { RunPlan } from "../contract/estimate.ts";
import type { Run } from "../domain/runs.ts";

export type { Run } from "../domain/runs.ts";

/**
 * A READY run's totals as its trainer reported them (`stats.final`: the trainer's `TrainingStats`) and the
 * plan it was created with, for planning the next run of the same trainer, model and method.
 */
export interface FinishedRun {
  final: Partial<RunTotals> & {
    trainSeconds?: number;
    /** The trainer's own seconds; `runSeconds` counts the whole attempt. */
    elapsedSeconds?: number;
    resumedFromStep?: number;
    stoppedEarly?: boolean;
  };
  plan: RunPlan | null;
}

/** Where a run is mirrored in MLflow. */
export interface MlflowRunRef {
  experimentId: string;
  runId: string;
}

export interface NewRun {
  id: string;
  userId: string;
  datasetId: string;
  datasetName: string;
  name: string;
  ioPairsCount: number;
  trackerUrl: string;
  config: RunConfig;
  /** Log lines after `run queued`, written with the run (how its settings were chosen). Defaults to none. */
  logs?: string[];
  /** The estimate made at creation. Defaults to none. */
  estimate?: RunPlan | null;
}

/** What runs stored before `jobRequest` keep of an OpenAI job, under OpenAI's names. */
interface StoredOpenAiJob {
  training_file: string;
  suffix: string | null;
  metadata: Record<string, string> | null;
  learning_rate_multiplier: number | null;
  model?: string;
}

/**
 * A stored run's config: a run stored before `jobRequest` keeps its OpenAI job as `openai`, under OpenAI's field
 * names, and is read as the same run with its `jobRequest`.
 */
export function runConfigOf(stored: string): RunConfig {
  const { openai, ...config } = JSON.parse(stored) as RunConfig & { openai?: StoredOpenAiJob };
  if (openai === undefined || config.jobRequest !== undefined) return config;
  return {
    ...config,
    jobRequest: {
      face: "openai",
      trainingFileID: openai.training_file,
      suffix: openai.suffix,
      metadata: openai.metadata,
      lrMultiplier: openai.learning_rate_multiplier,
      ...(openai.model === undefined ? {} : { model: openai.model }),
    },
  };
}

function toRun(row: RunTable, logs: string[]): Run {
  return {
    id: row.id,
    userId: row.user_id,
    datasetId: row.dataset_id,
    datasetName: row.dataset_name,
    name: row.name,
    ioPairsCount: row.io_pairs_count,
    status: row.status as RunStatus,
    trackerUrl: row.tracker_url,
    config: runConfigOf(row.config),
    stats: JSON.parse(row.stats) as RunStats,
    logs,
    error: row.error,
    modelPath: row.model_path,
    attempts: row.attempts,
    pausing: isPausing(row),
    estimate: row.estimate === null ? null : (JSON.parse(row.estimate) as RunPlan),
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

/** A run log line as stored: its time, then the message. */
function logLine(now: string, message: string): string {
  return `${now} ${message}`;
}

/** Appends `line` to a run's log with the next sequence number, inside `tx`. */
async function insertLine(tx: Kysely<Database>, runId: string, line: string, now: string): Promise<void> {
  await tx
    .insertInto("run_logs")
    .columns(["run_id", "seq", "line", "created_at"])
    .expression((eb) =>
      eb
        .selectFrom("run_logs")
        .select([
          sql<string>`${runId}`.as("run_id"),
          sql<number>`coalesce(max(seq), -1) + 1`.as("seq"),
          sql<string>`${line}`.as("line"),
          sql<string>`${now}`.as("created_at"),
        ])
        .where("run_id", "=", runId),
    )
    .execute();
}

/** PostgreSQL's driver parses JSON columns; SQLite returns the text. */
function parseLines(value: string | string[]): string[] {
  return typeof value === "string" ? (JSON.parse(value) as string[]) : value;
}

/** A PAUSED run whose worker still holds its lease: its trainer is stopping. */
function isPausing(row: Pick<RunTable, "status" | "lease_owner" | "lease_expires_at">): boolean {
  return (
    row.status === "PAUSED" &&
    row.lease_owner !== null &&
    row.lease_expires_at !== null &&
    row.lease_expires_at >= timestamp()
  );
}

function later(ms: number): string {
  return timestamp(new Date(Date.now() + ms));
}

/**
 * Fine-tuning runs. The runs table is also the job queue: a worker claims the oldest QUEUED
 * run with a lease it renews by heartbeat (`FOR UPDATE SKIP LOCKED` on PostgreSQL, so many
 * workers can share one database). Every user-facing method takes the owner.
 */
export class RunRepository {
  /**
   * Wakes followers of a run after each write of its log, stats or status, here and (PostgreSQL
   * `NOTIFY`) on the other servers sharing the database; `listen` hears theirs.
   */
  readonly changes = new RunChanges();

  /** The last pending append of each run, so its lines are written one after another. */
  private readonly appending = new Map<string, Promise<unknown>>();

  /** A user's run with its log: every read of a run (and its events stream) makes it, so it is compiled once. */
  private readonly ownRun;
  /** A user's run's status, error, stats and last log line's seq: what its followers read on each change. */
  private readonly ownRunState;

  constructor(
    private readonly db: Kysely<Database>,
    private readonly dialect: Dialect,
    readCommitted?: ReadCommitted,
  ) {
    this.ownRun = precompile<Database, RunTable & { log_lines: string | string[] }, [string, string]>(
      db,
      (arg) =>
        db
          .selectFrom("runs")
          .selectAll()
          .select(this.logLines())
          .where("id", "=", arg(0))
          .where("user_id", "=", arg(1)),
      readCommitted,
    );
    this.ownRunState = precompile<
      Database,
      Pick<RunTable, "id" | "status" | "error" | "stats"> & { last_log_seq: number },
      [string, string]
    >(
      db,
      (arg) =>
        db
          .selectFrom("runs")
          .select(["id", "status", "error", "stats"])
          .select(
            sql<number>`(select coalesce(max(run_logs.seq), -1) from run_logs where run_logs.run_id = runs.id)`.as(
              "last_log_seq",
            ),
          )
          .where("id", "=", arg(0))
          .where("user_id", "=", arg(1)),
      readCommitted,
    );
  }

  /** Hears the writes of other servers sharing a PostgreSQL database; returns the function that stops. */
  listen(db: Pick<Db, "listen">): Promise<() => Promise<void>> {
    return db.listen(
      RUN_CHANGES_CHANNEL,
      (payload) => this.changes.notified(payload),
      () => this.changes.changedAll(),
    );
  }

  /**
   * Tells followers that `runId` was written: on PostgreSQL with `NOTIFY` (inside `tx`, it is sent
   * when the transaction commits), and those of this process at once (call it after the commit).
   */
  private async changed(runId: string, tx: Kysely<Database> = this.db): Promise<void> {
    if (this.dialect === "postgres")
      await sql`select pg_notify(${RUN_CHANGES_CHANNEL}, ${this.changes.payload(runId)})`.execute(tx);
    if (tx === this.db) this.changes.changed(runId);
  }

  async create(run: NewRun): Promise<Run> {
    const now = timestamp();
    const row: RunTable = {
      id: run.id,
      user_id: run.userId,
      dataset_id: run.datasetId,
      dataset_name: run.datasetName,
      name: run.name,
      io_pairs_count: run.ioPairsCount,
      status: "QUEUED",
      tracker_url: run.trackerUrl,
      config: JSON.stringify(run.config),
      stats: "{}",
      error: null,
      model_path: null,
      lease_owner: null,
      lease_expires_at: null,
      attempts: 0,
      mlflow_experiment_id: null,
      mlflow_run_id: null,
      estimate: run.estimate ? JSON.stringify(run.estimate) : null,
      created_at: now,
      updated_at: now,
    };
    const lines = ["run queued", ...(run.logs ?? [])].map((message) => logLine(now, message));
    await this.db.transaction().execute(async (tx) => {
      await tx.insertInto("runs").values(row).execute();
      await tx
        .insertInto("run_logs")
        .values(lines.map((line, seq) => ({ run_id: row.id, seq, line, created_at: now })))
        .execute();
    });
    return toRun(row, lines);
  }

  async get(userId: string, id: string): Promise<Run | undefined> {
    const [row] = await this.ownRun(id, userId);
    return row && toRun(row, parseLines(row.log_lines));
  }

  /** For workers: a run by id regardless of owner. */
  async getById(id: string): Promise<Run | undefined> {
    const row = await this.db
      .selectFrom("runs")
      .selectAll()
      .select(this.logLines())
      .where("id", "=", id)
      .executeTakeFirst();
    return row && toRun(row, parseLines(row.log_lines));
  }

  /** The status of each of `ids` that is a run (the sweeper's question about run directories). */
  async statuses(ids: string[]): Promise<Map<string, RunStatus>> {
    const found = new Map<string, RunStatus>();
    for (let start = 0; start < ids.length; start += 500) {
      const rows = await this.db
        .selectFrom("runs")
        .select(["id", "status"])
        .where("id", "in", ids.slice(start, start + 500))
        .execute();
      for (const row of rows) found.set(row.id, row.status as RunStatus);
    }
    return found;
  }

  async list(userId: string, page: Page): Promise<Run[]> {
    const rows = await this.db
      .selectFrom("runs")
      .selectAll()
      .select(this.logLines())
      .where("user_id", "=", userId)
      .orderBy("created_at", "desc")
      .orderBy("id", "desc")
      .limit(page.limit)
      .offset(page.offset)
      .execute();
    return rows.map((row) => toRun(row, parseLines(row.log_lines)));
  }

  /**
   * The user's runs without their logs, by id (creation order), newest first, from before the cursor
   * `after` (a run id, which need not exist any more): OpenAI's job list pages this way.
   */
  async listAfter(userId: string, page: { after?: string | undefined; limit: number }): Promise<Run[]> {
    let query = this.db.selectFrom("runs").selectAll().where("user_id", "=", userId);
    if (page.after !== undefined) query = query.where("id", "<", page.after);
    const rows = await query.orderBy("id", "desc").limit(page.limit).execute();
    return rows.map((row) => toRun(row, []));
  }

  /** The user's READY runs (servable models), without logs. */
  async listReady(
    userId: string,
  ): Promise<Pick<Run, "id" | "name" | "updatedAt" | "config" | "modelPath">[]> {
    const rows = await this.db
      .selectFrom("runs")
      .select(["id", "name", "updated_at", "config", "model_path"])
      .where("user_id", "=", userId)
      .where("status", "=", "READY")
      .orderBy("created_at", "desc")
      .orderBy("id", "desc")
      .execute();
    return rows.map((r) => ({
      id: r.id,
      name: r.name,
      updatedAt: r.updated_at,
      config: runConfigOf(r.config),
      modelPath: r.model_path,
    }));
  }

  /**
   * This server's latest READY runs (any user's: the rate is the machine's) of a trainer, base model and
   * method, newest first, with their trainer's totals and the plan they were created with.
   */
  async finishedRuns(
    match: { trainer: TrainerName; baseModelName: string; method: TrainMethod },
    limit: number,
  ): Promise<FinishedRun[]> {
    // Runs older than the trainer choice have no `trainer` (llama.cpp), older than LoRA no `method` (full).
    const field = (column: "config" | "stats", key: string) =>
      this.dialect === "postgres"
        ? sql<string | null>`(${sql.ref(column)}::jsonb ->> ${key})`
        : sql<string | null>`json_extract(${sql.ref(column)}, ${`$.${key}`})`;
    const final =
      this.dialect === "postgres"
        ? sql<string | null>`(stats::jsonb -> 'final')::text`
        : field("stats", "final");
    const rows = await this.db
      .selectFrom("runs")
      .select([final.as("final"), "estimate"])
      .where("status", "=", "READY")
      .where(sql`coalesce(${field("config", "trainer")}, 'llama.cpp')`, "=", match.trainer)
      .where(field("config", "baseModelName"), "=", match.baseModelName)
      .where(sql`coalesce(${field("config", "method")}, 'full')`, "=", match.method)
      .orderBy("updated_at", "desc")
      .orderBy("id", "desc")
      .limit(limit)
      .execute();
    return rows.flatMap((row) =>
      row.final === null
        ? []
        : [
            {
              final: JSON.parse(row.final) as FinishedRun["final"],
              plan: row.estimate === null ? null : (JSON.parse(row.estimate) as RunPlan),
            },
          ],
    );
  }

  /**
   * The run's log lines as one JSON array column, in order, so a run and its log are one query
   * (one round trip to PostgreSQL). Both dialects order inside the aggregate.
   */
  private logLines() {
    const lines =
      this.dialect === "postgres"
        ? sql`json_agg(run_logs.line order by run_logs.seq)`
        : sql`json_group_array(run_logs.line order by run_logs.seq)`;
    return sql<
      string | string[]
    >`(select coalesce(${lines}, '[]') from run_logs where run_logs.run_id = runs.id)`.as("log_lines");
  }

  /**
   * Log lines after `afterSeq` (for live streams), with their sequence numbers, at most `limit`, none after
   * `untilSeq` when it is given.
   */
  async logsSince(
    runId: string,
    afterSeq: number,
    limit = Number.MAX_SAFE_INTEGER,
    untilSeq?: number,
  ): Promise<{ seq: number; line: string }[]> {
    let query = this.db
      .selectFrom("run_logs")
      .select(["seq", "line"])
      .where("run_id", "=", runId)
      .where("seq", ">", afterSeq);
    if (untilSeq !== undefined) query = query.where("seq", "<=", untilSeq);
    return query.orderBy("seq").limit(limit).execute();
  }

  /**
   * What the followers of a user's run look at: its status, error and stats, and the seq of its last log
   * line (`-1`: none), so that they read the log only when it grew.
   */
  async followed(
    userId: string,
    id: string,
  ): Promise<(Pick<Run, "id" | "status" | "error" | "stats"> & { lastLogSeq: number }) | undefined> {
    const [row] = await this.ownRunState(id, userId);
    return (
      row && {
        id: row.id,
        status: row.status as RunStatus,
        error: row.error,
        stats: JSON.parse(row.stats) as RunStats,
        lastLogSeq: row.last_log_seq,
      }
    );
  }

  /**
   * Appends a timestamped log line and touches `updatedAt`. The scheduler does not wait for each
   * line, so appends to one run are queued here in call order. Touching the run first locks its
   * row, so a line from another process sharing the database waits and takes the next number.
   */
  appendLog(runId: string, message: string): Promise<string> {
    const append = (this.appending.get(runId) ?? Promise.resolve()).then(() =>
      this.insertLog(runId, message),
    );
    const settled = append.then(
      () => undefined,
      () => undefined,
    );
    this.appending.set(runId, settled);
    void settled.then(() => {
      if (this.appending.get(runId) === settled) this.appending.delete(runId);
    });
    return append;
  }

  private async insertLog(runId: string, message: string): Promise<string> {
    const now = timestamp();
    const line = logLine(now, message);
    await this.db.transaction().execute(async (tx) => {
      const touched = await tx
        .updateTable("runs")
        .set({ updated_at: now })
        .where("id", "=", runId)
        .executeTakeFirst();
      // A run deleted while its trainer winds down (delete right after cancel): the line has
      // nowhere to go, and that is not an error.
      if (Number(touched.numUpdatedRows) === 0) return;
      await this.changed(runId, tx);
      await insertLine(tx, runId, line, now);
    });
    this.changes.changed(runId);
    return line;
  }

  /**
   * Moves a QUEUED or RUNNING run to CANCELLED. Returns the status it had when it was cancelled,
   * or, when it had already ended, the status it ended with (the caller answers 409); undefined
   * if the user has no such run. The update is conditional on the status just read, so a run
   * that ends (or starts) in between is read again rather than misreported. The log line saying so
   * is written in the same commit, after the lines already on their way: a follower ends its stream
   * at the final status, so a line written after it could be missed.
   */
  async cancel(userId: string, id: string): Promise<RunStatus | undefined> {
    for (;;) {
      const run = await this.db
        .selectFrom("runs")
        .select("status")
        .where("id", "=", id)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      if (!run) return undefined;
      const status = run.status as RunStatus;
      if (!activeStatuses.includes(status)) return status;
      await this.appending.get(id);
      const now = timestamp();
      const cancelled = await this.db.transaction().execute(async (tx) => {
        const result = await tx
          .updateTable("runs")
          .set({ status: "CANCELLED", lease_owner: null, lease_expires_at: null, updated_at: now })
          .where("id", "=", id)
          .where("status", "=", status)
          .executeTakeFirst();
        if (Number(result.numUpdatedRows) === 0) return false;
        // Said with the status, for a follower ends its stream there: what happens next (the trainer stopping,
        // the files going) is said now, not after.
        const next =
          status === "RUNNING" ? "; its trainer stops at a step boundary and its files are removed" : "";
        await insertLine(tx, id, logLine(now, `run cancelled by the user (was ${status})${next}`), now);
        await this.changed(id, tx);
        return true;
      });
      if (cancelled) {
        this.changes.changed(id);
        return status;
      }
    }
  }

  /**
   * Moves a QUEUED or RUNNING run to PAUSED. A RUNNING run keeps its lease: its worker stops the trainer and then
   * lets go ({@link settlePaused}); until then the run is `pausing`. Returns the status it had, or, when it could
   * not be paused, the status it has (the caller answers 409); undefined if the user has no such run.
   */
  async pause(userId: string, id: string): Promise<RunStatus | undefined> {
    return this.moveByUser(userId, id, ["QUEUED", "RUNNING"], (status) => ({
      to: "PAUSED",
      message:
        status === "RUNNING"
          ? "run paused by the user (was RUNNING); its trainer stops at a step boundary and its checkpoint is kept"
          : "run paused by the user (was QUEUED)",
    }));
  }

  /**
   * Moves a PAUSED run whose trainer has stopped back to QUEUED (the scheduler resumes it from its checkpoint).
   * Returns `"PAUSED"` when resumed, the status it has otherwise (`"PAUSING"`: its trainer is still stopping);
   * undefined if the user has no such run.
   */
  async resume(userId: string, id: string): Promise<RunStatus | "PAUSING" | undefined> {
    let pausing = false;
    const previous = await this.moveByUser(userId, id, ["PAUSED"], (_status, row) => {
      pausing = isPausing(row);
      return pausing ? undefined : { to: "QUEUED", message: "run resumed by the user: it is queued again" };
    });
    return pausing ? "PAUSING" : previous;
  }

  /**
   * The user's status change `from` one of `from` to what `change` says (nothing when it says nothing), with its
   * log line in the same commit and the lease cleared unless the run is paused while running. Conditional on the
   * status just read, so a run that moves in between is read again. Returns the status read.
   */
  private async moveByUser(
    userId: string,
    id: string,
    from: RunStatus[],
    change: (
      status: RunStatus,
      row: Pick<RunTable, "status" | "lease_owner" | "lease_expires_at">,
    ) => { to: RunStatus; message: string } | undefined,
  ): Promise<RunStatus | undefined> {
    for (;;) {
      const row = await this.db
        .selectFrom("runs")
        .select(["status", "lease_owner", "lease_expires_at"])
        .where("id", "=", id)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      if (!row) return undefined;
      const status = row.status as RunStatus;
      if (!from.includes(status)) return status;
      const next = change(status, row);
      if (!next) return status;
      await this.appending.get(id);
      const now = timestamp();
      const keepLease = status === "RUNNING" && next.to === "PAUSED";
      const moved = await this.db.transaction().execute(async (tx) => {
        const result = await tx
          .updateTable("runs")
          .set({
            status: next.to,
            ...(keepLease ? {} : { lease_owner: null, lease_expires_at: null }),
            updated_at: now,
          })
          .where("id", "=", id)
          .where("status", "=", status)
          .where((eb) =>
            row.lease_owner === null
              ? eb("lease_owner", "is", null)
              : eb("lease_owner", "=", row.lease_owner),
          )
          .executeTakeFirst();
        if (Number(result.numUpdatedRows) === 0) return false;
        await insertLine(tx, id, logLine(now, next.message), now);
        await this.changed(id, tx);
        return true;
      });
      if (moved) {
        this.changes.changed(id);
        return status;
      }
    }
  }

  /**
   * A worker whose paused run's trainer has stopped lets the run go: the lease is cleared (the run can be resumed)
   * and the attempt does not count (a pause is no failed attempt). False when the run is no longer this worker's
   * PAUSED run (cancelled, deleted or resumed meanwhile).
   */
  async settlePaused(id: string, owner: string, message: string): Promise<boolean> {
    await this.appending.get(id);
    const now = timestamp();
    const settled = await this.db.transaction().execute(async (tx) => {
      const result = await tx
        .updateTable("runs")
        .set((eb) => ({
          lease_owner: null,
          lease_expires_at: null,
          attempts: eb("attempts", "-", 1),
          updated_at: now,
        }))
        .where("id", "=", id)
        .where("status", "=", "PAUSED")
        .where("lease_owner", "=", owner)
        .executeTakeFirst();
      if (Number(result.numUpdatedRows) === 0) return false;
      await insertLine(tx, id, logLine(now, message), now);
      await this.changed(id, tx);
      return true;
    });
    if (settled) this.changes.changed(id);
    return settled;
  }

  async delete(userId: string, id: string): Promise<boolean> {
    const deleted = await this.db.transaction().execute(async (tx) => {
      await tx
        .deleteFrom("run_logs")
        .where("run_id", "in", (eb) =>
          eb.selectFrom("runs").select("id").where("id", "=", id).where("user_id", "=", userId),
        )
        .execute();
      const result = await tx
        .deleteFrom("runs")
        .where("id", "=", id)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      const deleted = Number(result.numDeletedRows) > 0;
      if (deleted) await this.changed(id, tx);
      return deleted;
    });
    if (deleted) this.changes.changed(id);
    return deleted;
  }

  /** Claims the oldest QUEUED run for `owner` with a lease of `leaseMs`; undefined if none. */
  async claimNext(owner: string, leaseMs: number): Promise<Run | undefined> {
    const id = await this.db.transaction().execute(async (tx) => {
      let query = tx
        .selectFrom("runs")
        .select("id")
        .where("status", "=", "QUEUED")
        .orderBy("created_at")
        .orderBy("id")
        .limit(1);
      if (this.dialect === "postgres") query = query.forUpdate().skipLocked();
      const next = await query.executeTakeFirst();
      if (!next) return undefined;
      const result = await tx
        .updateTable("runs")
        .set((eb) => ({
          status: "RUNNING",
          lease_owner: owner,
          lease_expires_at: later(leaseMs),
          attempts: eb("attempts", "+", 1),
          updated_at: timestamp(),
        }))
        .where("id", "=", next.id)
        .where("status", "=", "QUEUED")
        .executeTakeFirst();
      return Number(result.numUpdatedRows) > 0 ? next.id : undefined;
    });
    if (id === undefined) return undefined;
    await this.changed(id);
    return this.getById(id);
  }

  /** True when `rows` were updated, and then followers of `runId` hear of it. */
  private async changedIf(runId: string, rows: bigint): Promise<boolean> {
    if (Number(rows) === 0) return false;
    await this.changed(runId);
    return true;
  }

  /** Renews the lease; false when the run is no longer this worker's RUNNING run (e.g. cancelled). */
  async heartbeat(id: string, owner: string, leaseMs: number): Promise<boolean> {
    const result = await this.db
      .updateTable("runs")
      .set({ lease_expires_at: later(leaseMs) })
      .where("id", "=", id)
      .where("status", "=", "RUNNING")
      .where("lease_owner", "=", owner)
      .executeTakeFirst();
    return Number(result.numUpdatedRows) > 0;
  }

  /** Stores the latest stats of a run this worker holds; false if it no longer holds it. */
  async updateStats(id: string, owner: string, stats: RunStats): Promise<boolean> {
    const result = await this.db
      .updateTable("runs")
      .set({ stats: JSON.stringify(stats), updated_at: timestamp() })
      .where("id", "=", id)
      .where("status", "=", "RUNNING")
      .where("lease_owner", "=", owner)
      .executeTakeFirst();
    return this.changedIf(id, result.numUpdatedRows);
  }

  /**
   * The MLflow experiment and run a run is mirrored to: `null` while none is recorded, undefined
   * when there is no such run (deleted).
   */
  async mlflowRun(id: string): Promise<MlflowRunRef | null | undefined> {
    const row = await this.db
      .selectFrom("runs")
      .select(["mlflow_experiment_id", "mlflow_run_id"])
      .where("id", "=", id)
      .executeTakeFirst();
    if (!row) return undefined;
    return row.mlflow_experiment_id && row.mlflow_run_id
      ? { experimentId: row.mlflow_experiment_id, runId: row.mlflow_run_id }
      : null;
  }

  /**
   * Records the MLflow run a run is mirrored to and makes `trackerUrl` its address, unless one is
   * recorded already (another process got there first). Returns the one recorded in the end;
   * undefined when the run no longer exists.
   */
  async recordMlflowRun(
    id: string,
    ref: MlflowRunRef,
    trackerUrl: string,
  ): Promise<MlflowRunRef | undefined> {
    await this.db
      .updateTable("runs")
      .set({ mlflow_experiment_id: ref.experimentId, mlflow_run_id: ref.runId, tracker_url: trackerUrl })
      .where("id", "=", id)
      .where("mlflow_run_id", "is", null)
      .executeTakeFirst();
    return (await this.mlflowRun(id)) ?? undefined;
  }

  /**
   * Ends a RUNNING run this worker holds; false if it was cancelled or taken meanwhile. `message`, when given,
   * goes in its log in the same commit, after the lines already on their way: a follower ends its stream at
   * the final status, so a line written after it could be missed.
   */
  async finish(
    id: string,
    owner: string,
    outcome: {
      status: "READY" | "FAILED" | "CANCELLED";
      modelPath?: string;
      error?: string;
      message?: string;
    },
  ): Promise<boolean> {
    await this.appending.get(id);
    const now = timestamp();
    const finished = await this.db.transaction().execute(async (tx) => {
      const result = await tx
        .updateTable("runs")
        .set({
          status: outcome.status,
          model_path: outcome.modelPath ?? null,
          error: outcome.error ?? null,
          lease_owner: null,
          lease_expires_at: null,
          updated_at: now,
        })
        .where("id", "=", id)
        // A run paused after its trainer had finished ends as its trainer did.
        .where("status", "in", ["RUNNING", "PAUSED"])
        .where("lease_owner", "=", owner)
        .executeTakeFirst();
      if (Number(result.numUpdatedRows) === 0) return false;
      if (outcome.message !== undefined) await insertLine(tx, id, logLine(now, outcome.message), now);
      await this.changed(id, tx);
      return true;
    });
    if (finished) this.changes.changed(id);
    return finished;
  }

  /** Hands a RUNNING run this worker holds back to the queue (graceful shutdown). */
  async release(id: string, owner: string): Promise<boolean> {
    const result = await this.db
      .updateTable("runs")
      // A clean hand-back is not a failed attempt.
      .set((eb) => ({
        status: "QUEUED",
        lease_owner: null,
        lease_expires_at: null,
        attempts: eb("attempts", "-", 1),
        updated_at: timestamp(),
      }))
      .where("id", "=", id)
      .where("status", "=", "RUNNING")
      .where("lease_owner", "=", owner)
      .executeTakeFirst();
    return this.changedIf(id, result.numUpdatedRows);
  }

  /**
   * Crash recovery: RUNNING runs whose lease has expired (their worker died) go back to QUEUED,
   * or to FAILED once they have been started `maxAttempts` times, each with its log line in the same commit
   * (a follower ends its stream at FAILED, so a line after it could be missed). Returns the affected ids.
   */
  async recoverExpired(
    maxAttempts: number,
    /**
     * Called for each expired run before it is taken back, while no worker can claim it: the caller
     * removes what the dead attempt left (its work directory) and says where the next attempt starts
     * (`it resumes from its checkpoint at step 40`), for the run's log.
     */
    beforeRecover?: (runId: string) => Promise<string | void>,
  ): Promise<{ requeued: string[]; failed: string[] }> {
    const now = timestamp();
    const expired = await this.db
      .selectFrom("runs")
      .select(["id", "attempts"])
      .where("status", "=", "RUNNING")
      .where((eb) => eb.or([eb("lease_expires_at", "is", null), eb("lease_expires_at", "<", now)]))
      .execute();
    const requeued: string[] = [];
    const failed: string[] = [];
    for (const run of expired) {
      const fail = run.attempts >= maxAttempts;
      const resumes = (await beforeRecover?.(run.id)) ?? "it starts again from the base model";
      const message = fail
        ? `run failed: its trainer stopped without finishing ${run.attempts} times (server crash or restart)`
        : `run re-queued: the server stopped while it was training; ${resumes}`;
      await this.appending.get(run.id);
      const recovered = await this.db.transaction().execute(async (tx) => {
        const result = await tx
          .updateTable("runs")
          .set({
            status: fail ? "FAILED" : "QUEUED",
            error: fail ? "the trainer stopped without finishing too many times" : null,
            lease_owner: null,
            lease_expires_at: null,
            updated_at: now,
          })
          .where("id", "=", run.id)
          .where("status", "=", "RUNNING")
          .where((eb) => eb.or([eb("lease_expires_at", "is", null), eb("lease_expires_at", "<", now)]))
          .executeTakeFirst();
        if (Number(result.numUpdatedRows) === 0) return false;
        await insertLine(tx, run.id, logLine(now, message), now);
        await this.changed(run.id, tx);
        return true;
      });
      if (!recovered) continue;
      this.changes.changed(run.id);
      (fail ? failed : requeued).push(run.id);
    }
    return { requeued, failed };
  }
}
