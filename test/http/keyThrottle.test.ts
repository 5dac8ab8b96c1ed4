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
  // The client is refused whatever it sends until the minute is over; another client is not.
  assert.equal((await get(KEY_A)).statusCode, 429);
  assert.equal((await get(KEY_A, "10.0.0.8")).statusCode, 200);
  const warnings = lines.filter((line) => line.includes("failed API keys"));
  assert.equal(warnings.length, 1, lines.join(""));
  assert.match(warnings[0]!, /5 failed API keys from 10\.0\.0\.7 within a minute/);
  assert.doesNotMatch(lines.join(""), /wrong-key/, "keys are never logged");
});
