import assert from "node:assert/strict";
import { test } from "node:test";
import { chatMessages } from "../../src/api/conduit/generationWire.ts";

test("history alternates user and assistant; an odd one ends with an unanswered user turn", () => {
  assert.deepEqual(chatMessages({ prompt: "p", system_prompt: "s", history: ["u1", "a1"] }), [
    { role: "system", content: "s" },
    { role: "user", content: "u1" },
    { role: "assistant", content: "a1" },
    { role: "user", content: "p" },
  ]);
  assert.deepEqual(chatMessages({ prompt: "p", history: ["u1", "a1", "u2"] }), [
    { role: "user", content: "u1" },
    { role: "assistant", content: "a1" },
    { role: "user", content: "u2" },
    { role: "user", content: "p" },
  ]);
});
