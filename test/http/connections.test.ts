import assert from "node:assert/strict";
import fs from "node:fs";
import net from "node:net";
import path from "node:path";
import { test } from "node:test";
import type { FastifyInstance } from "fastify";
import type { Engine } from "../../src/engine/Engine.ts";
import { aliceWorld, buildTestApp, endlessEngine, KEY_A, testEnv, type Cleanup } from "../lib/helper.ts";
import { readUntil } from "../lib/wait.ts";

/** A raw TCP client: what it sent is up to the test, what it got back is collected. */
interface RawClient {
  socket: net.Socket;
  /** Everything received so far. */
  received(): string;
  /** Milliseconds from connecting until the server closed the connection. */
  closed: Promise<number>;
  /** Milliseconds from the last bytes received until the close (how long the connection sat idle). */
  idleBeforeClose: Promise<number>;
}

function connect(url: string, localAddress?: string): Promise<RawClient> {
  const { port, hostname } = new URL(url);
  return new Promise((resolve, reject) => {
    const started = Date.now();
    const socket = net.connect({
      port: Number(port),
      host: hostname,
      ...(localAddress ? { localAddress } : {}),
    });
    let text = "";
    let lastData = started;
    socket.on("data", (chunk: Buffer) => {
      text += chunk.toString("utf8");
      lastData = Date.now();
    });
    const closedAt = new Promise<number>((done) => socket.once("close", () => done(Date.now())));
    const closed = closedAt.then((at) => at - started);
    const idleBeforeClose = closedAt.then((at) => at - lastData);
    // A reset is a close too; the test checks what arrived before it.
    socket.on("error", () => undefined);
    socket.once("connect", () => resolve({ socket, received: () => text, closed, idleBeforeClose }));
    socket.once("error", reject);
  });
}

/** The status and JSON body of the first response in `raw`. */
function parseResponse(raw: string): { status: number; body: { error?: { code: string; message: string } } } {
  const status = Number(raw.match(/^HTTP\/1\.1 (\d{3})/)?.[1]);
  const body = raw.slice(raw.indexOf("\r\n\r\n") + 4);
  return { status, body: body ? JSON.parse(body) : {} };
}

async function listening(t: Cleanup, env: Record<string, string>, engine?: Engine) {
  const environment = await testEnv(t, "sqlite", env);
  const { app } = await buildTestApp(t, environment, engine ? { engine } : {});
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  return { app, url, dataDir: environment.dataDir };
}

const post = (url: string, length: number, contentType = "application/json") =>
  `POST ${url} HTTP/1.1\r\nhost: localhost\r\nx-api-key: ${KEY_A}\r\n` +
  `content-type: ${contentType}\r\ncontent-length: ${length}\r\n\r\n`;

test("a body that stops arriving is answered 408 in the error shape and its connection closed", async (t) => {
  const { app, url, dataDir } = await listening(t, { CONDUIT_BODY_TIMEOUT_MS: "300" });
  const { ds } = await aliceWorld(app);

  // A JSON body, and uploads streaming to disk (raw and multipart), each stalled halfway.
  const json = await connect(url);
  json.socket.write(post("/conduit/dataset", 100) + '{"name":');
  const upload = await connect(url);
  upload.socket.write(
    post(`/conduit/dataset/${ds}/upload?name=a.jsonl`, 10_000, "application/jsonl") +
      '{"input":"a","output":"b"}\n',
  );
  const multipart = await connect(url);
  multipart.socket.write(
    post(`/conduit/dataset/${ds}/upload`, 10_000, "multipart/form-data; boundary=b") +
      '--b\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n{"input":',
  );
  for (const client of [json, upload, multipart]) {
    const elapsed = await client.closed;
    assert.ok(elapsed >= 300 && elapsed < 3000, `closed after ${elapsed} ms`);
    const { status, body } = parseResponse(client.received());
    assert.equal(status, 408, client.received());
    assert.equal(body.error?.code, "request_timeout");
    assert.match(body.error?.message ?? "", /stopped arriving for 300 ms/);
  }
  // The stalled upload left nothing behind (its temp file goes once the server sees the socket gone).
  const files = await app.inject({ url: `/conduit/dataset/${ds}/files`, headers: { "x-api-key": KEY_A } });
  assert.equal(files.json().length, 1);
  const tmp = path.join(dataDir, "blobs", ".tmp");
  for (let i = 0; i < 50 && fs.readdirSync(tmp).length > 0; i++) await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(fs.readdirSync(tmp), []);
});

test("headers that stop arriving, or a body that trickles past the request timeout, get a 408", async (t) => {
  const { url } = await listening(t, {
    CONDUIT_HEADERS_TIMEOUT_MS: "300",
    CONDUIT_REQUEST_TIMEOUT_MS: "800",
    CONDUIT_BODY_TIMEOUT_MS: "10000",
  });
  const headers = await connect(url);
  headers.socket.write("GET /healthz HTTP/1.1\r\nhost: localhost\r\n");
  const trickle = await connect(url);
  trickle.socket.write(post("/conduit/dataset", 1000) + '{"name":"');
  // A byte every 100 ms: never a pause as long as the body timeout.
  const drip = setInterval(() => trickle.socket.writable && trickle.socket.write("x"), 100);
  t.after(() => clearInterval(drip));

  const headersElapsed = await headers.closed;
  assert.ok(headersElapsed >= 300 && headersElapsed < 2500, `headers: closed after ${headersElapsed} ms`);
  const trickleElapsed = await trickle.closed;
  assert.ok(trickleElapsed >= 800 && trickleElapsed < 3500, `trickle: closed after ${trickleElapsed} ms`);
  for (const client of [headers, trickle]) {
    const { status, body } = parseResponse(client.received());
    assert.equal(status, 408, client.received());
    assert.equal(body.error?.code, "request_timeout");
  }
});

test("an idle keep-alive connection is closed after the keep-alive timeout", async (t) => {
  const { url } = await listening(t, { CONDUIT_IDLE_TIMEOUT_MS: "300" });
  const client = await connect(url);
  client.socket.write("GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n");
  // Counted from the answer: the first /healthz also starts llama.cpp's backend, which takes a while.
  const idle = await client.idleBeforeClose;
  assert.match(client.received(), /^HTTP\/1\.1 200/);
  assert.ok(idle >= 250 && idle < 2500, `closed ${idle} ms after the answer`);
});

test("headers over 16 KiB get a 431 in the error shape", async (t) => {
  const { url } = await listening(t, {});
  const client = await connect(url);
  client.socket.write(`GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-big: ${"x".repeat(20_000)}\r\n\r\n`);
  await client.closed;
  const { status, body } = parseResponse(client.received());
  assert.equal(status, 431);
  assert.equal(body.error?.code, "headers_too_large");
});

test(
  "streams outlive every request timeout, silent or not, and end at shutdown",
  { timeout: 20_000 },
  async (t) => {
    const { app, url } = await listening(
      t,
      {
        CONDUIT_HEADERS_TIMEOUT_MS: "200",
        CONDUIT_REQUEST_TIMEOUT_MS: "300",
        CONDUIT_BODY_TIMEOUT_MS: "200",
        CONDUIT_IDLE_TIMEOUT_MS: "200",
      },
      endlessEngine(),
    );
    const { run } = await aliceWorld(app);
    const headers = { "x-api-key": KEY_A };
    // A QUEUED run's events say nothing after the first ones; the chat streams a token every 20 ms.
    const events = (await fetch(`${url}/conduit/finetuning/${run}/events`, { headers })).body!.getReader();
    await readUntil(events, /"status":"QUEUED"/);
    const chat = (
      await fetch(`${url}/conduit/v1/chat`, {
        method: "POST",
        headers: { ...headers, "content-type": "application/json" },
        body: JSON.stringify({ model: "tiny", prompt: "hi", stream: true }),
      })
    ).body!.getReader();
    await readUntil(chat, /chat\.completion\.chunk/);

    await new Promise((resolve) => setTimeout(resolve, 1200));
    // Still streaming, four times past every limit.
    assert.match(await readUntil(chat, /"content":"x"/), /"content":"x"/);
    const started = Date.now();
    await app.close();
    assert.ok(Date.now() - started < 2000, `close took ${Date.now() - started} ms`);
    assert.match(await readUntil(events, /"code":"unavailable"/), /"code":"unavailable"/);
    assert.match(await readUntil(chat, /"code":"unavailable"/), /"code":"unavailable"/);
  },
);

/** Answers after `ms`: a non-streamed generation that is under way when the server shuts down. */
function slowEngine(ms: number): Engine {
  return {
    ...endlessEngine(),
    generate: () =>
      new Promise((resolve) =>
        setTimeout(
          () =>
            resolve({
              text: "done",
              finishReason: "stop",
              promptTokens: 1,
              cachedTokens: 0,
              completionTokens: 1,
            }),
          ms,
        ),
      ),
  };
}

async function closeTimed(app: FastifyInstance): Promise<number> {
  const started = Date.now();
  await app.close();
  return Date.now() - started;
}

test("shutdown closes idle and stalled connections at once and lets an answer under way finish", async (t) => {
  // Timeouts that would hold shutdown up for minutes if it waited for them.
  const { app, url } = await listening(
    t,
    {
      CONDUIT_HEADERS_TIMEOUT_MS: "120000",
      CONDUIT_REQUEST_TIMEOUT_MS: "120000",
      CONDUIT_BODY_TIMEOUT_MS: "120000",
      CONDUIT_IDLE_TIMEOUT_MS: "120000",
      CONDUIT_SHUTDOWN_TIMEOUT_MS: "5000",
    },
    slowEngine(600),
  );
  const idle = await connect(url);
  idle.socket.write("GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n");
  const stalledBody = await connect(url);
  stalledBody.socket.write(post("/conduit/dataset", 100) + '{"na');
  const stalledHeaders = await connect(url);
  stalledHeaders.socket.write("GET /healthz HTTP/1.1\r\nhost: loc");
  const answering = fetch(`${url}/conduit/v1/chat`, {
    method: "POST",
    headers: { "x-api-key": KEY_A, "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt: "hi" }),
  });
  await new Promise((resolve) => setTimeout(resolve, 200));
  assert.match(idle.received(), /^HTTP\/1\.1 200/);

  const elapsed = await closeTimed(app);
  assert.ok(elapsed < 2500, `close took ${elapsed} ms`);
  const response = await answering;
  assert.equal(response.status, 200);
  assert.equal((await response.json()).choices[0].content, "done");
  for (const client of [idle, stalledBody, stalledHeaders]) assert.ok((await client.closed) < 3000);
});

test("shutdown ends within CONDUIT_SHUTDOWN_TIMEOUT_MS whatever the answers under way do", async (t) => {
  const { app, url } = await listening(t, { CONDUIT_SHUTDOWN_TIMEOUT_MS: "500" }, endlessEngine());
  const never = fetch(`${url}/conduit/v1/chat`, {
    method: "POST",
    headers: { "x-api-key": KEY_A, "content-type": "application/json" },
    body: JSON.stringify({ model: "tiny", prompt: "hi" }),
  }).catch((error: unknown) => error);
  await new Promise((resolve) => setTimeout(resolve, 200));
  const elapsed = await closeTimed(app);
  assert.ok(elapsed >= 450 && elapsed < 2500, `close took ${elapsed} ms`);
  assert.ok((await never) instanceof Error, "the connection was closed under the request");
});

test("a body trickled below CONDUIT_MIN_BODY_RATE is answered 408 though it never pauses long", async (t) => {
  const { url } = await listening(t, { CONDUIT_BODY_TIMEOUT_MS: "400", CONDUIT_MIN_BODY_RATE: "1024" });
  const client = await connect(url);
  const body = JSON.stringify({ name: "x".repeat(200) });
  client.socket.write(post("/conduit/dataset", body.length));
  // A byte every 100 ms: no pause reaches the 400 ms limit, but 10 bytes/s is far below 1024.
  let sent = 0;
  const trickle = setInterval(() => {
    if (sent < body.length && !client.socket.destroyed) client.socket.write(body[sent++]!);
  }, 100);
  t.after(() => clearInterval(trickle));
  await client.closed;
  clearInterval(trickle);
  const { status, body: answer } = parseResponse(client.received());
  assert.equal(status, 408, client.received());
  assert.match(answer.error?.message ?? "", /slower than 1024 \(CONDUIT_MIN_BODY_RATE\)/);
  assert.ok(sent < body.length, `closed after ${sent} of ${body.length} bytes`);
});

test("connections past CONDUIT_MAX_CONNECTIONS are closed as they arrive; the others are served", async (t) => {
  const { url } = await listening(t, { CONDUIT_MAX_CONNECTIONS: "2" });
  const held = [await connect(url), await connect(url)];
  const third = await connect(url);
  third.socket.write(`GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n`);
  await third.closed;
  assert.equal(third.received(), "", "refused without an answer");
  held[0]!.socket.write(`GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n`);
  await held[0]!.closed;
  assert.equal(parseResponse(held[0]!.received()).status, 200);
  held[1]!.socket.destroy();
  // With the two gone, a new connection is served.
  await new Promise((resolve) => setTimeout(resolve, 50));
  const later = await connect(url);
  later.socket.write(`GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n`);
  await later.closed;
  assert.equal(parseResponse(later.received()).status, 200);
});

test("one address holds at most CONDUIT_CONNECTIONS_PER_IP connections; other addresses and trusted proxies are served", async (t) => {
  const { url } = await listening(t, {
    CONDUIT_MAX_CONNECTIONS: "10",
    CONDUIT_CONNECTIONS_PER_IP: "2",
    CONDUIT_TRUST_PROXY: "127.0.0.3",
  });
  const healthz = `GET /healthz HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n`;
  const held = [await connect(url, "127.0.0.2"), await connect(url, "127.0.0.2")];
  const third = await connect(url, "127.0.0.2");
  third.socket.write(healthz);
  await third.closed;
  assert.equal(third.received(), "", "refused without an answer");
  // Another address is served while the first holds its share ...
  const other = await connect(url, "127.0.0.1");
  other.socket.write(healthz);
  await other.closed;
  assert.equal(parseResponse(other.received()).status, 200);
  // ... and so are a trusted proxy's connections, however many.
  const proxied = [];
  for (let i = 0; i < 4; i++) proxied.push(await connect(url, "127.0.0.3"));
  for (const client of proxied) client.socket.write(healthz);
  for (const client of proxied) {
    await client.closed;
    assert.equal(parseResponse(client.received()).status, 200);
  }
  // Once one of its connections closes, the address may open another.
  held[0]!.socket.destroy();
  await new Promise((resolve) => setTimeout(resolve, 50));
  const again = await connect(url, "127.0.0.2");
  again.socket.write(healthz);
  await again.closed;
  assert.equal(parseResponse(again.received()).status, 200);
  held[1]!.socket.destroy();
});
