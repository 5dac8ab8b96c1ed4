import fs from "node:fs";
import path from "node:path";
import SqliteDatabase from "better-sqlite3";
import { Kysely, Migrator, PostgresDialect, SqliteDialect, sql } from "kysely";
import pg from "pg";
import { migrationProvider } from "./migrations.ts";
import type { Database } from "./schema.ts";
import { withStatementCache } from "./statementCache.ts";

export type Dialect = "sqlite" | "postgres";

export interface Db {
  kysely: Kysely<Database>;
  dialect: Dialect;
  close(): Promise<void>;
}

export interface OpenDatabaseOptions {
  /** PostgreSQL connection string; when unset, SQLite at `sqlitePath`. */
  databaseUrl?: string | undefined;
  /** Path of the embedded SQLite file. */
  sqlitePath: string;
}

// BIGINT arrives as a string by default; our bigints are byte sizes far below 2^53.
pg.types.setTypeParser(20, (value) => Number(value));

/** Opens the metadata database and brings its schema up to date before anything uses it. */
export async function openDatabase(options: OpenDatabaseOptions): Promise<Db> {
  let kysely: Kysely<Database>;
  let dialect: Dialect;
  if (options.databaseUrl) {
    dialect = "postgres";
    kysely = new Kysely<Database>({
      dialect: new PostgresDialect({ pool: new pg.Pool({ connectionString: options.databaseUrl, max: 10 }) }),
    });
  } else {
    dialect = "sqlite";
    fs.mkdirSync(path.dirname(options.sqlitePath), { recursive: true });
    const sqlite = new SqliteDatabase(options.sqlitePath);
    sqlite.pragma("journal_mode = WAL");
    sqlite.pragma("synchronous = NORMAL");
    sqlite.pragma("busy_timeout = 5000");
    sqlite.pragma("foreign_keys = ON");
    kysely = new Kysely<Database>({ dialect: new SqliteDialect({ database: withStatementCache(sqlite) }) });
  }

  // Kysely looks for its migration tables in every schema unless told which one: a database that has
  // them in another schema (another install, `public` when this one runs under a search_path) would
  // make it skip creating its own and then fail. They belong in the schema this connection writes to.
  const migrationTableSchema =
    dialect === "postgres"
      ? (await sql<{ schema: string }>`select current_schema() as schema`.execute(kysely)).rows[0]?.schema
      : undefined;
  const migrator = new Migrator({
    db: kysely,
    provider: migrationProvider,
    ...(migrationTableSchema ? { migrationTableSchema } : {}),
  });
  const { error, results } = await migrator.migrateToLatest();
  const failed = results?.find((r) => r.status === "Error");
  if (error || failed) {
    await kysely.destroy();
    throw new Error(`database migration ${failed?.migrationName ?? ""} failed: ${String(error)}`, {
      cause: error,
    });
  }

  return { kysely, dialect, close: () => kysely.destroy() };
}
