import assert from "node:assert/strict";
import net from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { sql } from "kysely";
import type { EvalRunWire } from "../../src/contract/evals.ts";
import {
  as,
  buildTestApp,
  datasetOf,
  KEY_A,
  madeUpPairs,
  runEnded,
  startRun,
  testEnv,
  waitForRun,
} from "../lib/helper.ts";
import { openDatabase } from "../../src/store/database.ts";
import { privatePostgres } from "../lib/privatePostgres.ts";
import { until } from "../lib/wait.ts";

/** Reads a Server-Sent Events stream to its end, collecting the `event:` names and `data:` of each event. */
async function follow(url: string): Promise<{ event: string; data: string }[]> {
  const response = await fetch(url, { headers: { "x-api-key": KEY_A } });
  assert.equal(response.status, 200);
  const text = await response.text();
  return text
    .split("\n\n")
    .filter((block) => block.includes("data:"))
    .map((block) => ({
      event: /^event: (.*)$/m.exec(block)?.[1] ?? "message",
      data: /^data: (.*)$/m.exec(block)?.[1] ?? "",
    }));
}

/** An app of a server sharing the test's database and data directory, training and answering evals. */
async function server(t: { after(fn: () => unknown): void }, env: Awaited<ReturnType<typeof testEnv>>) {
  // A lease of 3 s: an outage of several seconds outlasts it, as a long one outlasts the default 30 s.
  const built = await buildTestApp(t, env, { scheduler: { pollMs: 200, leaseMs: 3000, concurrency: 1 } });
  built.core.scheduler.start();
  built.core.evals.start(built.core.runEvents);
  const url = await built.app.listen({ port: 0, host: "127.0.0.1" });
  return { ...built, url };
}

async function evalRunOf(app: FastifyInstance, evalId: string, runId: string) {
  return (await as(app, KEY_A).get(`/conduit/evals/${evalId}/runs/${runId}`)).json<EvalRunWire>();
}

describe("the database goes away and comes back", () => {
  test("pooled connections cut while idle, unheard by the client: the next statements and transactions run on fresh ones", async (t) => {
    const postgres = await privatePostgres(t);
    if (typeof postgres === "string") return t.skip(`no PostgreSQL of the test's own: ${postgres}`);
    // A proxy that can cut its connections as a NAT or a proxy reaping idle ones does: the server's side closes
    // and the client hears nothing until it sends, when it gets a reset.
    const target = new URL(postgres.url);
    const [pgHost, pgPort] = [target.hostname, Number(target.port)];
    const pairs: { client: net.Socket; server: net.Socket; cut: boolean }[] = [];
    const proxy = net.createServer((client) => {
      const server = net.connect(pgPort, pgHost);
      const pair = { client, server, cut: false };
      pairs.push(pair);
      client.on("data", (chunk) => (pair.cut ? client.resetAndDestroy() : server.write(chunk)));
      server.on("data", (chunk) => pair.cut || client.write(chunk));
      client.on("error", () => server.destroy());
      server.on("error", () => client.destroy());
      client.on("close", () => server.destroy());
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    t.after(() => proxy.close());
    target.host = `127.0.0.1:${(proxy.address() as net.AddressInfo).port}`;
    const db = await openDatabase({ databaseUrl: target.toString(), sqlitePath: "" });
    t.after(() => db.close());
    const count = () => sql<{ n: number }>`select count(*)::int as n from runs`.execute(db.kysely);
    // Four connections open and idle in the pool.
    await db.kysely.transaction().execute(async (outer) => {
      await Promise.all([1, 2, 3].map(() => count()));
      await sql`select 1`.execute(outer);
    });
    for (const pair of pairs) {
      pair.cut = true;
      pair.server.destroy();
    }
    assert.ok(pairs.length >= 4);
    const answers = await Promise.all([
      ...[1, 2, 3, 4, 5].map(() => count()),
      db.kysely
        .transaction()
        .execute(async (trx) => (await sql<{ n: number }>`select 2 as n`.execute(trx)).rows[0]),
    ]);
    assert.deepEqual(answers[5], { n: 2 });
    // A statement's own error is not tried again.
    await assert.rejects(sql`select * from no_such_table`.execute(db.kysely), /no_such_table/);
  });

  test("two servers sharing PostgreSQL: every pooled connection killed, then a restart mid-run; nothing crashes, is lost or runs twice", async (t) => {
    const postgres = await privatePostgres(t);
    if (typeof postgres === "string") return t.skip(`no PostgreSQL of the test's own: ${postgres}`);
    const env = await testEnv(t, "sqlite", { DATABASE_URL: postgres.url });
    const a = await server(t, env);
    const b = await server(t, env);
    const alice = as(a.app, KEY_A);

    const datasetID = await datasetOf(a.app, madeUpPairs());
    // Long enough to be training across the outage.
    const runId = await startRun(a.app, { datasetID, method: "full", epochs: 400 });
    const evalId = (
      await alice.post("/conduit/evals", {
        source: { type: "items", items: madeUpPairs().map((p) => ({ input: p.input, expected: p.output })) },
        graders: [{ type: "exact_match" }, { type: "similarity", metric: "fuzzy_match" }],
      })
    ).json<{ id: string }>().id;
    const evalRunId = (
      await alice.post(`/conduit/evals/${evalId}/runs`, { models: ["tiny"], maxTokens: 48, parallel: 2 })
    ).json<EvalRunWire>().id;
    // Followers on both servers, through the whole outage.
    const runEvents = follow(`${b.url}/conduit/finetuning/${runId}/events`);
    const evalEvents = follow(`${a.url}/conduit/evals/${evalId}/runs/${evalRunId}/events`);
    const training = await waitForRun(
      a.app,
      runId,
      (run) => run.status === "RUNNING" && (run.stats.step ?? 0) > 0,
      { timeoutMs: 120_000 },
    );
    console.log("at the outage", training.stats.step, training.stats.totalSteps);

    // Every connection of both servers' pools (and their LISTEN connections) ended under them.
    assert.ok((await postgres.terminateAll()) >= 2);
    for (const app of [a.app, b.app]) {
      // A statement that meets a killed pooled connection runs again on a fresh one: no request notices.
      const again = await Promise.all(
        [1, 2, 3].map(() => as(app, KEY_A).get(`/conduit/finetuning/${runId}`)),
      );
      for (const response of again) assert.equal(response.statusCode, 200, response.body);
    }

    // A restart that outlasts a lease: requests meanwhile are prompt 503s that say when to come back.
    await postgres.stop();
    const started = Date.now();
    const during = await alice.get(`/conduit/finetuning/${runId}`);
    assert.equal(during.statusCode, 503, during.body);
    assert.equal(during.headers["retry-after"], "5");
    assert.match(during.json<{ error: { message: string } }>().error.message, /database is unavailable/);
    assert.ok(Date.now() - started < 6000, "a 503 comes within the connection timeout");
    const chat = await as(b.app, KEY_A).post("/conduit/v1/chat", {
      model: "tiny",
      prompt: "hi",
      max_tokens: 4,
    });
    assert.equal(chat.statusCode, 503, chat.body);
    await sleep(7000);
    await postgres.start();

    const run = await waitForRun(a.app, runId, runEnded, { timeoutMs: 300_000 });
    assert.equal(run.status, "READY", run.logs.join("\n"));
    const attempts = run.logs.filter((line) => line.includes("training started on"));
    assert.equal(attempts.length, 1, `one attempt, not a second after the outage:\n${run.logs.join("\n")}`);

    const evalRun = await until(
      "the eval run's end",
      () => evalRunOf(a.app, evalId, evalRunId),
      (r) => ["COMPLETED", "FAILED", "CANCELLED"].includes(r.status),
      { timeoutMs: 300_000, intervalMs: 250 },
    );
    assert.equal(evalRun.status, "COMPLETED", evalRun.error ?? "");
    const results = await alice.get(`/conduit/evals/${evalId}/runs/${evalRunId}/results?limit=100`);
    const answered = results.json<{ error: string | null }[]>();
    assert.equal(answered.length, 20);
    assert.deepEqual(
      answered.filter((r) => r.error !== null),
      [],
      "no item errored for the outage",
    );

    // The followers stayed with it and saw the end.
    const runStream = await runEvents;
    assert.match(runStream.at(-1)?.data ?? "", /"status":"READY"/);
    const evalStream = await evalEvents;
    assert.equal(evalStream.at(-1)?.event, "status", evalStream.at(-1)?.data);
    assert.match(evalStream.at(-1)?.data ?? "", /COMPLETED/);
  });
});
