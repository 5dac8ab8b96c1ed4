import { hash, randomBytes, timingSafeEqual } from "node:crypto";
import type { Kysely } from "kysely";
import type { ReadCommitted } from "./committedReads.ts";
import { newId } from "./ids.ts";
import { precompile } from "./precompiled.ts";
import type { ApiKeyTable, Database } from "./schema.ts";
import { timestamp } from "../domain/time.ts";

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

/** Most keys {@link KeyRepository} remembers at once; past it, it starts over. */
const KNOWN_KEYS_LIMIT = 10_000;

/**
 * API keys: stored as SHA-256 hashes, looked up by hash and compared in constant time.
 *
 * On SQLite the keys that passed are remembered by hash, so that the check every request makes reads one
 * counter instead of the table, and stays exact: `dataVersion` changes as soon as another process (`conduit
 * keys revoke`, a second server on the same file) commits anything, which empties the memory, and this
 * repository's own writes empty it too. A revoked key therefore fails on the very next request, as without
 * the memory. Unknown keys are never remembered. On PostgreSQL (servers sharing a database) every check
 * reads the table. This memory is kept apart from the committed reads' ({@link ReadCommitted}), which any
 * commit empties: this one survives the server's writes to other tables, so a write-heavy load (uploads,
 * new datasets) still checks keys from memory.
 */
export class KeyRepository {
  /** The key check every request makes, compiled once. */
  private readonly byHash;
  /** Keys that passed, by hash, while `dataVersion` read `knownAt` and `writes` had not moved. */
  private readonly known = new Map<string, ApiKey>();
  private knownAt = Number.NaN;
  /** This repository's writes so far: a lookup that a write overtook does not remember its answer. */
  private writes = 0;

  constructor(
    private readonly db: Kysely<Database>,
    private readonly dataVersion?: () => number,
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
        await this.written(
          this.db.updateTable("api_keys").set({ user_id: userId }).where("id", "=", existing.id).execute(),
        );
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
    await this.written(this.db.insertInto("api_keys").values(row).execute());
    return toKey(row);
  }

  /** The key's owner, or undefined for an unknown key. */
  async authenticate(key: string): Promise<ApiKey | undefined> {
    const hash = hashKey(key);
    const version = this.dataVersion?.();
    if (version !== undefined) {
      if (version !== this.knownAt) {
        this.known.clear();
        this.knownAt = version;
      }
      const known = this.known.get(hash);
      if (known) return known;
    }
    const writes = this.writes;
    const [row] = await this.byHash(hash);
    // The lookup is by hash, so timing reveals nothing about the key; compare anyway so a
    // driver that matched loosely can never let a different key through.
    if (!row || !timingSafeEqual(Buffer.from(row.hash, "hex"), Buffer.from(hash, "hex"))) return undefined;
    const found = toKey(row);
    // Remembered only if nothing was written meanwhile, here or elsewhere (then `knownAt` is stale and the
    // next check empties the memory anyway).
    if (version !== undefined && writes === this.writes && version === this.knownAt) {
      if (this.known.size >= KNOWN_KEYS_LIMIT) this.known.clear();
      this.known.set(hash, found);
    }
    return found;
  }

  /** Waits for a write to the keys, then forgets every remembered key. */
  private async written<T>(write: Promise<T>): Promise<T> {
    try {
      return await write;
    } finally {
      this.writes++;
      this.known.clear();
    }
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
    const result = await this.written(
      this.db
        .deleteFrom("api_keys")
        .where((eb) => eb.or([eb("id", "=", idOrKey), eb("hash", "=", hashKey(idOrKey))]))
        .executeTakeFirst(),
    );
    return Number(result.numDeletedRows) > 0;
  }
}
