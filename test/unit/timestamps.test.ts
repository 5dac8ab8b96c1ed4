import assert from "node:assert/strict";
import { test } from "node:test";
import { parseTimestamp, timestamp } from "../../src/domain/time.ts";

/** Stored timestamps (`YYYY-MM-DD HH:MM:SS.mmm`) are UTC whatever the server's time zone. */

test("parseTimestamp reads a stored timestamp as UTC on a server whose time zone is not UTC", (t) => {
  const zone = process.env.TZ;
  t.after(() => {
    if (zone === undefined) delete process.env.TZ;
    else process.env.TZ = zone;
  });
  // Node applies a TZ set at run time to every Date from then on.
  process.env.TZ = "Asia/Kolkata";
  assert.equal(new Date(Date.UTC(2026, 10, 22)).getTimezoneOffset(), -330, "the test runs 5:30 ahead of UTC");

  const text = "2026-11-22 18:30:00.125";
  assert.equal(parseTimestamp(text), Date.UTC(2026, 10, 22, 18, 30, 0, 125));
  // What a bare Date.parse makes of it: 18:30 in Kolkata, 5.5 hours before 18:30 UTC.
  assert.equal(parseTimestamp(text) - Date.parse(text), 5.5 * 3600 * 1000);
  const now = new Date();
  assert.equal(
    parseTimestamp(timestamp(now)),
    now.getTime(),
    "the writer's text reads back as the same instant",
  );
  assert.ok(Number.isNaN(parseTimestamp("yesterday")));
});
