import type { Kysely } from "kysely";
import type { ReadCommitted } from "./committedReads.ts";
import { precompile } from "./precompiled.ts";
import type { EvalRunProgress, EvalRunStatus, GraderScore, ModelTotals } from "../contract/evals.ts";
import type {
  Eval,
  EvalConfig,
  EvalResult,
  EvalRun,
  EvalRunConfig,
  ResolvedItem,
  RunEvalRun,
} from "../domain/evals.ts";
import type { Database, EvalResultTable, EvalRunTable, EvalTable } from "./schema.ts";
import { timestamp } from "../domain/time.ts";

type RunEvalRunRow = Pick<
  EvalRunTable,
  "id" | "eval_id" | "status" | "models" | "progress" | "results" | "error"
>;

function toRunEvalRun(row: RunEvalRunRow): RunEvalRun {
  return {
    id: row.id,
    evalId: row.eval_id,
    status: row.status as EvalRunStatus,
    models: JSON.parse(row.models) as string[],
    progress: JSON.parse(row.progress) as EvalRunProgress,
    results: JSON.parse(row.results) as ModelTotals[],
    error: row.error,
  };
}

/** A stored eval's config: one stored before `faceRequest` keeps the OpenAI face's under `openai`, in its names. */
export function evalConfigOf(stored: string): EvalConfig {
  const { openai, ...config } = JSON.parse(stored) as EvalConfig & {
    openai?: {
      data_source_config: unknown;
      testing_criteria: unknown;
      metadata: Record<string, string> | null;
      expectedField: string | null;
    };
  };
  if (openai === undefined || config.faceRequest !== undefined) return config;
  return {
    ...config,
    faceRequest: {
      face: "openai",
      dataSourceConfig: openai.data_source_config,
      testingCriteria: openai.testing_criteria,
      metadata: openai.metadata,
      expectedField: openai.expectedField,
    },
  };
}

/** A stored eval run's config: one stored before `faceRequest` keeps the OpenAI face's under `openai`. */
export function evalRunConfigOf(stored: string): EvalRunConfig {
  const { openai, ...config } = JSON.parse(stored) as EvalRunConfig & {
    openai?: { data_source: unknown; metadata: Record<string, string> | null };
  };
  if (openai === undefined || config.faceRequest !== undefined) return config;
  return {
    ...config,
    faceRequest: { face: "openai", dataSource: openai.data_source, metadata: openai.metadata },
  };
}

function toEval(row: EvalTable): Eval {
  return {
    id: row.id,
    userId: row.user_id,
    name: row.name,
    config: evalConfigOf(row.config),
    runId: row.run_id,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

function toEvalRun(row: EvalRunTable): EvalRun {
  return {
    id: row.id,
    evalId: row.eval_id,
    userId: row.user_id,
    name: row.name,
    status: row.status as EvalRunStatus,
    models: JSON.parse(row.models) as string[],
    items: JSON.parse(row.items) as ResolvedItem[],
    config: evalRunConfigOf(row.config),
    progress: JSON.parse(row.progress) as EvalRunProgress,
    results: JSON.parse(row.results) as ModelTotals[],
    error: row.error,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

function toResult(row: EvalResultTable): EvalResult {
  return {
    runId: row.run_id,
    modelIndex: row.model_index,
    itemIndex: row.item_index,
    model: row.model,
    answer: row.answer,
    scores: JSON.parse(row.scores) as GraderScore[],
    latencyMs: row.latency_ms,
    promptTokens: row.prompt_tokens,
    completionTokens: row.completion_tokens,
    error: row.error,
  };
}

/** Evals, their runs and their per-item results; every read by a user is of that user's rows only. */
export class EvalRepository {
  /** The eval run a fine-tuning run's before/after is told from: every read of a run makes it, so it is compiled once. */
  private readonly runEvalRun;

  constructor(
    private readonly db: Kysely<Database>,
    readCommitted?: ReadCommitted,
  ) {
    this.runEvalRun = precompile<Database, RunEvalRunRow, [string, string]>(
      db,
      (arg) =>
        db
          .selectFrom("eval_runs")
          .select(["id", "eval_id", "status", "models", "progress", "results", "error"])
          .where("eval_id", "=", (eb) =>
            eb
              .selectFrom("evals")
              .select("id")
              .where("user_id", "=", arg(0))
              .where("run_id", "=", arg(1))
              .orderBy("id", "desc")
              .limit(1),
          )
          .where("user_id", "=", arg(0))
          .orderBy("id", "desc")
          .limit(1),
      readCommitted,
      // Read just after the run was found to be the user's: no request can fill the memory with empty answers.
      { rememberEmpty: true },
    );
  }

  async create(input: {
    id: string;
    userId: string;
    name: string;
    config: EvalConfig;
    runId?: string | null;
  }): Promise<Eval> {
    const now = timestamp();
    const row: EvalTable = {
      id: input.id,
      user_id: input.userId,
      name: input.name,
      config: JSON.stringify(input.config),
      run_id: input.runId ?? null,
      created_at: now,
      updated_at: now,
    };
    await this.db.insertInto("evals").values(row).execute();
    return toEval(row);
  }

  async get(userId: string, id: string): Promise<Eval | undefined> {
    const row = await this.db
      .selectFrom("evals")
      .selectAll()
      .where("id", "=", id)
      .where("user_id", "=", userId)
      .executeTakeFirst();
    return row && toEval(row);
  }

  /** The user's evals, newest first, from before the cursor `after` (an eval id) when given. */
  async list(
    userId: string,
    page: { limit: number; offset?: number; after?: string | undefined; order?: "asc" | "desc" },
  ): Promise<Eval[]> {
    const asc = page.order === "asc";
    let query = this.db.selectFrom("evals").selectAll().where("user_id", "=", userId);
    if (page.after !== undefined) query = query.where("id", asc ? ">" : "<", page.after);
    const rows = await query
      .orderBy("id", asc ? "asc" : "desc")
      .limit(page.limit)
      .offset(page.offset ?? 0)
      .execute();
    return rows.map(toEval);
  }

  async rename(
    userId: string,
    id: string,
    name: string,
    metadata?: Record<string, string> | null,
  ): Promise<Eval | undefined> {
    const found = await this.get(userId, id);
    if (!found) return undefined;
    const config =
      metadata !== undefined && found.config.faceRequest
        ? { ...found.config, faceRequest: { ...found.config.faceRequest, metadata } }
        : found.config;
    await this.db
      .updateTable("evals")
      .set({ name, config: JSON.stringify(config), updated_at: timestamp() })
      .where("id", "=", id)
      .where("user_id", "=", userId)
      .execute();
    return this.get(userId, id);
  }

  /** Deletes an eval with its runs and results; false when the user has no such eval. */
  async delete(userId: string, id: string): Promise<boolean> {
    return this.db.transaction().execute(async (tx) => {
      const runs = tx
        .selectFrom("eval_runs")
        .select("id")
        .where("eval_id", "=", id)
        .where("user_id", "=", userId);
      await tx.deleteFrom("eval_results").where("run_id", "in", runs).execute();
      await tx.deleteFrom("eval_runs").where("eval_id", "=", id).where("user_id", "=", userId).execute();
      const deleted = await tx
        .deleteFrom("evals")
        .where("id", "=", id)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      return deleted.numDeletedRows > 0n;
    });
  }

  /**
   * The latest run of the latest eval made for a fine-tuning run's before/after, in one point read (on SQLite
   * remembered until anything is committed, "none" included); undefined when there is none. Call it only for a
   * run the user was found to own.
   */
  async evalRunOfRun(userId: string, runId: string): Promise<RunEvalRun | undefined> {
    const [row] = await this.runEvalRun(userId, runId);
    return row && toRunEvalRun(row);
  }

  /** {@link evalRunOfRun} of each of `runIds` (the user's) in one query: by run id, those that have one. */
  async evalRunsOfRuns(userId: string, runIds: readonly string[]): Promise<Map<string, RunEvalRun>> {
    const found = new Map<string, RunEvalRun>();
    if (runIds.length === 0) return found;
    const rows = await this.db
      .selectFrom("evals")
      .leftJoin("eval_runs", (join) =>
        join.onRef("eval_runs.eval_id", "=", "evals.id").onRef("eval_runs.user_id", "=", "evals.user_id"),
      )
      .select([
        "evals.id as made",
        "evals.run_id as run_id",
        "eval_runs.id as id",
        "eval_runs.eval_id as eval_id",
        "eval_runs.status as status",
        "eval_runs.models as models",
        "eval_runs.progress as progress",
        "eval_runs.results as results",
        "eval_runs.error as error",
      ])
      .where("evals.user_id", "=", userId)
      .where("evals.run_id", "in", [...runIds])
      .orderBy("evals.id", "desc")
      .orderBy("eval_runs.id", "desc")
      .execute();
    // The first row of each run is its latest eval's latest run (or that eval without runs: none).
    const seen = new Set<string>();
    for (const row of rows) {
      if (row.run_id === null || seen.has(row.run_id)) continue;
      seen.add(row.run_id);
      if (row.id !== null) found.set(row.run_id, toRunEvalRun(row as RunEvalRunRow));
    }
    return found;
  }

  async createRun(
    input: Omit<EvalRun, "status" | "results" | "error" | "createdAt" | "updatedAt">,
  ): Promise<EvalRun> {
    const now = timestamp();
    const row: EvalRunTable = {
      id: input.id,
      eval_id: input.evalId,
      user_id: input.userId,
      name: input.name,
      status: "QUEUED",
      models: JSON.stringify(input.models),
      items: JSON.stringify(input.items),
      config: JSON.stringify(input.config),
      progress: JSON.stringify(input.progress),
      results: "[]",
      error: null,
      created_at: now,
      updated_at: now,
    };
    await this.db.insertInto("eval_runs").values(row).execute();
    return toEvalRun(row);
  }

  async getRun(userId: string, evalId: string, id: string): Promise<EvalRun | undefined> {
    const row = await this.db
      .selectFrom("eval_runs")
      .selectAll()
      .where("id", "=", id)
      .where("eval_id", "=", evalId)
      .where("user_id", "=", userId)
      .executeTakeFirst();
    return row && toEvalRun(row);
  }

  /** What a follower of a run is told: its status, error, progress and totals (not its items). */
  async runState(
    userId: string,
    evalId: string,
    id: string,
  ): Promise<Pick<EvalRun, "status" | "error" | "progress" | "results"> | undefined> {
    const row = await this.db
      .selectFrom("eval_runs")
      .select(["status", "error", "progress", "results"])
      .where("id", "=", id)
      .where("eval_id", "=", evalId)
      .where("user_id", "=", userId)
      .executeTakeFirst();
    return (
      row && {
        status: row.status as EvalRunStatus,
        error: row.error,
        progress: JSON.parse(row.progress) as EvalRunProgress,
        results: JSON.parse(row.results) as ModelTotals[],
      }
    );
  }

  async getRunById(id: string): Promise<EvalRun | undefined> {
    const row = await this.db.selectFrom("eval_runs").selectAll().where("id", "=", id).executeTakeFirst();
    return row && toEvalRun(row);
  }

  /** An eval's runs, newest first, from before the cursor `after` (a run id) when given. */
  async listRuns(
    userId: string,
    evalId: string,
    page: { limit: number; after?: string | undefined; order?: "asc" | "desc" },
  ): Promise<EvalRun[]> {
    const asc = page.order === "asc";
    let query = this.db
      .selectFrom("eval_runs")
      .selectAll()
      .where("eval_id", "=", evalId)
      .where("user_id", "=", userId);
    if (page.after !== undefined) query = query.where("id", asc ? ">" : "<", page.after);
    const rows = await query
      .orderBy("id", asc ? "asc" : "desc")
      .limit(page.limit)
      .execute();
    return rows.map(toEvalRun);
  }

  /** Takes the oldest QUEUED run for this process: RUNNING, or undefined when none is queued. */
  async claimNext(): Promise<EvalRun | undefined> {
    for (;;) {
      const next = await this.db
        .selectFrom("eval_runs")
        .select("id")
        .where("status", "=", "QUEUED")
        .orderBy("created_at")
        .orderBy("id")
        .executeTakeFirst();
      if (!next) return undefined;
      const claimed = await this.db
        .updateTable("eval_runs")
        .set({ status: "RUNNING", updated_at: timestamp() })
        .where("id", "=", next.id)
        .where("status", "=", "QUEUED")
        .executeTakeFirst();
      if (claimed.numUpdatedRows > 0n) return this.getRunById(next.id);
    }
  }

  /** Writes a RUNNING run's progress and totals; false when it is no longer RUNNING (cancelled). */
  async updateProgress(id: string, progress: EvalRunProgress, results: ModelTotals[]): Promise<boolean> {
    const updated = await this.db
      .updateTable("eval_runs")
      .set({ progress: JSON.stringify(progress), results: JSON.stringify(results), updated_at: timestamp() })
      .where("id", "=", id)
      .where("status", "=", "RUNNING")
      .executeTakeFirst();
    return updated.numUpdatedRows > 0n;
  }

  /** Ends a RUNNING run; false when it was not RUNNING any more. */
  async finish(
    id: string,
    end: {
      status: "COMPLETED" | "FAILED";
      error?: string | null;
      progress: EvalRunProgress;
      results: ModelTotals[];
    },
  ): Promise<boolean> {
    const updated = await this.db
      .updateTable("eval_runs")
      .set({
        status: end.status,
        error: end.error ?? null,
        progress: JSON.stringify(end.progress),
        results: JSON.stringify(end.results),
        updated_at: timestamp(),
      })
      .where("id", "=", id)
      .where("status", "=", "RUNNING")
      .executeTakeFirst();
    return updated.numUpdatedRows > 0n;
  }

  /** Cancels a user's QUEUED or RUNNING run; returns its status before, or undefined when there is no such run. */
  async cancelRun(userId: string, evalId: string, id: string): Promise<EvalRunStatus | undefined> {
    return this.db.transaction().execute(async (tx) => {
      const row = await tx
        .selectFrom("eval_runs")
        .select("status")
        .where("id", "=", id)
        .where("eval_id", "=", evalId)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      if (!row) return undefined;
      if (row.status === "QUEUED" || row.status === "RUNNING")
        await tx
          .updateTable("eval_runs")
          .set({ status: "CANCELLED", updated_at: timestamp() })
          .where("id", "=", id)
          .execute();
      return row.status as EvalRunStatus;
    });
  }

  async deleteRun(userId: string, evalId: string, id: string): Promise<boolean> {
    return this.db.transaction().execute(async (tx) => {
      const owned = await tx
        .selectFrom("eval_runs")
        .select("id")
        .where("id", "=", id)
        .where("eval_id", "=", evalId)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      if (!owned) return false;
      await tx.deleteFrom("eval_results").where("run_id", "=", id).execute();
      await tx.deleteFrom("eval_runs").where("id", "=", id).execute();
      return true;
    });
  }

  /**
   * Runs left RUNNING by a server that stopped without saying so: FAILED once nothing was written to them since
   * `before` (a server answering a run writes its progress at least every few seconds).
   */
  async failStale(before: Date, except: readonly string[] = []): Promise<number> {
    let query = this.db
      .updateTable("eval_runs")
      .set({
        status: "FAILED",
        error: "the server answering it stopped while the run was in progress",
        updated_at: timestamp(),
      })
      .where("status", "=", "RUNNING")
      .where("updated_at", "<", timestamp(before));
    if (except.length > 0) query = query.where("id", "not in", except);
    const updated = await query.executeTakeFirst();
    return Number(updated.numUpdatedRows);
  }

  async addResults(results: EvalResult[]): Promise<void> {
    if (results.length === 0) return;
    const now = timestamp();
    await this.db
      .insertInto("eval_results")
      .values(
        results.map((r) => ({
          run_id: r.runId,
          model_index: r.modelIndex,
          item_index: r.itemIndex,
          model: r.model,
          answer: r.answer,
          scores: JSON.stringify(r.scores),
          latency_ms: Math.round(r.latencyMs),
          prompt_tokens: r.promptTokens,
          completion_tokens: r.completionTokens,
          error: r.error,
          created_at: now,
        })),
      )
      // A write tried again after its connection broke may have been committed the first time.
      .onConflict((oc) => oc.columns(["run_id", "model_index", "item_index"]).doNothing())
      .execute();
  }

  /** A run's results by model, then item; `model` keeps one model's (its index). */
  async results(
    runId: string,
    page: { limit: number; offset: number; modelIndex?: number | undefined },
  ): Promise<EvalResult[]> {
    let query = this.db.selectFrom("eval_results").selectAll().where("run_id", "=", runId);
    if (page.modelIndex !== undefined) query = query.where("model_index", "=", page.modelIndex);
    const rows = await query
      .orderBy("model_index")
      .orderBy("item_index")
      .limit(page.limit)
      .offset(page.offset)
      .execute();
    return rows.map(toResult);
  }

  /** Results stored so far for a run (of one model when `modelIndex` is given). */
  async countResults(runId: string, modelIndex?: number): Promise<number> {
    let query = this.db
      .selectFrom("eval_results")
      .select((eb) => eb.fn.countAll<number | string>().as("count"))
      .where("run_id", "=", runId);
    if (modelIndex !== undefined) query = query.where("model_index", "=", modelIndex);
    const row = await query.executeTakeFirst();
    return Number(row?.count ?? 0);
  }

  async result(runId: string, modelIndex: number, itemIndex: number): Promise<EvalResult | undefined> {
    const row = await this.db
      .selectFrom("eval_results")
      .selectAll()
      .where("run_id", "=", runId)
      .where("model_index", "=", modelIndex)
      .where("item_index", "=", itemIndex)
      .executeTakeFirst();
    return row && toResult(row);
  }
}
