import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { readIoPairs, type ReadOptions } from "../../src/datasets/ioPairs.ts";

/** The pairs of a JSON array file as `[input, output, line]`, or the error as `line: message`. */
async function jsonArray(
  content: string | Buffer,
  options: ReadOptions = {},
  format: "json" | "jsonl" = "json",
) {
  const file = path.join(os.tmpdir(), `conduit-ioPairs-${process.pid}-${Math.random()}.json`);
  fs.writeFileSync(file, content);
  const pairs: [string, string, number][] = [];
  try {
    for await (const pair of readIoPairs(file, format, options))
      pairs.push([pair.input, pair.output, pair.line]);
    return pairs;
  } catch (error) {
    return { pairs, error: (error as Error).message };
  } finally {
    fs.rmSync(file);
  }
}

test("a JSON array file: items parsed one at a time, each error naming its line", async () => {
  assert.deepEqual(await jsonArray('[{"input":"a","output":"b"},\n {"input":"c]\\"{","output":"d"}\n]'), [
    ["a", "b", 1],
    ['c]"{', "d", 2],
  ]);
  assert.deepEqual(await jsonArray('\ufeff[{"input":"é","output":"ü"}]'), [["é", "ü", 1]]);
  assert.deepEqual(await jsonArray("  [ ]  \n"), []);
  const refused: [string | Buffer, string][] = [
    ['{"input":"a","output":"b"}', 'line 1: a .json file must hold an array of {"input","output"} objects'],
    ["", 'line 1: a .json file must hold an array of {"input","output"} objects'],
    ['[{"input":"a","output":"b"},]', "line 1: invalid JSON (an array item is missing)"],
    ["[,]", "line 1: invalid JSON (an array item is missing)"],
    ['[{"input":"a","output":"b"}', "line 1: invalid JSON (the array is not closed)"],
    ['[{"input":"a","output":"b"}] x', "line 1: invalid JSON (text after the array's closing bracket)"],
    [
      '[\n{"input":"a","output":"b"},\n3\n]',
      'line 3: expected an object with "input" and "output" (or "messages")',
    ],
    [
      Buffer.concat([Buffer.from('[{"input":"a",\n"output":"'), Buffer.from([0xff]), Buffer.from('"}]')]),
      "line 2: invalid UTF-8 (save the file as UTF-8 text)",
    ],
  ];
  for (const [content, error] of refused) {
    const got = await jsonArray(content);
    assert.ok(!Array.isArray(got), `${String(content)} is refused`);
    assert.equal(got.error, error);
  }
  const invalidItem = await jsonArray('[\n{"input":"a","output":"b"},\n{"input":"a",}\n]');
  assert.ok(!Array.isArray(invalidItem));
  assert.match(invalidItem.error, /^line 3: invalid JSON/);
});

test("a JSON array file streams: pairs arrive before a bad item late in the file is read", async () => {
  const items = Array.from({ length: 20_000 }, (_, i) => JSON.stringify({ input: `q${i}`, output: `a${i}` }));
  const got = await jsonArray(`[\n${items.join(",\n")},\n{"input": 1}\n]`);
  assert.ok(!Array.isArray(got));
  // Parsed whole, the file would fail before its first pair; streamed, every good pair came first.
  assert.equal(got.pairs.length, 20_000);
  assert.deepEqual(got.pairs[19_999], ["q19999", "a19999", 20_001]);
  assert.match(got.error, /^line 20002: /);
});

test("a JSON array item over the pair limit is refused before more than the limit is held", async () => {
  const big = `[{"input":"a","output":"${"x".repeat(200_000)}"}]`;
  const got = await jsonArray(big, { maxPairBytes: 1000 });
  assert.ok(!Array.isArray(got));
  assert.equal(
    got.error,
    "line 1: the pair is longer than 1000 bytes, the largest a pair may be (CONDUIT_MAX_PAIR_BYTES)",
  );
});

test("a lone UTF-16 surrogate spelled by a JSON escape is refused, naming the line and the field", async () => {
  const lone = "a \\ud800 b";
  const cases: [string, "json" | "jsonl", string][] = [
    [`{"input":"a","output":"b"}\n{"input":"${lone}","output":"b"}`, "jsonl", 'line 2: "input"'],
    [`[{"prompt":"a","completion":"${lone}"}]`, "json", 'line 1: "output"'],
    [
      `{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":"${lone}"}]}]}`,
      "jsonl",
      "line 1: messages[1].content",
    ],
  ];
  for (const [content, format, start] of cases) {
    const got = await jsonArray(content, {}, format);
    assert.ok(!Array.isArray(got), content);
    assert.equal(
      got.error,
      `${start} holds a lone UTF-16 surrogate (an unpaired \\ud800–\\udfff escape), which is not text`,
    );
  }
  // A pair written with escapes (an emoji as \\ud83d\\ude00) is text.
  assert.deepEqual(await jsonArray('{"input":"\\ud83d\\ude00","output":"b"}', {}, "jsonl"), [
    ["\u{1F600}", "b", 1],
  ]);
});
