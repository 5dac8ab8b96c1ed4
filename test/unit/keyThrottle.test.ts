/** Failed-key throttling: a client guessing keys is slowed to the limit a minute and shows in the log. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { FailedKeys } from "../../src/api/auth.ts";

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
