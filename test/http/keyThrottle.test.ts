/** Failed-key throttling: a client guessing keys is slowed to the limit a minute and shows in the log. */
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { test } from "node:test";
import pino from "pino";
import { buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";

test("past CONDUIT_MAX_KEY_FAILURES wrong keys in a minute a client gets 429 with Retry-After, and one warning", async (t) => {
  const lines: string[] = [];
  const log = pino(
    { level: "warn" },
    new Writable({
      write(chunk, _encoding, done) {
        lines.push(String(chunk));
        done();
      },
    }),
  );
  const env = await testEnv(t, "sqlite", { CONDUIT_MAX_KEY_FAILURES: "5" });
  const { app } = await buildTestApp(t, env, { log });
  const get = (key: string | null, remoteAddress = "10.0.0.7") =>
    app.inject({
      method: "GET",
      url: "/conduit/dataset",
      remoteAddress,
      headers: key === null ? {} : { "x-api-key": key },
    });
  for (let i = 0; i < 5; i++) assert.equal((await get(i % 2 ? null : `wrong-key-${i}`)).statusCode, 401);
  const blocked = await get("wrong-key-x");
  assert.equal(blocked.statusCode, 429, blocked.body);
  assert.equal(blocked.json().error.code, "rate_limited");
  const retryAfter = Number(blocked.headers["retry-after"]);
  assert.ok(retryAfter > 0 && retryAfter <= 60, `Retry-After ${retryAfter}`);
  // Missing and wrong keys from the client are refused until the minute is over; a valid key from the same
  // address (another user behind the same NAT) is served, and so is another client.
  assert.equal((await get(null)).statusCode, 429);
  assert.equal((await get(KEY_A)).statusCode, 200, "a valid key is never refused for others' wrong keys");
  assert.equal((await get("wrong-key-y")).statusCode, 429);
  assert.equal((await get(KEY_A, "10.0.0.8")).statusCode, 200);
  const warnings = lines.filter((line) => line.includes("failed API keys"));
  assert.equal(warnings.length, 1, lines.join(""));
  assert.match(warnings[0]!, /5 failed API keys from 10\.0\.0\.7 within a minute/);
  assert.doesNotMatch(lines.join(""), /wrong-key/, "keys are never logged");
});

test("CONDUIT_TRUST_PROXY: behind a trusted proxy the client is the X-Forwarded-For address; elsewhere the header is ignored", async (t) => {
  const env = await testEnv(t, "sqlite", {
    CONDUIT_MAX_KEY_FAILURES: "3",
    CONDUIT_TRUST_PROXY: "10.9.0.0/16",
  });
  const { app } = await buildTestApp(t, env);
  const get = (key: string, remoteAddress: string, forwardedFor?: string) =>
    app.inject({
      method: "GET",
      url: "/conduit/dataset",
      remoteAddress,
      headers: { "x-api-key": key, ...(forwardedFor ? { "x-forwarded-for": forwardedFor } : {}) },
    });
  // Through the proxy (10.9.0.4), one client guesses keys ...
  for (let i = 0; i < 3; i++)
    assert.equal((await get(`wrong-${i}`, "10.9.0.4", "203.0.113.5")).statusCode, 401);
  assert.equal((await get("wrong-x", "10.9.0.4", "198.51.100.1, 203.0.113.5")).statusCode, 429);
  // ... and only that client is refused: another behind the same proxy is not.
  assert.equal((await get("wrong-y", "10.9.0.4", "203.0.113.6")).statusCode, 401);
  // A client that is not a trusted proxy cannot pick its address with the header.
  for (let i = 0; i < 3; i++)
    assert.equal((await get(`wrong-${i}`, "192.0.2.9", `203.0.113.${100 + i}`)).statusCode, 401);
  assert.equal((await get("wrong-z", "192.0.2.9", "203.0.113.200")).statusCode, 429);
});
