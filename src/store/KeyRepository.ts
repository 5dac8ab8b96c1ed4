import { hash, randomBytes, timingSafeEqual } from "node:crypto";
import type { Kysely } from "kysely";
import type { ReadCommitted } from "./committedReads.ts";
import { newId } from "./ids.ts";
import { precompile } from "./precompiled.ts";
import type { ApiKeyTable, Database } from "./schema.ts";
import { timestamp } from "./time.ts";

export interface ApiKey {
  id: string;
  userId: string;
  name: string;
  prefix: string;
  createdAt: string;
}

function hashKey(key: string): string {
  return hash("sha256", key, "hex");
}

function toKey(row: ApiKeyTable): ApiKey {
  return {
    id: row.id,
    userId: row.user_id,
    name: row.name,
    prefix: row.prefix,
    createdAt: row.created_at,
  };
}

/**
 * API keys: stored as SHA-256 hashes, looked up by hash and compared in constant time. On SQLite the check
 * every request makes is a committed read ({@link ReadCommitted}): a key that passed is answered from memory
 * until anything is committed, so a revoked key fails on the very next request.
 */
export class KeyRepository {
  /** The key check every request makes, compiled once. */
  private readonly byHash;

  constructor(
    private readonly db: Kysely<Database>,
    readCommitted?: ReadCommitted,
  ) {
    this.byHash = precompile<Database, ApiKeyTable, [string]>(
      db,
      (arg) => db.selectFrom("api_keys").selectAll().where("hash", "=", arg(0)),
      readCommitted,
    );
  }

  /** Creates a random key for `userId`; the plain key is returned once and never stored. */
  async create(userId: string, name = "default"): Promise<{ key: string; record: ApiKey }> {
    const key = `cnd_${randomBytes(32).toString("base64url")}`;
    return { key, record: await this.insert(key, userId, name) };
  }

  /** Stores a key chosen by the operator (`CONDUIT_API_KEYS`); an existing identical key is left alone. */
  async ensure(key: string, userId: string, name = "env"): Promise<ApiKey> {
    const existing = await this.db
      .selectFrom("api_keys")
      .selectAll()
      .where("hash", "=", hashKey(key))
      .executeTakeFirst();
    if (existing) {
      if (existing.user_id !== userId)
        await this.db
          .updateTable("api_keys")
          .set({ user_id: userId })
          .where("id", "=", existing.id)
          .execute();
      return toKey({ ...existing, user_id: userId });
    }
    return this.insert(key, userId, name);
  }

  private async insert(key: string, userId: string, name: string): Promise<ApiKey> {
    const row: ApiKeyTable = {
      id: newId("key"),
      user_id: userId,
      name,
      prefix: key.slice(0, 8),
      hash: hashKey(key),
      created_at: timestamp(),
    };
    await this.db.insertInto("api_keys").values(row).execute();
    return toKey(row);
  }

  /** The key's owner, or undefined for an unknown key. */
  async authenticate(key: string): Promise<ApiKey | undefined> {
    const hash = hashKey(key);
    const [row] = await this.byHash(hash);
    // The lookup is by hash, so timing reveals nothing about the key; compare anyway so a
    // driver that matched loosely can never let a different key through.
    if (!row || !timingSafeEqual(Buffer.from(row.hash, "hex"), Buffer.from(hash, "hex"))) return undefined;
    return toKey(row);
  }

  async list(userId?: string): Promise<ApiKey[]> {
    let query = this.db.selectFrom("api_keys").selectAll().orderBy("created_at").orderBy("id");
    if (userId) query = query.where("user_id", "=", userId);
    return (await query.execute()).map(toKey);
  }

  async count(): Promise<number> {
    const row = await this.db
      .selectFrom("api_keys")
      .select((eb) => eb.fn.countAll<number>().as("n"))
      .executeTakeFirst();
    return Number(row?.n ?? 0);
  }

  /** Deletes a key by id or by its full value; returns whether one was removed. */
  async revoke(idOrKey: string): Promise<boolean> {
    const result = await this.db
      .deleteFrom("api_keys")
      .where((eb) => eb.or([eb("id", "=", idOrKey), eb("hash", "=", hashKey(idOrKey))]))
      .executeTakeFirst();
    return Number(result.numDeletedRows) > 0;
  }
}
