import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import SqliteDatabase from "better-sqlite3";
import { as, build, KEY_A } from "../lib/helper.ts";

test("SQLite locked by another process past its busy timeout: a 503 with Retry-After, and the next request works", async (t) => {
  const { app, config } = await build(t);
  const alice = as(app, KEY_A);
  assert.equal((await alice.post("/conduit/dataset", { name: "before" })).statusCode, 200);
  // Another process (the CLI, a backup) holds the write lock for longer than the 5 s the server waits.
  const other = new SqliteDatabase(path.join(config.dataDir, "conduit.db"));
  t.after(() => other.close());
  other.exec("BEGIN EXCLUSIVE");
  const locked = await alice.post("/conduit/dataset", { name: "during" });
  other.exec("ROLLBACK");
  assert.equal(locked.statusCode, 503, locked.body);
  assert.equal(locked.headers["retry-after"], "5");
  assert.match(locked.json<{ error: { message: string } }>().error.message, /database is unavailable/);
  const after = await alice.post("/conduit/dataset", { name: "after" });
  assert.equal(after.statusCode, 200, after.body);
  const names = (await alice.get("/conduit/dataset")).json<{ name: string }[]>().map((d) => d.name);
  assert.deepEqual(names.sort(), ["after", "before"]);
});
