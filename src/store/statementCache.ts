import type BetterSqlite3 from "better-sqlite3";
import type { SqliteDatabase } from "kysely";

/**
 * Kysely's SQLite driver prepares every query anew; preparing costs more than running a point
 * select. The queries are a small fixed set, so prepared statements are kept by their SQL.
 */
export function withStatementCache(database: BetterSqlite3.Database, limit = 256): SqliteDatabase {
  const cache = new Map<string, BetterSqlite3.Statement>();
  return {
    close: () => database.close(),
    prepare(sql: string) {
      let statement = cache.get(sql);
      if (!statement) {
        statement = database.prepare(sql);
        // Statements built from user-sized lists (IN (...)) vary; keep the cache bounded.
        if (cache.size >= limit) cache.delete(cache.keys().next().value as string);
        cache.set(sql, statement);
      }
      return statement;
    },
  } as SqliteDatabase;
}
