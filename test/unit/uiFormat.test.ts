import assert from "node:assert/strict";
import { test } from "node:test";
import { configRows, formatConfigValue } from "../../ui/src/format.ts";

test("a run's configuration shows the OpenAI face's record field by field, never [object Object]", () => {
  const rows = configRows({
    baseModelName: "tiny",
    loraTargets: ["attn_q", "attn_output"],
    seed: null,
    openai: {
      training_file: "file-abc",
      suffix: "pairs",
      metadata: { purpose: "test", team: "a" },
      learning_rate_multiplier: null,
    },
  });
  assert.deepEqual(rows, [
    ["baseModelName", "tiny"],
    ["loraTargets", "attn_q, attn_output"],
    ["seed", "—"],
    ["openai.training_file", "file-abc"],
    ["openai.suffix", "pairs"],
    ["openai.metadata", "purpose: test, team: a"],
    ["openai.learning_rate_multiplier", "—"],
  ]);
  for (const [, text] of rows) assert.doesNotMatch(text, /\[object Object\]/);
  assert.equal(formatConfigValue([{ a: 1 }, 2]), "a: 1, 2");
  assert.equal(formatConfigValue(""), "—");
});
