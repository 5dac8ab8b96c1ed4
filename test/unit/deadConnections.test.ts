/** The PostgreSQL pool's checkout that gives a statement met by a dead idle connection a second chance on a fresh one. */
import assert from "node:assert/strict";
import { test } from "node:test";
import type pg from "pg";
import { isDatabaseUnavailable } from "../../src/errors.ts";
import { reopeningDeadConnections } from "../../src/store/database.ts";

/** A pooled client as pg-pool hands it out: releasing one that is not checked out throws, as pg-pool's does. */
function client(answer: () => Promise<unknown>) {
  const state = { out: false, releases: 0 };
  return Object.assign(state, {
    query: () => answer(),
    release() {
      if (!state.out)
        throw new Error("Release called on client which has already been released to the pool.");
      state.out = false;
      state.releases++;
    },
  });
}

/** The pool's checkout handing out `clients` in turn, then failing with `then`. */
function pool(clients: ReturnType<typeof client>[], then: () => Error) {
  return () => {
    const next = clients.shift();
    if (!next) return Promise.reject(then());
    next.out = true;
    return Promise.resolve(next as unknown as pg.PoolClient);
  };
}

const dead = () =>
  Object.assign(new Error("terminating connection due to administrator command"), { code: "57P01" });
const refused = () =>
  Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" });

test("a dead idle connection is released once and its statement runs again on a fresh one", async () => {
  const idle = client(() => Promise.reject(dead()));
  const fresh = client(() => Promise.resolve({ rows: [{ n: 1 }] }));
  const checkOut = reopeningDeadConnections(pool([idle, idle, fresh], refused));
  (await checkOut()).release(); // the first checkout marks the connection as one that has sat idle since
  const connection = await checkOut();
  assert.deepEqual(await connection.query("select 1"), { rows: [{ n: 1 }] });
  connection.release();
  assert.equal(idle.releases, 2);
  assert.equal(fresh.releases, 1);
});

test("when no fresh connection can be had, the error says the database is unavailable and the release is not doubled", async () => {
  const idle = client(() => Promise.reject(dead()));
  const checkOut = reopeningDeadConnections(pool([idle, idle], refused));
  (await checkOut()).release();
  const connection = await checkOut();
  const error = await connection.query("select 1").then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(isDatabaseUnavailable(error), String(error));
  assert.doesNotThrow(() => connection.release());
  assert.equal(idle.releases, 2);
});
