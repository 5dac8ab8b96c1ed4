import assert from "node:assert/strict";
import { test } from "node:test";
import { ConduitError } from "../../src/errors.ts";
import { fuzzyMatch, grade, levenshtein, settleGraders } from "../../src/evals/graders.ts";
import { compileLinearRegex, LinearRegexError } from "../../src/evals/linearRegex.ts";
import { GraderThread } from "../../src/evals/GraderThread.ts";

/** The textbook dynamic programme, the reference for the bit-parallel distance. */
function editDistance(a: string[], b: string[]): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++)
      current[j] = Math.min(
        previous[j]! + 1,
        current[j - 1]! + 1,
        previous[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    previous = current;
  }
  return previous[b.length]!;
}

test("the bit-parallel Levenshtein distance equals the dynamic programme's, across word boundaries", () => {
  let seed = 7;
  const random = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  for (let round = 0; round < 2000; round++) {
    const alphabet = "abcdé😀".slice(0, 1 + (round % 6));
    const letters = [...alphabet];
    const text = (n: number) =>
      Array.from({ length: n }, () => letters[Math.floor(random() * letters.length)]!);
    // Lengths around 32 and 64 cross the words' edges.
    const a = text(Math.floor(random() * 100));
    const b = text(Math.floor(random() * 100));
    assert.equal(levenshtein(a, b), editDistance(a, b), `${a.join("")} / ${b.join("")}`);
  }
  assert.equal(fuzzyMatch("kitten", "sitting"), 1 - 3 / 7);
});

test(
  "user regexes run on a linear-time engine: catastrophic patterns answer at once",
  { timeout: 20_000 },
  () => {
    // With JavaScript's backtracking RegExp each of these takes longer than the universe has left.
    const long = `${"a".repeat(50_000)}b`;
    assert.equal(compileLinearRegex("(a+)+$").test(long), false);
    assert.equal(compileLinearRegex("^(a|aa)+$").test(long), false);
    assert.equal(compileLinearRegex("^([\\s\\S]+)+\\u0000$").test("x".repeat(10_000)), false);
    const [regex] = settleGraders([{ type: "regex", pattern: "(a+)+$" }]);
    assert.equal(grade(regex!, long, "").score, 0);
    // A JSON schema's `pattern` runs on the same engine.
    const [schema] = settleGraders([{ type: "json_schema", schema: { type: "string", pattern: "^(a+)+$" } }]);
    assert.equal(grade(schema!, JSON.stringify(long), "").score, 0);
    assert.equal(grade(schema!, JSON.stringify("aaaa"), "").score, 1);
  },
);

test("user regexes keep JavaScript's flags and \\u escapes; lookaround and backreferences are refused by name", () => {
  assert.equal(compileLinearRegex("^hello$", "im").test("x\nHELLO\ny"), true);
  assert.equal(compileLinearRegex("a.b", "s").test("a\nb"), true);
  assert.equal(compileLinearRegex("a.b").test("a\nb"), false);
  assert.equal(compileLinearRegex("\\u00e9\\u{1F600}", "u").test("é😀"), true);
  assert.equal(compileLinearRegex("[\\u0041-\\u005A]+").test("ABC"), true);
  assert.equal(compileLinearRegex("(?<year>\\d{4})").test("in 2024"), true);
  // A parenthesis in a character class is not a group.
  assert.equal(compileLinearRegex("[(?=]").test("="), true);
  for (const [pattern, name] of [
    ["a(?=b)", "lookahead"],
    ["a(?!b)", "negative lookahead"],
    ["(?<=a)b", "lookbehind"],
    ["(?<!a)b", "negative lookbehind"],
    ["(a)\\1", "backreference"],
    ["(?<x>a)\\k<x>", "named backreference"],
  ] as const) {
    assert.throws(
      () => compileLinearRegex(pattern),
      (error: Error) => {
        assert.ok(error instanceof LinearRegexError);
        assert.match(error.message, new RegExp(name));
        assert.match(error.message, /linear-time engine \(RE2 syntax\)/);
        return true;
      },
    );
    assert.throws(
      () => settleGraders([{ type: "exact_match" }, { type: "regex", pattern }]),
      (error: ConduitError) => error.param === "graders[1].pattern" && error.message.includes(name),
    );
  }
  assert.throws(
    () => settleGraders([{ type: "regex", pattern: "a{2,1}" }]),
    (error: ConduitError) =>
      error.param === "graders[0].pattern" && /invalid repeat count/.test(error.message),
  );
  assert.throws(
    () => settleGraders([{ type: "json_schema", schema: { type: "string", pattern: "(?=a)" } }]),
    (error: ConduitError) => error.param === "graders[0].schema" && /lookahead/.test(error.message),
  );
});

test("the grading thread stops a grader at its deadline, scores the answer as an error, and goes on", async () => {
  const thread = new GraderThread({ timeoutMs: 100 });
  try {
    const [fuzzy] = settleGraders([{ type: "similarity", metric: "fuzzy_match" }]);
    // About 2 × 10^8 character pairs: seconds of work, far past the deadline.
    const slow = await thread.score(fuzzy!, "ab".repeat(60_000), "ba".repeat(100_000));
    assert.equal(slow.timedOut, true);
    assert.equal(slow.score.score, 0);
    assert.match(slow.score.error ?? "", /similarity grader ran past its 0\.1 s limit/);
    // A new thread takes the next answer.
    const quick = await thread.score(fuzzy!, "kitten", "sitting");
    assert.equal(quick.timedOut, false);
    assert.equal(quick.score.score, 1 - 3 / 7);
    assert.equal(quick.score.error, undefined);
  } finally {
    await thread.dispose();
  }
});
