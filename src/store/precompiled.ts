import type { Compilable, CompiledQuery, Kysely } from "kysely";
import type { ReadCommitted } from "./committedReads.ts";

/** A value that stands for the `index`th argument of a {@link precompile}d query. */
const slot = (index: number) => `\u0000slot:${index}`;

/**
 * A query built and compiled once, then run with new values: `precompile(db, (arg) => db.selectFrom("t")
 * .where("id", "=", arg(0)))` returns `(id) => rows`. Building and compiling a kysely query costs more than
 * running a point select on SQLite (bench/api.ts: a key check took 56 µs, 13 of them the select), so the
 * queries every request makes (the key check, reading a run) skip both. Values still travel as parameters.
 * With `read` (SQLite's {@link ReadCommitted}) it runs on the connection for committed reads instead of through kysely,
 * with `readOptions` (`rememberEmpty`: only for parameters checked before the read).
 */
export function precompile<DB, Row, Args extends unknown[]>(
  db: Kysely<DB>,
  build: (arg: (index: number) => string) => Compilable<Row>,
  read?: ReadCommitted,
  readOptions?: { rememberEmpty?: boolean },
): (...args: Args) => Promise<readonly Row[]> {
  let compiled: { query: CompiledQuery<Row>; slots: number[] } | undefined;
  return async (...args: Args) => {
    if (!compiled) {
      const query = build(slot).compile();
      const slots = query.parameters.map((value) =>
        typeof value === "string" && value.startsWith("\u0000slot:") ? Number(value.slice(6)) : -1,
      );
      compiled = { query, slots };
    }
    const { query, slots } = compiled;
    const parameters = slots.map((index, i) => (index >= 0 ? args[index] : query.parameters[i]));
    if (read) return read<Row>(query.sql, parameters, readOptions);
    return (await db.executeQuery<Row>({ ...query, parameters })).rows;
  };
}
