import assert from "node:assert/strict";
import { test } from "node:test";
import { fields } from "../../src/cli/context.ts";

test("fields: aligned key: value lines, nested objects indented, short lists inline, long ones a line an item", () => {
  assert.deepEqual(
    fields({
      lr: 0.0021,
      baseModelName: "tiny",
      loraTargets: ["attn_q", "ffn_up"],
      systemPrompt: "Be\nbrief.",
      validationFileID: null,
      autoSettings: [],
      openai: { suffix: "s", metadata: {} },
      warnings: ["a".repeat(50), "b".repeat(50)],
      evals: [{ step: 1, loss: 2 }],
    }),
    [
      "lr:               0.0021",
      "baseModelName:    tiny",
      "loraTargets:      attn_q, ffn_up",
      "systemPrompt:     Be⏎brief.",
      "validationFileID: null",
      "autoSettings:     []",
      "openai:",
      "  suffix:   s",
      "  metadata: {}",
      "warnings:",
      `  - ${"a".repeat(50)}`,
      `  - ${"b".repeat(50)}`,
      "evals:",
      "  - step: 1",
      "    loss: 2",
    ],
  );
  assert.deepEqual(fields({ a: 1 }, "  "), ["  a: 1"]);
  assert.deepEqual(fields({}), []);
});
