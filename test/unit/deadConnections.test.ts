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

test("every idle connection dead (a restart): each is dropped in turn, and the statement runs on a new one", async () => {
  const idle = [1, 2, 3].map(() => client(() => Promise.reject(dead())));
  const fresh = client(() => Promise.resolve({ rows: [] }));
  const checkOut = reopeningDeadConnections(pool([...idle, ...idle, fresh], refused));
  for (const _ of idle) (await checkOut()).release(); // each has been handed out and sat idle since
  const connection = await checkOut();
  assert.deepEqual(await connection.query("select 1"), { rows: [] });
  connection.release();
  assert.deepEqual(
    idle.map((c) => c.releases),
    [2, 2, 2],
  );
  assert.equal(fresh.releases, 1);
});

test("a new connection that fails is the caller's: no further tries", async () => {
  const idle = client(() => Promise.reject(dead()));
  const broken = client(() => Promise.reject(dead()));
  const spare = client(() => Promise.resolve({ rows: [] }));
  const checkOut = reopeningDeadConnections(pool([idle, idle, broken, spare], refused));
  (await checkOut()).release();
  const connection = await checkOut();
  await assert.rejects(connection.query("select 1"), /terminating connection/);
  connection.release();
  assert.equal(broken.releases, 1);
  assert.equal(spare.releases, 0, "never handed out");
});
