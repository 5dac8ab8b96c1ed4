/** Every HTML page carries a content security policy that forbids framing, and no answer is sniffed. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { build, asAlice } from "../lib/helper.ts";

test("HTML pages forbid framing and set a content security policy; every answer says nosniff", async (t) => {
  const { app } = await build(t);
  for (const url of ["/docs", "/ui", "/ui/runs/ft_x", "/docs/static/index.html"]) {
    const response = await app.inject({ method: "GET", url });
    assert.equal(response.headers["x-content-type-options"], "nosniff", url);
    if (!String(response.headers["content-type"]).startsWith("text/html")) continue;
    const policy = String(response.headers["content-security-policy"] ?? "");
    assert.match(policy, /frame-ancestors 'none'/, `${url}: ${policy}`);
    assert.match(policy, /object-src 'none'/, `${url}: ${policy}`);
    assert.equal(response.headers["x-frame-options"], "DENY", url);
  }
  const json = await app.inject({ method: "GET", url: "/conduit/dataset", headers: asAlice });
  assert.equal(json.headers["x-content-type-options"], "nosniff");
  const notFound = await app.inject({ method: "GET", url: "/nowhere" });
  assert.equal(notFound.headers["x-content-type-options"], "nosniff");
});
