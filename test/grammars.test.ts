import assert from "node:assert/strict";
import { test } from "node:test";
import { GbnfWriter, GbnfWriterStopped } from "../src/engine/GbnfWriter.ts";

/** Units of response_format's grammars: no model, no server. */

test("the GBNF writer's worker translates a schema, rejects with the translator's error, and stops", async () => {
  const writer = new GbnfWriter();
  try {
    const gbnf = await writer.write({ enum: ["red", "green"] });
    assert.match(gbnf, /^root ::= /m);
    assert.match(gbnf, /red/);
    // node-llama-cpp's own limit on nesting, past this project's bounds: its message comes back.
    let deep: unknown = { type: "string" };
    for (let i = 0; i < 600; i++) deep = { type: "array", items: deep };
    await assert.rejects(writer.write(deep), /Maximum nesting scope exceeded/);
    // The worker survives a translation error.
    assert.match(await writer.write({ type: "boolean" }), /true/);
    const pending = assert.rejects(writer.write({ type: "string" }), GbnfWriterStopped);
    await writer.dispose();
    await pending;
  } finally {
    await writer.dispose();
  }
});
