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

/** A file's preference examples as `[input, preferred, non-preferred, turns]`, or the error as `line: message`. */
async function preferences(content: string, format: "json" | "jsonl" | "csv") {
  const file = path.join(os.tmpdir(), `conduit-preferences-${process.pid}-${Math.random()}.${format}`);
  fs.writeFileSync(file, content);
  const read: [string, string, string | undefined, number | undefined][] = [];
  try {
    for await (const pair of readIoPairs(file, format))
      read.push([pair.input, pair.output, pair.rejected, pair.messages?.length]);
    return read;
  } catch (error) {
    return (error as Error).message;
  } finally {
    fs.rmSync(file);
  }
}

test("preference examples: OpenAI's DPO shape and Conduit's, in JSONL, JSON and CSV", async () => {
  const openAi = {
    input: { messages: [{ role: "user", content: "Hi" }], tools: [], parallel_tool_calls: true },
    preferred_output: [{ role: "assistant", content: "Hello!" }],
    non_preferred_output: [{ role: "assistant", content: "Go away." }],
  };
  assert.deepEqual(await preferences(JSON.stringify(openAi), "jsonl"), [["Hi", "Hello!", "Go away.", 2]]);
  const conduit = [
    { input: "Hi", preferred: "Hello!", non_preferred: "Go away." },
    { prompt: "Hi", chosen: "Hello!", rejected: "Go away." },
    {
      messages: [
        { role: "system", content: "Be kind." },
        { role: "user", content: "Hi" },
      ],
      preferred: "Hello!",
      non_preferred: "Go away.",
    },
  ];
  assert.deepEqual(await preferences(JSON.stringify(conduit), "json"), [
    ["Hi", "Hello!", "Go away.", undefined],
    ["Hi", "Hello!", "Go away.", undefined],
    ["Hi", "Hello!", "Go away.", 3],
  ]);
  assert.deepEqual(await preferences('input,preferred,non_preferred\nHi,Hello!,"Go away."\n', "csv"), [
    ["Hi", "Hello!", "Go away.", undefined],
  ]);
  assert.deepEqual(await preferences("prompt,chosen,rejected\nHi,Hello!,No\n", "csv"), [
    ["Hi", "Hello!", "No", undefined],
  ]);
  // An IO pair is not a preference example.
  assert.deepEqual(await preferences('{"input":"a","output":"b"}', "jsonl"), [
    ["a", "b", undefined, undefined],
  ]);
});

test("a bad preference example is refused, naming the line and the field", async () => {
  const openAi = (change: Record<string, unknown>) =>
    JSON.stringify({
      input: { messages: [{ role: "user", content: "Hi" }] },
      preferred_output: [{ role: "assistant", content: "Hello!" }],
      non_preferred_output: [{ role: "assistant", content: "Go away." }],
      ...change,
    });
  const refused: [string, "jsonl" | "csv", string][] = [
    [openAi({ non_preferred_output: undefined }), "jsonl", 'line 1: missing "non_preferred_output"'],
    [openAi({ input: undefined }), "jsonl", 'line 1: missing "input" (an object with "messages")'],
    [openAi({ input: "Hi" }), "jsonl", 'line 1: "input" must be an object with "messages"'],
    [
      openAi({ input: { messages: [] } }),
      "jsonl",
      'line 1: "input.messages" must be a non-empty array of {role, content}',
    ],
    [
      openAi({ preferred_output: [{ role: "assistant", content: "" }] }),
      "jsonl",
      "line 1: preferred_output[0].content is empty",
    ],
    [
      openAi({ preferred_output: { role: "assistant", content: "x" } }),
      "jsonl",
      'line 1: "preferred_output" must be a list of one assistant message',
    ],
    [
      openAi({ non_preferred_output: [{ role: "user", content: "x" }] }),
      "jsonl",
      'line 1: non_preferred_output[0].role must be "assistant"',
    ],
    [
      openAi({ non_preferred_output: [{ role: "assistant", content: "Hello!" }] }),
      "jsonl",
      'line 1: "preferred_output" and "non_preferred_output" are the same answer; a preference needs two',
    ],
    [
      openAi({ input: { messages: [{ role: "user", content: "Hi" }], tools: [{ type: "function" }] } }),
      "jsonl",
      'line 1: "input.tools": tool and function calls cannot be trained on',
    ],
    ['\n{"input":"Hi","preferred":"Hello!"}', "jsonl", 'line 2: missing "non_preferred" (or "rejected")'],
    ['{"input":"Hi","preferred":"","non_preferred":"x"}', "jsonl", 'line 1: "preferred" is empty'],
    [
      '{"input":"Hi","output":"x","preferred":"a","non_preferred":"b"}',
      "jsonl",
      'line 1: a preference example has "preferred" and "non_preferred" answers, not "output" (or "completion")',
    ],
    [
      '{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"a"}],"preferred":"a","non_preferred":"b"}',
      "jsonl",
      "line 1: the prompt's messages end with an assistant turn; they end with the turn the answers reply to",
    ],
    ["input,preferred,non_preferred\nHi,Hello!,\n", "csv", 'line 2: "non_preferred" is empty'],
    [
      "input,preferred\nHi,Hello!\n",
      "csv",
      'line 1: the CSV header must have "input" and "output" columns (or "input", "preferred" and "non_preferred")',
    ],
  ];
  for (const [content, format, error] of refused)
    assert.equal(await preferences(content, format), error, content);
});
