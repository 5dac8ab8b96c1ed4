import type { Kysely } from "kysely";
import type { AdapterTable, Database } from "./schema.ts";
import type { Adapter } from "../domain/adapters.ts";

export type { Adapter } from "../domain/adapters.ts";

function toAdapter(row: AdapterTable): Adapter {
  return {
    id: row.id,
    userId: row.user_id,
    name: row.name,
    baseModel: row.base_model,
    format: row.format === "peft" ? "peft" : "gguf",
    rank: Number(row.rank),
    alpha: Number(row.alpha),
    weights: Number(row.weights),
    // PostgreSQL's bigint comes back as text.
    sizeBytes: Number(row.size_bytes),
    path: row.path,
    createdAt: row.created_at,
  };
}

/** Imported adapters: one row each, always read and deleted with their owner. */
export class AdapterRepository {
  constructor(private readonly db: Kysely<Database>) {}

  async insert(adapter: Adapter): Promise<void> {
    await this.db
      .insertInto("adapters")
      .values({
        id: adapter.id,
        user_id: adapter.userId,
        name: adapter.name,
        base_model: adapter.baseModel,
        format: adapter.format,
        rank: adapter.rank,
        alpha: adapter.alpha,
        weights: adapter.weights,
        size_bytes: adapter.sizeBytes,
        path: adapter.path,
        created_at: adapter.createdAt,
      })
      .execute();
  }

  /** The user's adapter, or `undefined` (another user's is never found). */
  async get(userId: string, id: string): Promise<Adapter | undefined> {
    const row = await this.db
      .selectFrom("adapters")
      .selectAll()
      .where("id", "=", id)
      .where("user_id", "=", userId)
      .executeTakeFirst();
    return row ? toAdapter(row) : undefined;
  }

  /** The user's adapters, oldest first. */
  async list(userId: string): Promise<Adapter[]> {
    const rows = await this.db
      .selectFrom("adapters")
      .selectAll()
      .where("user_id", "=", userId)
      .orderBy("created_at")
      .orderBy("id")
      .execute();
    return rows.map(toAdapter);
  }

  /** Of `ids`, those that have a row (whoever owns them): the sweeper keeps their files. */
  async recordedIds(ids: readonly string[]): Promise<Set<string>> {
    if (ids.length === 0) return new Set();
    const rows = await this.db.selectFrom("adapters").select("id").where("id", "in", ids).execute();
    return new Set(rows.map((row) => row.id));
  }

  /** Deletes the user's adapter; `undefined` when there was none. */
  async delete(userId: string, id: string): Promise<Adapter | undefined> {
    const row = await this.db
      .deleteFrom("adapters")
      .where("id", "=", id)
      .where("user_id", "=", userId)
      .returningAll()
      .executeTakeFirst();
    return row ? toAdapter(row) : undefined;
  }
}
