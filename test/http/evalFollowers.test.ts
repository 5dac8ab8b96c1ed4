import assert from "node:assert/strict";
import { test } from "node:test";
import type { EvalRunWire } from "../../src/contract/evals.ts";
import { as, build, KEY_A } from "../lib/helper.ts";

/** Reads an events stream until its end; returns how many `progress` events it had and its last event's data. */
async function follow(url: string): Promise<{ progress: number; last: string }> {
  const response = await fetch(url, { headers: { "x-api-key": KEY_A } });
  assert.equal(response.status, 200);
  const blocks = (await response.text()).split("\n\n").filter((block) => block.includes("data:"));
  return {
    progress: blocks.filter((block) => block.startsWith("event: progress")).length,
    last: blocks.at(-1) ?? "",
  };
}

test("the followers of an eval run share its reads: a change costs the same queries for 16 followers as for one", async (t) => {
  const { app, core } = await build(t);
  core.evals.start(core.runEvents);
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  const alice = as(app, KEY_A);
  const items = Array.from({ length: 2000 }, (_, i) => ({ input: `question ${i}`, expected: "x" }));
  const evalId = (
    await alice.post("/conduit/evals", {
      source: { type: "items", items },
      graders: [{ type: "exact_match" }],
    })
  ).json<{ id: string }>().id;
  const run = (
    await alice.post(`/conduit/evals/${evalId}/runs`, { models: ["tiny"], maxTokens: 8 })
  ).json<EvalRunWire>();
  const before = core.db.queries();
  const followers = await Promise.all(
    Array.from({ length: 16 }, () => follow(`${url}/conduit/evals/${evalId}/runs/${run.id}/events`)),
  );
  const queries = core.db.queries() - before;
  for (const follower of followers) assert.match(follower.last, /"status":"COMPLETED"/);
  const changes = Math.max(...followers.map((f) => f.progress));
  assert.ok(changes >= 10, `progress events: ${changes}`);
  // The run's own writes are two queries a change (its results, its progress), the shared read one more, and the
  // 16 followers' ownership checks and a poll a second beside them; 16 reads a change would be 16 more.
  assert.ok(queries < changes * 4 + 16 * 2 + 40, `${queries} queries for ${changes} changes followed by 16`);
});
