import assert from "node:assert/strict";
import { test } from "node:test";
import { configRows, formatConfigValue, formatScores, formatShare, judgeNotes } from "../../ui/src/format.ts";

test("a run's configuration shows the OpenAI face's record field by field, never [object Object]", () => {
  const rows = configRows({
    baseModelName: "tiny",
    loraTargets: ["attn_q", "attn_output"],
    seed: null,
    jobRequest: {
      face: "openai",
      trainingFileID: "file-abc",
      suffix: "pairs",
      metadata: { purpose: "test", team: "a" },
      lrMultiplier: null,
    },
  });
  assert.deepEqual(rows, [
    ["baseModelName", "tiny"],
    ["loraTargets", "attn_q, attn_output"],
    ["seed", "—"],
    ["jobRequest.face", "openai"],
    ["jobRequest.trainingFileID", "file-abc"],
    ["jobRequest.suffix", "pairs"],
    ["jobRequest.metadata", "purpose: test, team: a"],
    ["jobRequest.lrMultiplier", "—"],
  ]);
  for (const [, text] of rows) assert.doesNotMatch(text, /\[object Object\]/);
  assert.equal(formatConfigValue([{ a: 1 }, 2]), "a: 1, 2");
  assert.equal(formatConfigValue(""), "—");
});

test("an answer's scores show a label model's label, a grader that could not score as ?, and the judges' answers", () => {
  const scores = [
    { name: "exact_match", score: 1, passed: true },
    { name: "similarity", score: 0.8234, passed: true },
    { name: "tone", score: 1, passed: true, label: "polite", judgeAnswer: '{"label":"polite"}' },
    { name: "quality", score: 0, passed: false, error: "the judge failed", judgeAnswer: '{"sco' },
  ];
  assert.equal(formatScores(scores), "exact_match 1 · similarity 0.82 · tone polite · quality ?");
  assert.equal(judgeNotes(scores), 'tone: {"label":"polite"}\nquality: {"sco\nquality: the judge failed');
  assert.equal(judgeNotes(scores.slice(0, 2)), "");
});

test("a DPO run's share of preferred wins shows as a percentage, none as a dash", () => {
  assert.equal(formatShare(0.875), "87.5 %");
  assert.equal(formatShare(1), "100 %");
  assert.equal(formatShare(2 / 3), "66.7 %");
  assert.equal(formatShare(undefined), "—");
});
