import assert from "node:assert/strict";
import { once } from "node:events";
import http from "node:http";
import type net from "node:net";
import { Readable } from "node:stream";
import { test, type TestContext } from "node:test";
import { ApiError } from "../../src/client/ApiError.ts";
import { ConduitClient } from "../../src/client/ConduitClient.ts";
import { type RunEvent } from "../../src/client/runEvents.ts";
import type { Core } from "../../src/core.ts";
import { buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";

/** The API client the CLI and the dashboard share (src/client/), against real servers. */

/** A plain HTTP server for what the Conduit server never does; closed after the test. */
async function listen(t: TestContext, handler: http.RequestListener): Promise<string> {
  const server = http.createServer(handler);
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
}

/** A Conduit server on 127.0.0.1 (users alice and bob, no trainer), and its core. */
async function conduitServer(t: TestContext): Promise<{ url: string; core: Core }> {
  const { app, core } = await buildTestApp(t, await testEnv(t));
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  return { url, core };
}

test("errors: the API's error shape, a refused key, a page that is not ours, no server at all", async (t) => {
  const { url, core } = await conduitServer(t);
  const refused: ApiError[] = [];
  const client = new ConduitClient({ baseUrl: `${url}/`, key: KEY_A, onError: (e) => refused.push(e) });
  const dataset = await client.createDataset("d");

  const failures: [string, () => Promise<unknown>, Partial<ApiError>][] = [
    [
      "a missing run",
      () => client.getRun("ft_missing"),
      { status: 404, code: "not_found", type: "not_found_error", param: "finetune_id" },
    ],
    [
      "an invalid field",
      () => client.createRun({ datasetID: dataset.id, earlyStoppingPatience: 0 }),
      { status: 400, code: "invalid_request", param: "earlyStoppingPatience" },
    ],
    [
      "a run that is not READY",
      async () =>
        client.listExamples((await client.createRun({ datasetID: dataset.id, baseModelName: "tiny" })).id),
      { status: 409, code: "conflict" },
    ],
    [
      "a wrong key",
      () => new ConduitClient({ baseUrl: url, key: "wrong-key-123" }).listDatasets(),
      { status: 401, code: "unauthorized", type: "authentication_error" },
    ],
    [
      "a model that is not there, before the stream starts",
      async () => {
        for await (const _ of client.chatStream({ prompt: "hi", model: "no-such-model" })) break;
      },
      { status: 404, code: "model_not_found" },
    ],
  ];
  await core.datasets.upload("alice", dataset.id, {
    name: "p.jsonl",
    source: Readable.from([`${JSON.stringify({ input: "q", output: "a" })}\n`]),
  });
  for (const [name, call, expected] of failures) {
    const error = await call().then(
      () => assert.fail(`${name}: no error`),
      (e: unknown) => e,
    );
    assert.ok(error instanceof ApiError, `${name}: ${String(error)}`);
    assert.ok(error.message.length > 0 && !error.message.startsWith("{"), `${name}: plain words`);
    for (const [field, value] of Object.entries(expected))
      assert.equal(error[field as keyof ApiError], value, `${name}: ${field} (${error.message})`);
  }
  assert.deepEqual(
    refused.map((e) => e.status),
    [404, 400, 409, 404],
    "onError hears each error answer of its client",
  );

  const proxyPage = await listen(t, (_request, response) =>
    response.writeHead(502, { "content-type": "text/html" }).end("<html>Bad gateway</html>"),
  );
  await assert.rejects(new ConduitClient({ baseUrl: proxyPage }).listRuns(), {
    name: "ApiError",
    status: 502,
    code: "http_502",
    message: "The server answered 502 Bad Gateway.",
  });

  // Port 9 (discard): nothing listens there.
  await assert.rejects(
    new ConduitClient({ baseUrl: "http://127.0.0.1:9" }).listModels(),
    (error: unknown) => {
      assert.ok(error instanceof ApiError);
      assert.equal(error.status, 0);
      assert.equal(error.code, "connection_failed");
      assert.match(
        error.message,
        /^Cannot reach http:\/\/127\.0\.0\.1:9 \(.+\)\. Is the Conduit server running\?$/,
      );
      return true;
    },
  );
});

test("a 429 or 503 with Retry-After is sent again after the wait, a few times at most; a long wait is the error at once", async (t) => {
  let answers: [number, Record<string, string>][] = [];
  const seen: string[] = [];
  const busy = await listen(t, (request, response) => {
    seen.push(`${request.method} ${request.url}`);
    const [status, headers] = answers.shift() ?? [200, {}];
    response.writeHead(status, { "content-type": "application/json", ...headers });
    response.end(
      status === 200
        ? "[]"
        : JSON.stringify({
            error: {
              message: "the queue is full",
              type: "rate_limit_error",
              param: null,
              code: "rate_limited",
            },
          }),
    );
  });
  const waits: number[] = [];
  const client = new ConduitClient({
    baseUrl: busy,
    key: KEY_A,
    onRetry: (_error, seconds) => waits.push(seconds),
  });

  answers = [
    [429, { "retry-after": "1" }],
    [503, { "retry-after": "0" }],
  ];
  const started = Date.now();
  assert.deepEqual(await client.listDatasets(), []);
  assert.ok(Date.now() - started >= 1000, "it waited the second the server asked for");
  assert.deepEqual(waits, [1, 0]);
  assert.equal(seen.length, 3);

  // Past the retries, the error.
  answers = Array.from(
    { length: 4 },
    () => [429, { "retry-after": "0" }] as [number, Record<string, string>],
  );
  await assert.rejects(client.listDatasets(), { name: "ApiError", status: 429, code: "rate_limited" });
  // Longer than the client waits, no Retry-After, or another status: the error at once.
  for (const answer of [
    [429, { "retry-after": "3600" }],
    [429, {}],
    [500, { "retry-after": "0" }],
  ] as [number, Record<string, string>][]) {
    answers = [answer];
    seen.length = 0;
    await assert.rejects(client.listDatasets(), { name: "ApiError", status: answer[0] });
    assert.equal(seen.length, 1, JSON.stringify(answer));
  }
});

test("an upload from a stream reports its bytes as they go; the answer is the stored file", async (t) => {
  const { url } = await conduitServer(t);
  const client = new ConduitClient({ baseUrl: url, key: KEY_A });
  const dataset = await client.createDataset("d");
  const text = Array.from({ length: 500 }, (_, i) =>
    JSON.stringify({ input: `q${i}`, output: `a${i}` }),
  ).join("\n");
  const bytes = Buffer.from(`${text}\n`);
  const progress: [number, number | undefined][] = [];
  const file = await client.uploadFile(
    dataset.id,
    Readable.toWeb(
      Readable.from([bytes.subarray(0, 4000), bytes.subarray(4000)]),
    ) as ReadableStream<Uint8Array>,
    { name: "pairs.jsonl", size: bytes.length, onProgress: (sent, total) => progress.push([sent, total]) },
  );
  assert.equal(file.ioPairsCount, 500);
  assert.equal(file.size, bytes.length);
  assert.ok(progress.length >= 2, JSON.stringify(progress));
  assert.deepEqual(progress.at(-1), [bytes.length, bytes.length]);
  assert.ok(
    progress.every(([sent], i) => i === 0 || sent > (progress[i - 1]?.[0] ?? 0)),
    "it only grows",
  );
  const refused = await client
    .uploadFile(dataset.id, new Blob(['{"input":"a","output":"b"}\n{"input":"a"}\n']), { name: "bad.jsonl" })
    .catch((e: unknown) => e);
  assert.ok(refused instanceof ApiError && refused.status === 400, String(refused));
  assert.match(refused.message, /line 2/);
});

/**
 * A proxy in front of `target` that can cut the stream it is passing on, as a network would; it keeps
 * the headers of each request.
 */
async function cuttingProxy(t: TestContext, target: string) {
  const requests: http.IncomingHttpHeaders[] = [];
  let current: http.ServerResponse | undefined;
  const url = await listen(t, (request, response) => {
    requests.push(request.headers);
    current = response;
    const upstream = http.request(
      new URL(request.url ?? "/", target),
      { method: request.method, headers: request.headers },
      (answer) => {
        response.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(response);
      },
    );
    request.pipe(upstream);
    response.on("close", () => upstream.destroy());
  });
  return { url, requests, cut: () => current?.socket?.destroy() };
}

test("run events resume after a dropped connection: Last-Event-ID, each log line once, each status once", async (t) => {
  const { url, core } = await conduitServer(t);
  const proxy = await cuttingProxy(t, url);
  const dataset = await core.datasets.create("alice", "d");
  await core.datasets.upload("alice", dataset.id, {
    name: "p.jsonl",
    source: Readable.from([`${JSON.stringify({ input: "q", output: "a" })}\n`]),
  });
  const run = await core.runs.create("alice", { datasetID: dataset.id, baseModelName: "tiny" });
  assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, run.id);
  await core.runRepository.appendLog(run.id, "one");
  await core.runRepository.appendLog(run.id, "two");

  const client = new ConduitClient({ baseUrl: proxy.url, key: KEY_A });
  const events: RunEvent[] = [];
  const retried: { error: ApiError; lastId: string | undefined }[] = [];
  let cut = false;
  const follow = client.runEvents(run.id, {
    retryMs: 20,
    onRetry: (error) => retried.push({ error, lastId: events.findLast((e) => e.id !== undefined)?.id }),
  });
  for await (const event of follow) {
    events.push(event);
    if (!cut && event.event === "log" && event.data.line.endsWith(" two")) {
      // The connection drops; meanwhile the run goes on and ends.
      cut = true;
      proxy.cut();
      await core.runRepository.appendLog(run.id, "three");
      await core.runs.cancel("alice", run.id);
    }
  }

  assert.equal(retried.length, 1, "one reconnection");
  assert.equal(retried[0]?.error.code, "connection_lost");
  assert.equal(proxy.requests.length, 2);
  assert.equal(proxy.requests[0]?.["last-event-id"], undefined);
  // The id of the last event before the drop, when the server sends ids; none when it does not.
  assert.equal(proxy.requests[1]?.["last-event-id"], retried[0]?.lastId);
  const lines = events.flatMap((e) => (e.event === "log" ? [e.data.line] : []));
  assert.deepEqual(lines, (await core.runs.get("alice", run.id)).logs, "every line once, in order");
  assert.ok(
    lines.some((line) => line.endsWith(" three")),
    "the line written while the connection was down",
  );
  assert.deepEqual(
    events.flatMap((e) => (e.event === "status" ? [e.data.status] : [])),
    ["RUNNING", "CANCELLED"],
  );
});

test("run events: a server that resumes from Last-Event-ID is not second-guessed; a missing run throws at once", async (t) => {
  const asked: (string | undefined)[] = [];
  const url = await listen(t, (request, response) => {
    const last = request.headers["last-event-id"] as string | undefined;
    asked.push(last);
    if (request.url !== "/conduit/finetuning/ft_1/events")
      return void response.writeHead(404, { "content-type": "application/json" }).end(
        JSON.stringify({
          error: { message: "no such run", type: "not_found_error", param: null, code: "not_found" },
        }),
      );
    response.writeHead(200, { "content-type": "text/event-stream" });
    const log = (id: number, line: string) => `id: ${id}\nevent: log\ndata: ${JSON.stringify({ line })}\n\n`;
    const status = (s: string) => `event: status\ndata: ${JSON.stringify({ status: s, error: null })}\n\n`;
    if (last === undefined) {
      response.write(`retry: 10\n\n${log(1, "a")}${log(2, "b")}${status("RUNNING")}`);
      setTimeout(() => response.socket?.destroy(), 50);
    } else response.end(`${log(Number(last) + 1, "c")}${status("RUNNING")}${status("READY")}`);
  });
  const client = new ConduitClient({ baseUrl: url, key: KEY_A });
  const events: RunEvent[] = [];
  for await (const event of client.runEvents("ft_1", { retryMs: 60_000 })) events.push(event);
  assert.deepEqual(asked, [undefined, "2"], "the reconnection says where the stream stopped");
  assert.deepEqual(
    events.map((e) => (e.event === "log" ? e.data.line : e.event === "status" ? e.data.status : e.event)),
    ["a", "b", "RUNNING", "c", "READY"],
    "no line skipped, the repeated status left out; the server's retry: 10 ms, not 60 s",
  );
  assert.deepEqual(
    events.map((e) => e.id),
    ["1", "2", undefined, "3", undefined],
  );

  asked.length = 0;
  await assert.rejects(
    async () => {
      for await (const _ of client.runEvents("ft_2")) assert.fail("no events");
    },
    { name: "ApiError", status: 404, code: "not_found", message: "no such run" },
  );
  assert.equal(asked.length, 1, "no retry");
});
