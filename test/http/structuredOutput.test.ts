import assert from "node:assert/strict";
import { before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { build, KEY_A } from "../lib/helper.ts";
import { suiteCleanup } from "../lib/helper.ts";

/** `response_format` keywords past node-llama-cpp's own, honoured by the grammar on the real tiny model. */

const chat = (payload: Record<string, unknown>) => ({
  method: "POST" as const,
  url: "/conduit/v1/chat",
  headers: { authorization: `Token ${KEY_A}` },
  payload: { model: "tiny", prompt: "Give me numbers.", ...payload },
});

const schemaFormat = (schema: unknown) => ({
  type: "json_schema",
  json_schema: { name: "reply", schema, strict: true },
});

describe("structured output on the tiny model", () => {
  let app: FastifyInstance;
  const suite = suiteCleanup();
  before(async () => {
    ({ app } = await build(suite));
  });

  test("numbers and integers with ranges are always inside them", async () => {
    const properties = {
      small: { type: "integer", minimum: -7, maximum: 12 },
      open: { type: "integer", exclusiveMinimum: 95, exclusiveMaximum: 130 },
      negative: { type: "integer", minimum: -250, maximum: -199 },
      ratio: { type: "number", minimum: 0, maximum: 1 },
      band: { type: "number", exclusiveMinimum: 2.25, exclusiveMaximum: 2.5 },
      below: { type: "number", minimum: -3.75, exclusiveMaximum: -3 },
      maybe: { type: ["integer", "null"], minimum: 40, maximum: 42 },
    };
    const schema = {
      type: "object",
      properties,
      required: Object.keys(properties),
      additionalProperties: false,
    };
    const inside: Record<string, (v: number) => boolean> = {
      small: (v) => Number.isInteger(v) && v >= -7 && v <= 12,
      open: (v) => Number.isInteger(v) && v > 95 && v < 130,
      negative: (v) => Number.isInteger(v) && v >= -250 && v <= -199,
      ratio: (v) => v >= 0 && v <= 1,
      band: (v) => v > 2.25 && v < 2.5,
      below: (v) => v >= -3.75 && v < -3,
    };
    const seen = new Set<string>();
    for (const temperature of [0, 0.8, 1.5])
      for (const seed of [1, 2, 3, 4]) {
        const res = await app.inject(
          chat({ max_tokens: 200, temperature, seed, response_format: schemaFormat(schema) }),
        );
        assert.equal(res.statusCode, 200, res.body);
        const choice = res.json().choices[0];
        assert.equal(choice.finish_reason, "stop", choice.text);
        const value = JSON.parse(choice.text) as Record<string, number | null>;
        assert.deepEqual(Object.keys(value), Object.keys(properties));
        for (const [name, check] of Object.entries(inside))
          assert.ok(
            check(value[name] as number),
            `${name} = ${value[name]} (t=${temperature}, seed ${seed})`,
          );
        assert.ok(value.maybe === null || [40, 41, 42].includes(value.maybe!), `maybe = ${value.maybe}`);
        seen.add(choice.text);
      }
    // Sampling explores the ranges: not one answer every time.
    assert.ok(seen.size > 3, [...seen].join("\n"));
  });

  test("a plain integer or number is written without an exponent, within the safe integers", async () => {
    const properties = {
      count: { type: "integer" },
      amount: { type: "number" },
      maybe: { type: ["integer", "null"] },
    };
    const schema = {
      type: "object",
      properties,
      required: Object.keys(properties),
      additionalProperties: false,
    };
    for (const temperature of [0, 1, 2])
      for (const seed of [1, 2, 3]) {
        const res = await app.inject(
          chat({ max_tokens: 200, temperature, seed, response_format: schemaFormat(schema) }),
        );
        assert.equal(res.statusCode, 200, res.body);
        const choice = res.json().choices[0];
        assert.equal(choice.finish_reason, "stop", choice.text);
        assert.doesNotMatch(choice.text, /[0-9.][eE]/, choice.text);
        const value = JSON.parse(choice.text) as Record<string, number | null>;
        assert.ok(Number.isSafeInteger(value.count), `count = ${value.count}`);
        assert.ok(Math.abs(value.amount!) <= Number.MAX_SAFE_INTEGER, `amount = ${value.amount}`);
        assert.ok(value.maybe === null || Number.isSafeInteger(value.maybe), `maybe = ${value.maybe}`);
      }
  });

  test("string formats the grammar writes are valid", async () => {
    const properties = {
      id: { type: "string", format: "uuid" },
      address: { type: "string", format: "ipv4" },
      when: { type: "string", format: "duration" },
    };
    const schema = {
      type: "object",
      properties,
      required: Object.keys(properties),
      additionalProperties: false,
    };
    for (const seed of [1, 2, 3]) {
      const res = await app.inject(
        chat({ max_tokens: 300, temperature: 1, seed, response_format: schemaFormat(schema) }),
      );
      assert.equal(res.statusCode, 200, res.body);
      const choice = res.json().choices[0];
      assert.equal(choice.finish_reason, "stop", choice.text);
      const value = JSON.parse(choice.text) as Record<string, string>;
      assert.match(value.id!, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i);
      const octets = value.address!.split(".");
      assert.equal(octets.length, 4, value.address);
      for (const octet of octets) assert.ok(/^(0|[1-9][0-9]*)$/.test(octet) && Number(octet) <= 255, octet);
      assert.match(value.when!, /^P(?!$)(\d+Y)?(\d+M)?(\d+D)?(T(?=\d)(\d+H)?(\d+M)?(\d+S)?)?$|^P\d+W$/);
    }
  });

  test('a schema recursing into its root ("$ref": "#") is honoured', async () => {
    const tree = {
      type: "object",
      properties: {
        id: { type: "integer", minimum: 1, maximum: 9 },
        children: { type: "array", items: { $ref: "#" }, maxItems: 2 },
      },
      required: ["id", "children"],
      additionalProperties: false,
    };
    const check = (node: { id: number; children: unknown[] }, depth: number): number => {
      assert.deepEqual(Object.keys(node), ["id", "children"]);
      assert.ok(Number.isInteger(node.id) && node.id >= 1 && node.id <= 9, JSON.stringify(node));
      assert.ok(node.children.length <= 2);
      return Math.max(depth, ...node.children.map((c) => check(c as typeof node, depth + 1)));
    };
    let stopped = 0;
    for (const seed of [1, 2, 3, 4]) {
      const res = await app.inject(
        chat({ max_tokens: 300, temperature: 1, seed, response_format: schemaFormat(tree) }),
      );
      assert.equal(res.statusCode, 200, res.body);
      const choice = res.json().choices[0];
      if (choice.finish_reason !== "stop") continue;
      stopped++;
      check(JSON.parse(choice.text), 0);
    }
    assert.ok(stopped > 0, "no answer finished within max_tokens");
  });

  test("keywords the grammar cannot honour are a 400 naming them", async () => {
    const refused: [unknown, RegExp][] = [
      [{ type: "integer", multipleOf: 5 }, /schema\.multipleOf is not supported/],
      [{ type: "string", pattern: "^a+$" }, /schema\.pattern is not supported/],
      [{ type: "string", format: "uri" }, /schema\.format must be one of/],
      [{ type: "integer", minimum: 10, maximum: 3 }, /no integer between its lower and upper bounds/],
      [{ type: "integer", minimum: 1.2, maximum: 1.8 }, /no integer between/],
      [{ type: "number", exclusiveMinimum: 1, maximum: 1 }, /no number between/],
      [{ type: "number", exclusiveMinimum: true }, /schema\.exclusiveMinimum must be a number/],
      [{ type: "number", maximum: 1e300 }, /schema\.maximum has more than 40 decimal digits/],
      [{ type: "number", minimum: 1e-50 }, /schema\.minimum has more than 40 decimal digits/],
      [{ type: "string", format: "email", maxLength: 5 }, /"email" cannot be combined with minLength/],
    ];
    for (const [schema, reason] of refused) {
      const res = await app.inject(chat({ response_format: schemaFormat(schema) }));
      assert.equal(res.statusCode, 400, `${JSON.stringify(schema)}: ${res.body}`);
      assert.equal(res.json().error.param, "response_format");
      assert.match(res.json().error.message, reason);
    }
  });
});
