/** Failed-key throttling: a client guessing keys is slowed to the limit a minute and shows in the log. */
import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { test } from "node:test";
import pino from "pino";
import { FailedKeys } from "../../src/api/auth.ts";
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
  // The client is refused whatever it sends until the minute is over; another client is not.
  assert.equal((await get(KEY_A)).statusCode, 429);
  assert.equal((await get(KEY_A, "10.0.0.8")).statusCode, 200);
  const warnings = lines.filter((line) => line.includes("failed API keys"));
  assert.equal(warnings.length, 1, lines.join(""));
  assert.match(warnings[0]!, /5 failed API keys from 10\.0\.0\.7 within a minute/);
  assert.doesNotMatch(lines.join(""), /wrong-key/, "keys are never logged");
});

test("FailedKeys: a window ends, a new one starts, and the memory of clients is bounded", () => {
  const warned: string[] = [];
  const keys = new FailedKeys(2, (m) => warned.push(m));
  keys.failed("a", 0);
  assert.equal(keys.blockedFor("a", 1), undefined);
  keys.failed("a", 1000);
  assert.equal(keys.blockedFor("a", 1000), 59);
  assert.equal(keys.blockedFor("a", 60_000), undefined, "the minute is over");
  keys.failed("a", 60_000);
  assert.equal(keys.blockedFor("a", 60_001), undefined, "a new window counts from zero");
  assert.equal(warned.length, 1);
  keys.failed("early", 70_000);
  keys.failed("early", 70_000);
  assert.equal(keys.blockedFor("early", 70_000), 60);
  for (let i = 0; i < 20_000; i++) keys.failed(`client-${i}`, 70_000);
  assert.equal(keys.blockedFor("early", 70_000), undefined, "forgotten: only the latest 10,000 are kept");
  keys.failed("client-19999", 70_000);
  assert.equal(keys.blockedFor("client-19999", 70_000), 60);
  const off = new FailedKeys(0, () => assert.fail("no warning without a limit"));
  for (let i = 0; i < 100; i++) off.failed("a", 0);
  assert.equal(off.blockedFor("a", 0), undefined);
});
