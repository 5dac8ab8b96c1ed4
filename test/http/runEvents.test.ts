import assert from "node:assert/strict";
import http from "node:http";
import { setTimeout as sleep } from "node:timers/promises";
import { test } from "node:test";
import type { FastifyInstance } from "fastify";
import { createParser, type EventSourceMessage } from "eventsource-parser";
import { loadConfig } from "../../src/config.ts";
import { createCore } from "../../src/core.ts";
import {
  as,
  asAlice,
  asBob,
  backends,
  buildTestApp,
  datasetOf,
  KEY_A,
  startRun,
  testEnv,
} from "../lib/helper.ts";

interface Event {
  event: string;
  id: string;
  data: unknown;
}

/** One events connection, read event by event; `kill()` drops it as a lost network would. */
class Stream {
  readonly events: Event[] = [];
  comments = 0;
  private readonly controller = new AbortController();
  private readonly queue: Event[] = [];
  private reader: ReadableStreamDefaultReader<string> | undefined;
  private ended = false;

  static async open(url: string, runId: string, headers: Record<string, string> = {}): Promise<Stream> {
    const stream = new Stream();
    const response = await fetch(`${url}/conduit/finetuning/${runId}/events`, {
      headers: { ...asAlice, ...headers },
      signal: stream.controller.signal,
    });
    assert.equal(response.status, 200, await (response.status === 200 ? "" : response.text()));
    stream.reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
    return stream;
  }

  private readonly parser = createParser({
    onEvent: (message: EventSourceMessage) => {
      assert.ok(message.id, `an event without an id: ${message.data}`);
      this.queue.push({ event: message.event ?? "", id: message.id, data: JSON.parse(message.data) });
    },
    onComment: () => this.comments++,
  });

  /** The next event, or undefined once the stream has ended. */
  async next(): Promise<Event | undefined> {
    for (;;) {
      const event = this.queue.shift();
      if (event) {
        this.events.push(event);
        return event;
      }
      if (this.ended) return undefined;
      const { value, done } = await this.reader!.read();
      if (done) this.ended = true;
      else this.parser.feed(value);
    }
  }

  /** Reads `count` events. */
  async take(count: number): Promise<Event[]> {
    const taken: Event[] = [];
    while (taken.length < count) {
      const event = await this.next();
      assert.ok(event, `the stream ended after ${taken.length} of ${count} events`);
      taken.push(event);
    }
    return taken;
  }

  /** Reads to the end. */
  async rest(): Promise<Event[]> {
    const taken: Event[] = [];
    for (let event = await this.next(); event; event = await this.next()) taken.push(event);
    return taken;
  }

  /** Reads until a comment arrives. */
  async comment(): Promise<void> {
    const seen = this.comments;
    while (this.comments === seen) {
      const { value, done } = await this.reader!.read();
      assert.ok(!done, "the stream ended before a comment");
      this.parser.feed(value);
    }
  }

  get lastId(): string {
    const id = this.events.at(-1)?.id;
    assert.ok(id, "no event received yet");
    return id;
  }

  kill(): void {
    this.controller.abort();
  }
}

const series = (steps: number[]) => steps.map((step) => ({ step, trainLoss: 5 - step / 100 }));
const evals = (steps: number[]) => steps.map((step) => ({ step, epoch: 1, evalLoss: 4 - step / 100 }));
const upTo = (n: number, every = 1) =>
  Array.from({ length: n }, (_, i) => i + 1).filter((s) => s % every === 0);

/** A run of Alice's on the tiny model, QUEUED; claimed by worker `w` when `claim`. */
async function queuedRun(app: FastifyInstance): Promise<string> {
  const dataset = await datasetOf(app, [{ input: "a", output: "b" }]);
  return startRun(app, { datasetID: dataset, epochs: 1, lr: 0.001, loraRank: 2 });
}

/** Events are what the stream sent: each log line once, loss points once each, the statuses in order. */
function summary(events: Event[]) {
  const lines = events.filter((e) => e.event === "log").map((e) => (e.data as { line: string }).line);
  const stats = events.filter((e) => e.event === "stats").map((e) => e.data as Record<string, unknown>);
  const points = stats
    .flatMap((s) => (s.lossSeries as { step: number }[] | undefined) ?? [])
    .map((p) => p.step);
  const evalPoints = stats
    .flatMap((s) => (s.evalLossSeries as { step: number }[] | undefined) ?? [])
    .map((p) => p.step);
  const statuses = events
    .filter((e) => e.event === "status")
    .map((e) => (e.data as { status: string }).status);
  return {
    lines,
    points,
    evalPoints,
    statuses,
    lastStats: stats.at(-1) ?? {},
  };
}

for (const backend of backends()) {
  test(`events (${backend}): a connection killed mid-stream resumes with Last-Event-ID, nothing lost, nothing twice`, async (t) => {
    const { app, core } = await buildTestApp(t, await testEnv(t, backend));
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    const whole = await Stream.open(url, id);
    let piecewise = await Stream.open(url, id);
    const pieces: Event[][] = [];
    let lastId = "";
    const reconnect = async () => {
      pieces.push(piecewise.events.slice());
      lastId = piecewise.events.at(-1)?.id ?? lastId;
      piecewise.kill();
      piecewise = await Stream.open(url, id, { "last-event-id": lastId });
    };
    // The first events: the log so far, the (empty) stats, QUEUED.
    const start = (await core.runRepository.logsSince(id, -1)).length + 2;
    await whole.take(start);
    await piecewise.take(start - 1);
    await reconnect();
    await piecewise.take(1);

    assert.ok(await core.runRepository.claimNext("w", 60_000));
    await whole.take(1);
    await piecewise.take(1);
    for (let round = 1; round <= 6; round++) {
      // A burst of lines: the piecewise reader is killed in the middle of it, with lines already on the wire.
      for (let i = 0; i < 5; i++) await core.runRepository.appendLog(id, `round ${round} line ${i}`);
      await whole.take(5);
      await piecewise.take(round % 5);
      await reconnect();
      await piecewise.take(5 - (round % 5));
      // Stats with more loss points; killed right after them, and once before them (round 3).
      assert.ok(
        await core.runRepository.updateStats(id, "w", {
          step: round * 10,
          totalSteps: 60,
          lossSeries: series(upTo(round * 10)),
          evalLossSeries: evals(upTo(round * 10, 20)),
        }),
      );
      await whole.take(1);
      if (round === 3) await reconnect();
      await piecewise.take(1);
      if (round !== 3) await reconnect();
    }
    assert.ok(await core.runRepository.finish(id, "w", { status: "READY", modelPath: "/x" }));
    await whole.rest();
    await piecewise.rest();
    pieces.push(piecewise.events);

    // The pieces put together are the uninterrupted stream, ids included.
    assert.equal(pieces.length, 14);
    assert.deepEqual(pieces.flat(), whole.events);
    const { lines, points, evalPoints, statuses } = summary(whole.events);
    assert.equal(lines.filter((line) => line.includes("round ")).length, 30);
    assert.deepEqual(points, upTo(60));
    assert.deepEqual(evalPoints, upTo(60, 20));
    assert.deepEqual(statuses, ["QUEUED", "RUNNING", "READY"]);
    // A stream that resumes after the last event has nothing to send, and ends.
    const after = await Stream.open(url, id, { "last-event-id": whole.lastId });
    assert.deepEqual(await after.rest(), []);
  });

  test(`events (${backend}): what was written while a client was away comes once: every line, the latest stats with the points it lacked`, async (t) => {
    const { app, core } = await buildTestApp(t, await testEnv(t, backend));
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    assert.ok(await core.runRepository.claimNext("w", 60_000));
    const first = await Stream.open(url, id);
    await core.runRepository.updateStats(id, "w", { step: 3, lossSeries: series([1, 2, 3]) });
    await core.runRepository.appendLog(id, "before");
    let events: Event[] = [];
    for (let event = await first.next(); event; event = await first.next()) {
      events.push(event);
      if (event.event === "log" && (event.data as { line: string }).line.endsWith(" before")) break;
    }
    first.kill();
    // Away: lines, two stats snapshots, the end.
    await core.runRepository.appendLog(id, "away 1");
    await core.runRepository.updateStats(id, "w", { step: 5, lossSeries: series([1, 2, 3, 4, 5]) });
    await core.runRepository.appendLog(id, "away 2");
    await core.runRepository.updateStats(id, "w", { step: 7, lossSeries: series(upTo(7)) });
    await core.runRepository.finish(id, "w", { status: "READY", modelPath: "/x" });
    // The query parameter, for clients that cannot set the header.
    const response = await fetch(
      `${url}/conduit/finetuning/${id}/events?lastEventId=${encodeURIComponent(events.at(-1)!.id)}`,
      { headers: asAlice },
    );
    const resumed: Event[] = [];
    const parser = createParser({
      onEvent: (m) => resumed.push({ event: m.event ?? "", id: m.id ?? "", data: JSON.parse(m.data) }),
    });
    parser.feed(await response.text());
    events = [...events, ...resumed];
    const { lines, points, statuses, lastStats } = summary(events);
    const run = await core.runs.get("alice", id);
    assert.deepEqual(lines, run.logs);
    assert.deepEqual(points, upTo(7));
    assert.deepEqual(statuses, ["RUNNING", "READY"]);
    assert.equal(lastStats.step, 7);
    // Resumed: the two lines, one stats event (the latest), READY.
    assert.deepEqual(
      resumed.map((e) => e.event),
      ["log", "log", "stats", "status"],
    );

    const bad = await fetch(`${url}/conduit/finetuning/${id}/events`, {
      headers: { ...asAlice, "last-event-id": "not-an-id" },
    });
    assert.equal(bad.status, 400);
    const refused = (await bad.json()).error;
    assert.equal(refused.param, "last-event-id");
    assert.match(refused.message, /is not an event id of this stream/);
  });

  test(`events (${backend}): 300 followers of a run cost one read per change, the same as one, and all get the same events; idle ones cost no query`, async (t) => {
    const { app, core } = await buildTestApp(
      t,
      await testEnv(t, backend, { CONDUIT_MAX_STREAMS_PER_USER: "300", CONDUIT_CONNECTIONS_PER_IP: "0" }),
    );
    app.sseHeartbeatMs = 200;
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    const other = await queuedRun(app);
    assert.ok(await core.runRepository.claimNext("w", 60_000));
    assert.ok(await core.runRepository.claimNext("w", 60_000));
    // What each write costs with nobody following.
    const cost = async (write: () => Promise<unknown>) => {
      const before = core.db.queries();
      await write();
      return core.db.queries() - before;
    };
    const append = await cost(() => core.runRepository.appendLog(other, "nobody follows"));
    const update = await cost(() => core.runRepository.updateStats(other, "w", { step: 1 }));
    const finish = await cost(() =>
      core.runRepository.finish(other, "w", { status: "READY", modelPath: "/x", message: "done" }),
    );

    const initial = (await core.runRepository.logsSince(id, -1)).length + 2;
    let logReads = 0;
    const logsSince = core.runRepository.logsSince.bind(core.runRepository);
    core.runRepository.logsSince = (...args) => {
      logReads++;
      return logsSince(...args);
    };
    const followers = await Promise.all(Array.from({ length: 300 }, () => Stream.open(url, id)));
    await Promise.all(followers.map((f) => f.take(initial)));
    assert.equal(logReads, 1, "the log read for 300 followers arriving at once");
    assert.equal(core.runRepository.changes.followers, 1, "one subscription for the run, whoever follows it");

    let before = core.db.queries();
    // Quiet for a while: every follower gets heartbeats meanwhile.
    await Promise.all(followers.map((f) => f.comment()));
    await Promise.all(followers.map((f) => f.comment()));
    await sleep(1000);
    assert.equal(core.db.queries() - before, 0, "queries while nothing changed");

    // A line: the run's state and its new lines are read once for all 300.
    before = core.db.queries();
    await core.runRepository.appendLog(id, "news");
    const got = await Promise.all(followers.map((f) => f.take(1)));
    for (const [event] of got) assert.match(String((event?.data as { line: string }).line), / news$/);
    assert.equal(core.db.queries() - before, append + 2, "queries for a line");
    // Stats: the state only (the log did not grow).
    before = core.db.queries();
    await core.runRepository.updateStats(id, "w", { step: 3, lossSeries: series([1, 2, 3]) });
    await Promise.all(followers.map((f) => f.take(1)));
    assert.equal(core.db.queries() - before, update + 1, "queries for stats");
    before = core.db.queries();
    await core.runRepository.finish(id, "w", { status: "READY", modelPath: "/x", message: "done" });
    await Promise.all(followers.map((f) => f.rest()));
    assert.equal(core.db.queries() - before, finish + 2, "queries for the end and its line");

    // The same events, ids included, for each of them.
    const { lines, points, statuses } = summary(followers[0]!.events);
    assert.deepEqual(lines, (await core.runs.get("alice", id)).logs);
    assert.deepEqual(points, [1, 2, 3]);
    assert.deepEqual(statuses, ["RUNNING", "READY"]);
    for (const follower of followers.slice(1)) assert.deepEqual(follower.events, followers[0]!.events);
    assert.equal(
      core.runRepository.changes.followers,
      0,
      "the run's subscription is gone with its followers",
    );
  });

  test(`events (${backend}): closed connections leave nothing behind`, async (t) => {
    const { app, core } = await buildTestApp(t, await testEnv(t, backend));
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    const followers = await Promise.all(Array.from({ length: 10 }, () => Stream.open(url, id)));
    await Promise.all(followers.map((f) => f.take(2)));
    assert.equal(core.runs.followedRuns, 1);
    for (const follower of followers) follower.kill();
    for (let i = 0; core.runRepository.changes.followers > 0 && i < 100; i++) await sleep(50);
    assert.equal(core.runRepository.changes.followers, 0, "followers left behind by closed connections");
    assert.equal(core.runs.followedRuns, 0);
  });

  test(`events (${backend}): a follower that stops reading holds up nobody else, then gets every event the others got`, async (t) => {
    const { app, core } = await buildTestApp(t, await testEnv(t, backend));
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    assert.ok(await core.runRepository.claimNext("w", 60_000));
    const reader = await Stream.open(url, id);
    const initial = (await core.runRepository.logsSince(id, -1)).length + 2;
    await reader.take(initial);
    const { port } = new URL(url);
    const stalled = await new Promise<http.IncomingMessage>((resolve, reject) =>
      http
        .get({ port, path: `/conduit/finetuning/${id}/events`, headers: asAlice }, resolve)
        .on("error", reject),
    );
    stalled.pause();
    // 2,000 lines of 1 KB, one write each: more than the sockets between them hold, and more events than a
    // run's feed keeps, while the stalled follower takes none.
    const filler = "x".repeat(1000);
    for (let i = 0; i < 2000; i++) {
      await core.runRepository.appendLog(id, `${i} ${filler}`);
      if (i % 100 === 99)
        await core.runRepository.updateStats(id, "w", { step: i + 1, lossSeries: series(upTo(i + 1, 100)) });
    }
    await core.runRepository.finish(id, "w", { status: "READY", modelPath: "/x" });
    await reader.rest();
    assert.equal(summary(reader.events).lines.length, initial - 2 + 2000);

    let text = "";
    stalled.setEncoding("utf8");
    stalled.on("data", (chunk: string) => (text += chunk));
    stalled.resume();
    await new Promise((resolve) => stalled.on("end", resolve));
    const events: Event[] = [];
    const parser = createParser({
      onEvent: (m) => events.push({ event: m.event ?? "", id: m.id ?? "", data: JSON.parse(m.data) }),
    });
    parser.feed(text);
    // Every line, every loss point, the end; the ids where the two saw the same thing are the same.
    const mine = summary(events);
    const theirs = summary(reader.events);
    assert.deepEqual(mine.lines, theirs.lines);
    assert.deepEqual(mine.points, theirs.points);
    assert.deepEqual(mine.statuses, theirs.statuses);
    assert.equal(events.at(-1)?.id, reader.lastId);
  });

  test(`events (${backend}): a user holds at most CONDUIT_MAX_STREAMS_PER_USER streams; past it 429 with Retry-After until one closes`, async (t) => {
    const { app } = await buildTestApp(t, await testEnv(t, backend, { CONDUIT_MAX_STREAMS_PER_USER: "3" }));
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    const open = await Promise.all(Array.from({ length: 3 }, () => Stream.open(url, id)));
    await Promise.all(open.map((s) => s.take(2)));
    const refused = await fetch(`${url}/conduit/finetuning/${id}/events`, { headers: asAlice });
    assert.equal(refused.status, 429);
    assert.ok(Number(refused.headers.get("retry-after")) > 0, "Retry-After");
    const error = (await refused.json()).error;
    assert.equal(error.code, "rate_limited");
    assert.match(error.message, /CONDUIT_MAX_STREAMS_PER_USER/);
    // Another user's streams are theirs: Bob is refused nothing (his 404 is the run's, not the cap's).
    const bob = await fetch(`${url}/conduit/finetuning/${id}/events`, { headers: asBob });
    assert.equal(bob.status, 404);

    // A client that goes away frees its place; so does a stream that ends with its run (and a 404).
    open[0]!.kill();
    let again: Response | undefined;
    for (let i = 0; i < 100 && again?.status !== 200; i++) {
      await again?.body?.cancel();
      await sleep(20);
      again = await fetch(`${url}/conduit/finetuning/${id}/events`, { headers: asAlice });
    }
    assert.equal(again?.status, 200);
    const missing = await fetch(`${url}/conduit/finetuning/ft_missing/events`, { headers: asAlice });
    assert.equal(missing.status, 429, "a fourth stream, whatever its run");
    await again?.body?.cancel();
    await as(app, KEY_A).post(`/conduit/finetuning/${id}/cancel`);
    await Promise.all(open.slice(1).map((s) => s.rest()));
    for (let i = 0; i < 3; i++) {
      const gone = await fetch(`${url}/conduit/finetuning/ft_missing/events`, { headers: asAlice });
      assert.equal(gone.status, 404);
    }
    const ended = await fetch(`${url}/conduit/finetuning/${id}/events`, { headers: asAlice });
    assert.equal(ended.status, 200);
    await ended.text();
  });

  test(`events (${backend}): a cancelled run's followers get the cancel's log line before the status that ends their stream`, async (t) => {
    const { app, core } = await buildTestApp(t, await testEnv(t, backend));
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    assert.ok(await core.runRepository.claimNext("w", 60_000));
    const followers = await Promise.all(Array.from({ length: 5 }, () => Stream.open(url, id)));
    const initial = (await core.runRepository.logsSince(id, -1)).length + 2;
    await Promise.all(followers.map((f) => f.take(initial)));
    await core.runs.cancel("alice", id);
    for (const follower of followers) {
      const rest = await follower.rest();
      assert.deepEqual(
        rest.map((e) => e.event),
        ["log", "status"],
      );
      assert.match(
        String((rest[0]?.data as { line: string }).line),
        /run cancelled by the user \(was RUNNING\); its trainer stops at a step boundary and its files are removed$/,
      );
    }
  });

  test(`events (${backend}): a reader that does not read holds the stream up; the log is read as it takes it`, async (t) => {
    const { app, core } = await buildTestApp(t, await testEnv(t, backend));
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    // 40 MB of log, more than the sockets between server and client hold.
    const total = 40_000;
    const filler = "x".repeat(1000);
    const base = (await core.runRepository.logsSince(id, -1)).length;
    for (let start = 0; start < total; start += 1000)
      await core.db.kysely
        .insertInto("run_logs")
        .values(
          Array.from({ length: 1000 }, (_, i) => ({
            run_id: id,
            seq: base + start + i,
            line: `${start + i} ${filler}`,
            created_at: "2026-01-01T00:00:00.000Z",
          })),
        )
        .execute();
    let read = 0;
    const logsSince = core.runRepository.logsSince.bind(core.runRepository);
    core.runRepository.logsSince = async (...args) => {
      const lines = await logsSince(...args);
      read += lines.length;
      return lines;
    };

    const { port } = new URL(url);
    const response = await new Promise<http.IncomingMessage>((resolve, reject) =>
      http
        .get({ port, path: `/conduit/finetuning/${id}/events`, headers: asAlice }, resolve)
        .on("error", reject),
    );
    response.pause();
    // Until the server stops reading (it waits for the client to take what was written).
    for (let last = -1; read !== last;) {
      last = read;
      await sleep(1000);
    }
    assert.ok(read < base + total, `read ${read} of ${base + total} lines for a client that took none`);

    let text = "";
    response.setEncoding("utf8");
    response.on("data", (chunk: string) => (text += chunk));
    response.resume();
    await core.runs.cancel("alice", id);
    await new Promise((resolve) => response.on("end", resolve));
    const lines = text.split("\n").filter((line) => line.startsWith("event: log"));
    assert.equal(lines.length, base + total + 1);
  });
}

test(
  "events (postgres): a line written by another server wakes this one's followers (NOTIFY)",
  { skip: !backends().includes("postgres") },
  async (t) => {
    const env = await testEnv(t, "postgres");
    const { app, core } = await buildTestApp(t, env);
    const url = await app.listen({ port: 0, host: "127.0.0.1" });
    const id = await queuedRun(app);
    const follower = await Stream.open(url, id);
    await follower.take((await core.runRepository.logsSince(id, -1)).length + 2);

    // Another server on the same database: its own pool, its own listener. Each of its writes reaches
    // the follower here, though nothing on this server wrote or polled.
    const second = await createCore(loadConfig(env.env));
    t.after(() => second.close());
    assert.ok(await second.runRepository.claimNext("elsewhere", 60_000));
    assert.deepEqual(
      (await follower.take(1)).map((e) => [e.event, e.data]),
      [["status", { status: "RUNNING", error: null }]],
    );
    await second.runRepository.appendLog(id, "from the other server");
    const [log] = await follower.take(1);
    assert.match(String((log?.data as { line: string }).line), / from the other server$/);
    await second.runRepository.updateStats(id, "elsewhere", { step: 1, lossSeries: series([1]) });
    assert.deepEqual(
      (await follower.take(1)).map((e) => [e.event, e.data]),
      [["stats", { step: 1, lossSeries: series([1]) }]],
    );
    await second.runRepository.finish(id, "elsewhere", { status: "FAILED", error: "stopped" });
    assert.deepEqual(await follower.rest(), [
      { event: "status", id: follower.lastId, data: { status: "FAILED", error: "stopped" } },
    ]);
  },
);
