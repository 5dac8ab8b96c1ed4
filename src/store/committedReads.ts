import SqliteDatabase from "better-sqlite3";
import { withStatementCache } from "./statementCache.ts";

/**
 * Runs `sql` with `parameters` and returns its rows, which are shared and frozen: read them, never change them.
 * With `rememberEmpty`, an empty answer is remembered too: only for parameters that were checked before (a run
 * id the user owns), never for what a request names unchecked.
 */
export type ReadCommitted = <Row>(
  sql: string,
  parameters: readonly unknown[],
  options?: { rememberEmpty?: boolean },
) => readonly Row[];

/** Most characters of row text remembered at once; past it, the memory starts over. */
const REMEMBERED_CHARS = 16 * 1024 * 1024;
/** A larger answer (a long run's log) is read each time instead of filling the memory. */
const LARGEST_REMEMBERED = 256 * 1024;

/**
 * Reads on a SQLite connection of their own, for the queries every request makes (the key check, reading a
 * run): at once, without kysely, whose driver costs about as much as a point read itself (its connection
 * lock and promises), and never behind a transaction the main connection holds open across awaits. They see
 * what has been committed, as a second server would.
 *
 * Answers are remembered by query and parameters while this connection's `PRAGMA data_version` stays the
 * same. It moves as soon as any other connection commits anything: this process's own writes on the main
 * connection, `conduit keys revoke`, another server on the same file. So a remembered answer is always the
 * one the table would give now, and a revoked key fails on the very next request. Empty answers (an unknown
 * key) are not remembered, so random keys cannot fill the memory, unless the read asks for it (`rememberEmpty`:
 * "no evaluation yet" of a run the user was just found to own).
 */
export class CommittedReads {
  private readonly connection: SqliteDatabase.Database;
  private readonly statements;
  private readonly version: SqliteDatabase.Statement;
  /** Answers by query, then by parameters. */
  private readonly remembered = new Map<string, Map<string, readonly unknown[]>>();
  private rememberedAt = Number.NaN;
  private rememberedChars = 0;

  constructor(
    sqlitePath: string,
    private readonly counted: () => void,
  ) {
    this.connection = new SqliteDatabase(sqlitePath);
    this.connection.pragma("busy_timeout = 5000");
    this.connection.pragma("query_only = ON");
    this.statements = withStatementCache(this.connection);
    this.version = this.connection.prepare("PRAGMA data_version").pluck();
  }

  readonly read: ReadCommitted = <Row>(
    sql: string,
    parameters: readonly unknown[],
    options?: { rememberEmpty?: boolean },
  ) => {
    // Checked before the read: a commit between the two only makes the next call forget this answer.
    const version = this.version.get() as number;
    if (version !== this.rememberedAt) this.forget(version);
    let answers = this.remembered.get(sql);
    if (!answers) this.remembered.set(sql, (answers = new Map()));
    const key = JSON.stringify(parameters);
    const known = answers.get(key);
    if (known) return known as readonly Row[];
    this.counted();
    const rows = this.statements.prepare(sql).all(parameters) as Row[];
    for (const row of rows) Object.freeze(row);
    Object.freeze(rows);
    const chars =
      rows.length === 0 ? (options?.rememberEmpty ? key.length : 0) : key.length + textLength(rows);
    if (chars > 0 && chars <= LARGEST_REMEMBERED) {
      if (this.rememberedChars + chars > REMEMBERED_CHARS) this.forget(version);
      answers.set(key, rows);
      this.rememberedChars += chars;
    }
    return rows;
  };

  close(): void {
    this.connection.close();
  }

  private forget(version: number): void {
    for (const answers of this.remembered.values()) answers.clear();
    this.rememberedChars = 0;
    this.rememberedAt = version;
  }
}

function textLength(rows: readonly unknown[]): number {
  let chars = 0;
  for (const row of rows)
    for (const value of Object.values(row as object)) if (typeof value === "string") chars += value.length;
  return chars;
}
