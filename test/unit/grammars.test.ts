import assert from "node:assert/strict";
import { test } from "node:test";
import { GbnfWriter, GbnfWriterStopped } from "../../src/engine/GbnfWriter.ts";
import { rootAsDefinition, unsupportedJsonSchema } from "../../src/engine/grammars.ts";
import { SCHEMA_BOUNDS, schemaOverBounds } from "../../src/engine/schemaBounds.ts";

/** Units of response_format's grammars: no model, no server. */

const values = (n: number, length = 0) => Array.from({ length: n }, (_, i) => `v${i}`.padEnd(length, "x"));
const object = (properties: Record<string, unknown>) => ({ type: "object", properties });
const properties = (n: number, schema: (i: number) => unknown) =>
  object(Object.fromEntries(Array.from({ length: n }, (_, i) => [`p${i}`, schema(i)])));
const nested = (levels: number) => {
  let schema: unknown = { type: "string" };
  for (let i = 1; i < levels; i++) schema = { type: "array", items: schema };
  return schema;
};
/** `$defs` whose every level reaches the one below twice through alternatives: 2^levels ways through it. */
const doubling = (levels: number) => {
  const $defs: Record<string, unknown> = { a0: { enum: ["a", "b"] } };
  for (let i = 1; i <= levels; i++) {
    const below = { $ref: `#/$defs/a${i - 1}` };
    $defs[`a${i}`] = { oneOf: [below, { oneOf: [below, { type: "null" }] }] };
  }
  return { $defs, $ref: `#/$defs/a${levels}` };
};

test("a schema over a bound is named with its count and the bound; one at every bound passes", () => {
  const { enumValues, alternatives, subschemas, depth, repetitions, literalCharacters } = SCHEMA_BOUNDS;
  const over: [string, unknown, RegExp][] = [
    ["a 100,000-value enum", { enum: values(100_000) }, /^has 100000 enum values; at most 1000 are allowed$/],
    [
      "enums of several properties, together",
      properties(3, () => ({ enum: values(400) })),
      /^has 1200 enum values; at most 1000/,
    ],
    [
      "a $ref counted at each use",
      { $defs: { colour: { enum: values(400) } }, ...properties(3, () => ({ $ref: "#/$defs/colour" })) },
      /^has 1200 enum values/,
    ],
    [
      "oneOf/anyOf branches, together",
      {
        anyOf: [{ oneOf: values(600).map((v) => ({ const: v })) }, ...values(401).map((v) => ({ const: v }))],
      },
      /^has 1002 oneOf\/anyOf alternatives; at most 1000 are allowed$/,
    ],
    [
      "subschemas",
      properties(subschemas, () => ({ type: "string" })),
      /^has more than 2000 subschemas \(each \$ref counted as its definition\); at most 2000 are allowed$/,
    ],
    // About 100 subschemas as written, but 2^20 ways through its alternatives: llama.cpp's parse follows each.
    ["alternatives doubling through $defs", doubling(20), /^has more than 2000 subschemas/],
    [
      "nesting",
      nested(depth + 1),
      /^nests more than 64 levels of objects and arrays; at most 64 are allowed$/,
    ],
    [
      "repetitions",
      properties(11, () => ({ type: "string", maxLength: 1000 })),
      /^has minLength, maxLength, minItems, maxItems, minProperties and maxProperties adding up to 11000; at most 10000 are allowed$/,
    ],
    [
      "literal text",
      { enum: values(enumValues, literalCharacters / enumValues + 1) },
      /^has 121000 characters of enum and const strings and property names; at most 120000 are allowed$/,
    ],
  ];
  for (const [name, schema, reason] of over) assert.match(schemaOverBounds(schema) ?? "", reason, name);

  const within: [string, unknown][] = [
    ["an enum at the bound", { enum: values(enumValues) }],
    ["alternatives at the bound", { oneOf: values(alternatives).map((v) => ({ const: v })) }],
    ["subschemas at the bound", properties(subschemas - 1, () => ({ type: "string" }))],
    ["nesting at the bound", nested(depth)],
    ["repetitions at the bound", properties(10, () => ({ type: "string", maxLength: repetitions / 10 }))],
    ["literal text at the bound", { enum: values(enumValues, literalCharacters / enumValues) }],
    ["fewer doublings", doubling(7)],
    // A $ref back into the definition it is in counts once: a tree of any depth.
    [
      "a recursive definition",
      {
        $defs: { node: object({ children: { type: "array", items: { $ref: "#/$defs/node" } } }) },
        $ref: "#/$defs/node",
      },
    ],
  ];
  for (const [name, schema] of within) assert.equal(schemaOverBounds(schema), undefined, name);
});

test("a type listed twice is refused by the grammar check", () => {
  assert.match(unsupportedJsonSchema({ type: ["string", "null", "string"] }) ?? "", /lists "string" twice/);
});

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

test('a $ref to "#" (the root) becomes a definition of the root, which the grammar writer takes', async () => {
  const tree = {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 5 },
      children: { type: "array", items: { $ref: "#" }, maxItems: 2 },
      "#": { const: "#" },
    },
    $defs: { root: { enum: ["#"] } },
  };
  assert.equal(unsupportedJsonSchema(tree), undefined);
  const rewritten = rootAsDefinition(tree) as { $defs: Record<string, unknown>; $ref: string };
  assert.equal(rewritten.$ref, "#/$defs/_root");
  // The schema's own definition named `root` and its `const`/`enum` values stay as they are.
  assert.deepEqual(rewritten.$defs.root, { enum: ["#"] });
  assert.deepEqual(rewritten.$defs._root, {
    type: "object",
    properties: {
      name: { type: "string", maxLength: 5 },
      children: { type: "array", items: { $ref: "#/$defs/_root" }, maxItems: 2 },
      "#": { const: "#" },
    },
  });
  // Without one, the schema itself.
  const plain = { type: "string" };
  assert.equal(rootAsDefinition(plain), plain);
  const writer = new GbnfWriter();
  try {
    assert.match(await writer.write(rewritten), /^root ::= /m);
  } finally {
    await writer.dispose();
  }
  assert.match(unsupportedJsonSchema({ $ref: "#/nope" }) ?? "", /must be "#" \(the root\) or point into/);
});
