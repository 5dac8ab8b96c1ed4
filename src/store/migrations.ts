import type { Kysely, Migration, MigrationProvider } from "kysely";

/**
 * Numbered migrations, run before the server listens. Written with Kysely's schema builder so
 * the same code creates the schema on SQLite and PostgreSQL. Never edit a released migration:
 * add the next number.
 */
const migrations: Record<string, Migration> = {
  "0001_initial": {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("api_keys")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("user_id", "text", (c) => c.notNull())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("prefix", "text", (c) => c.notNull())
        .addColumn("hash", "text", (c) => c.notNull().unique())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("last_used_at", "text")
        .execute();

      await db.schema
        .createTable("datasets")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("user_id", "text", (c) => c.notNull())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("io_pairs_count", "integer", (c) => c.notNull().defaultTo(0))
        .addColumn("status", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createIndex("datasets_user")
        .on("datasets")
        .columns(["user_id", "created_at"])
        .execute();

      await db.schema
        .createTable("files")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("dataset_id", "text", (c) => c.notNull().references("datasets.id").onDelete("cascade"))
        .addColumn("user_id", "text", (c) => c.notNull())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("size", "bigint", (c) => c.notNull())
        .addColumn("type", "text", (c) => c.notNull())
        .addColumn("format", "text", (c) => c.notNull())
        .addColumn("io_pairs_count", "integer", (c) => c.notNull())
        .addColumn("blob", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createIndex("files_dataset")
        .on("files")
        .columns(["dataset_id", "created_at"])
        .execute();

      await db.schema
        .createTable("runs")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("user_id", "text", (c) => c.notNull())
        .addColumn("dataset_id", "text", (c) => c.notNull())
        .addColumn("dataset_name", "text", (c) => c.notNull())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("io_pairs_count", "integer", (c) => c.notNull())
        .addColumn("status", "text", (c) => c.notNull())
        .addColumn("tracker_url", "text", (c) => c.notNull())
        .addColumn("config", "text", (c) => c.notNull())
        .addColumn("stats", "text", (c) => c.notNull())
        .addColumn("error", "text")
        .addColumn("model_path", "text")
        .addColumn("lease_owner", "text")
        .addColumn("lease_expires_at", "text")
        .addColumn("attempts", "integer", (c) => c.notNull().defaultTo(0))
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("runs_user").on("runs").columns(["user_id", "created_at"]).execute();
      await db.schema.createIndex("runs_status").on("runs").columns(["status", "created_at"]).execute();

      await db.schema
        .createTable("run_logs")
        .addColumn("run_id", "text", (c) => c.notNull().references("runs.id").onDelete("cascade"))
        .addColumn("seq", "integer", (c) => c.notNull())
        .addColumn("line", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .addPrimaryKeyConstraint("run_logs_pk", ["run_id", "seq"])
        .execute();
    },
  },
  // Never written: checking it on every request costs a write per request, and nothing showed it.
  "0002_drop_key_last_used": {
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable("api_keys").dropColumn("last_used_at").execute();
    },
  },
  // The MLflow run a run is mirrored to, so that a restart logs to the same one.
  "0003_run_mlflow": {
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable("runs").addColumn("mlflow_experiment_id", "text").execute();
      await db.schema.alterTable("runs").addColumn("mlflow_run_id", "text").execute();
    },
  },
  // The estimate made when a run is created (`RunPlan`, JSON): runs before it have none.
  "0004_run_estimate": {
    async up(db: Kysely<unknown>) {
      await db.schema.alterTable("runs").addColumn("estimate", "text").execute();
    },
  },
  // Evaluations: evals, their runs, and each model's answer to each item with its scores.
  "0005_evals": {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("evals")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("user_id", "text", (c) => c.notNull())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("config", "text", (c) => c.notNull())
        .addColumn("run_id", "text")
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema.createIndex("evals_user").on("evals").columns(["user_id", "created_at"]).execute();
      await db.schema.createIndex("evals_run").on("evals").columns(["run_id"]).execute();
      await db.schema
        .createTable("eval_runs")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("eval_id", "text", (c) => c.notNull().references("evals.id").onDelete("cascade"))
        .addColumn("user_id", "text", (c) => c.notNull())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("status", "text", (c) => c.notNull())
        .addColumn("models", "text", (c) => c.notNull())
        .addColumn("items", "text", (c) => c.notNull())
        .addColumn("config", "text", (c) => c.notNull())
        .addColumn("progress", "text", (c) => c.notNull())
        .addColumn("results", "text", (c) => c.notNull())
        .addColumn("error", "text")
        .addColumn("created_at", "text", (c) => c.notNull())
        .addColumn("updated_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createIndex("eval_runs_eval")
        .on("eval_runs")
        .columns(["eval_id", "created_at"])
        .execute();
      await db.schema
        .createIndex("eval_runs_status")
        .on("eval_runs")
        .columns(["status", "created_at"])
        .execute();
      await db.schema
        .createTable("eval_results")
        .addColumn("run_id", "text", (c) => c.notNull().references("eval_runs.id").onDelete("cascade"))
        .addColumn("model_index", "integer", (c) => c.notNull())
        .addColumn("item_index", "integer", (c) => c.notNull())
        .addColumn("model", "text", (c) => c.notNull())
        .addColumn("answer", "text", (c) => c.notNull())
        .addColumn("scores", "text", (c) => c.notNull())
        .addColumn("latency_ms", "integer", (c) => c.notNull())
        .addColumn("prompt_tokens", "integer", (c) => c.notNull())
        .addColumn("completion_tokens", "integer", (c) => c.notNull())
        .addColumn("error", "text")
        .addColumn("created_at", "text", (c) => c.notNull())
        .addPrimaryKeyConstraint("eval_results_pk", ["run_id", "model_index", "item_index"])
        .execute();
    },
  },
  // LoRA adapters imported for a base model (trained elsewhere).
  "0006_adapters": {
    async up(db: Kysely<unknown>) {
      await db.schema
        .createTable("adapters")
        .addColumn("id", "text", (c) => c.primaryKey())
        .addColumn("user_id", "text", (c) => c.notNull())
        .addColumn("name", "text", (c) => c.notNull())
        .addColumn("base_model", "text", (c) => c.notNull())
        .addColumn("format", "text", (c) => c.notNull())
        .addColumn("rank", "integer", (c) => c.notNull())
        .addColumn("alpha", "double precision", (c) => c.notNull())
        .addColumn("weights", "integer", (c) => c.notNull())
        .addColumn("size_bytes", "bigint", (c) => c.notNull())
        .addColumn("path", "text", (c) => c.notNull())
        .addColumn("created_at", "text", (c) => c.notNull())
        .execute();
      await db.schema
        .createIndex("adapters_user")
        .on("adapters")
        .columns(["user_id", "created_at"])
        .execute();
    },
  },
};

export const migrationProvider: MigrationProvider = {
  getMigrations: async () => migrations,
};
