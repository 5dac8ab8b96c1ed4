import fs from "node:fs";
import path from "node:path";
import SqliteDatabase from "better-sqlite3";
import { Kysely, Migrator, PostgresDialect, SqliteDialect, sql, type LogEvent } from "kysely";
import pg from "pg";
import { CommittedReads, type ReadCommitted } from "./committedReads.ts";
import { DatabaseHealth } from "./DatabaseHealth.ts";
import { migrationProvider } from "./migrations.ts";
import type { Database } from "./schema.ts";
import { withStatementCache } from "./statementCache.ts";

export type Dialect = "sqlite" | "postgres";

export interface Db {
  kysely: Kysely<Database>;
  dialect: Dialect;
  /** Queries run so far by this process (tests count them; a gauge for metrics). */
  queries(): number;
  /** The outages this process has seen: for background work that must wait one out. */
  health: DatabaseHealth;
  /**
   * SQLite only (undefined on PostgreSQL): this connection's `PRAGMA data_version`, which changes whenever
   * another connection (the CLI, another process on the same file) has committed anything since the last
   * call, and not for this connection's own commits. A cache of rows can check it instead of re-reading them.
   */
  dataVersion: (() => number) | undefined;
  /**
   * SQLite only (undefined on PostgreSQL): a compiled read on a connection of its own, whose answers are
   * remembered until anything is committed ({@link CommittedReads}). For the queries every request makes.
   */
  readCommitted: ReadCommitted | undefined;
  /**
   * Hears `NOTIFY channel` from every server sharing a PostgreSQL database, on one dedicated
   * connection: `onPayload` gets each payload. A lost connection is opened again (each second until
   * it works), then `onResumed` is called, since notifications sent meanwhile were missed. On SQLite
   * (one server) there is nothing to hear. Returns the function that stops listening.
   */
  listen(
    channel: string,
    onPayload: (payload: string) => void,
    onResumed: () => void,
  ): Promise<() => Promise<void>>;
  close(): Promise<void>;
}

export interface OpenDatabaseOptions {
  /** PostgreSQL connection string; when unset, SQLite at `sqlitePath`. */
  databaseUrl?: string | undefined;
  /** Path of the embedded SQLite file. */
  sqlitePath: string;
  /**
   * Hears an idle pooled PostgreSQL connection break (a server restart, `pg_terminate_backend`, a proxy reaping
   * idle connections): the pool drops it and opens another when one is needed. Defaults to ignoring it.
   */
  onConnectionLost?: (error: Error) => void;
}

/** How long a new PostgreSQL connection may take before the query that wanted it fails. */
const CONNECT_TIMEOUT_MS = 5000;

// BIGINT arrives as a string by default; our bigints are byte sizes far below 2^53.
pg.types.setTypeParser(20, (value) => Number(value));

/** Opens the metadata database and brings its schema up to date before anything uses it. */
export async function openDatabase(options: OpenDatabaseOptions): Promise<Db> {
  let kysely: Kysely<Database>;
  let dialect: Dialect;
  let dataVersion: (() => number) | undefined;
  let queries = 0;
  const health = new DatabaseHealth();
  const log = (event: LogEvent) => {
    if (event.level === "query") queries++;
    else health.saw(event.error);
  };
  if (options.databaseUrl) {
    dialect = "postgres";
    const pool = new pg.Pool({
      connectionString: options.databaseUrl,
      max: 10,
      // An unreachable server answers a request with a 503 after this long, not never.
      connectionTimeoutMillis: CONNECT_TIMEOUT_MS,
      keepAlive: true,
    });
    // Without a listener, a connection's error is an unhandled 'error' event and the process exits. The pool
    // hears those of idle connections (and drops them); a checked-out one has no listener of the pool's, and
    // its query has failed already (the pool drops it when it comes back).
    const onLost = options.onConnectionLost;
    pool.on("error", (error) => {
      health.saw(error);
      onLost?.(error);
    });
    pool.on("connect", (client) => client.on("error", () => undefined));
    // A connection that cannot be opened fails before any query (Kysely's log does not see it).
    const connect = pool.connect.bind(pool);
    const opened = () =>
      connect().catch((error: unknown) => {
        health.saw(error);
        throw error;
      });
    const checkOut = reopeningDeadConnections(opened);
    pool.connect = ((callback?: Parameters<typeof connect>[0]) => {
      if (callback)
        return connect((error, client, done) => {
          if (error) health.saw(error);
          callback(error, client, done);
        });
      return checkOut();
    }) as typeof pool.connect;
    kysely = new Kysely<Database>({ dialect: new PostgresDialect({ pool }), log });
  } else {
    dialect = "sqlite";
    fs.mkdirSync(path.dirname(options.sqlitePath), { recursive: true });
    const sqlite = new SqliteDatabase(options.sqlitePath);
    sqlite.pragma("journal_mode = WAL");
    sqlite.pragma("synchronous = NORMAL");
    sqlite.pragma("busy_timeout = 5000");
    sqlite.pragma("foreign_keys = ON");
    const version = sqlite.prepare("PRAGMA data_version").pluck();
    dataVersion = () => version.get() as number;
    kysely = new Kysely<Database>({
      dialect: new SqliteDialect({ database: withStatementCache(sqlite) }),
      log,
    });
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

  const committedReads =
    dialect === "sqlite"
      ? new CommittedReads(options.sqlitePath, () => {
          queries++;
        })
      : undefined;

  const databaseUrl = options.databaseUrl;
  return {
    kysely,
    dialect,
    queries: () => queries,
    health,
    dataVersion,
    readCommitted: committedReads?.read,
    listen: async (channel, onPayload, onResumed) =>
      databaseUrl ? listenPostgres(databaseUrl, channel, onPayload, onResumed) : async () => undefined,
    close: async () => {
      committedReads?.close();
      await kysely.destroy();
    },
  };
}

/**
 * Whether a statement failed because its connection was already gone (the server ended the backend, the socket was
 * closed under it, or the client had heard so and refuses to send), not because of anything the statement did.
 */
function isDeadConnection(error: unknown): boolean {
  if (!(error instanceof Error)) return false;
  const code = (error as { code?: unknown }).code;
  if (code === "57P01" || code === "57P02" || code === "ECONNRESET" || code === "EPIPE") return true;
  return /^(Connection terminated unexpectedly|Client has encountered a connection error and is not queryable)/.test(
    error.message,
  );
}

/**
 * Wraps the pool's checkout so that a connection which died while it sat idle (every backend ended by
 * `pg_terminate_backend`, a server restart, a proxy reaping idle connections) costs the request nothing: when the
 * first statement on a connection that was idle in the pool fails with {@link isDeadConnection}, the connection is
 * dropped and the statement runs again on the next the pool hands out; while that is another idle one that died too
 * (a restart ends them all), it is dropped in turn, so the tries are bounded by the pool's size. Only the first
 * statement after a checkout is tried again: that connection had done nothing for this caller yet (in a
 * transaction it is the `begin`), and a backend ended before or while running it has committed nothing of it. A
 * new connection's failure is the caller's (a 503 with Retry-After at the edge). The pool by itself drops an idle
 * connection only once its socket reports the end, which a request arriving at the same moment can beat.
 */
export function reopeningDeadConnections(
  connect: () => Promise<pg.PoolClient>,
): () => Promise<pg.PoolClient> {
  const used = new WeakSet<pg.PoolClient>();
  return async () => {
    const client = await connect();
    if (!used.has(client)) {
      used.add(client);
      return client;
    }
    let current = client;
    // Whether `current` went back to the pool already: a dead one is released at once, and when no fresh one can
    // be had, Kysely's release of the connection must not release it twice (pg would throw that, in place of
    // the error that says the database is unavailable).
    let released = false;
    let first = true;
    const query = (...args: unknown[]): unknown => {
      const run = () => (current.query as (...a: unknown[]) => unknown)(...args);
      if (!first || typeof args[0] !== "string") {
        first = false;
        return run();
      }
      first = false;
      // Whether `current` had sat idle in the pool: a new connection's failure is not tried again.
      let idle = true;
      const again = async (error: unknown): Promise<unknown> => {
        if (!idle || !isDeadConnection(error)) throw error;
        // Released with its error, pg-pool destroys it: the next checkout is another idle one, or a new one.
        current.release(error instanceof Error ? error : true);
        released = true;
        current = await connect();
        released = false;
        idle = used.has(current);
        used.add(current);
        return (run() as Promise<unknown>).catch(again);
      };
      return (run() as Promise<unknown>).catch(again);
    };
    // What Kysely's Postgres driver uses of a pooled client: query (a string, or a cursor for streams) and release.
    return {
      query,
      release: (error?: Error | boolean) => {
        if (!released) current.release(error);
        released = true;
      },
    } as unknown as pg.PoolClient;
  };
}

/** `Db.listen` on PostgreSQL: a client of its own (a pooled one would be handed to queries). */
async function listenPostgres(
  connectionString: string,
  channel: string,
  onPayload: (payload: string) => void,
  onResumed: () => void,
): Promise<() => Promise<void>> {
  let stopped = false;
  let client: pg.Client | undefined;
  let retry: NodeJS.Timeout | undefined;
  const open = async () => {
    const next = new pg.Client({ connectionString });
    next.on("notification", (message) => {
      if (message.channel === channel && message.payload !== undefined) onPayload(message.payload);
    });
    // A broken connection also ends, and "end" is where it is opened again.
    next.on("error", () => undefined);
    try {
      await next.connect();
      await next.query(`LISTEN ${pg.escapeIdentifier(channel)}`);
    } catch (error) {
      await next.end().catch(() => undefined);
      throw error;
    }
    if (stopped) return void (await next.end());
    client = next;
    next.once("end", () => {
      client = undefined;
      if (!stopped) reopen();
    });
  };
  const reopen = () => {
    retry = setTimeout(() => {
      open().then(onResumed, () => {
        if (!stopped) reopen();
      });
    }, 1000);
    retry.unref();
  };
  await open();
  return async () => {
    stopped = true;
    clearTimeout(retry);
    await client?.end().catch(() => undefined);
  };
}
