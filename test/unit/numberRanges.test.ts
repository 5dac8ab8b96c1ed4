import assert from "node:assert/strict";
import { test } from "node:test";
import { numberRangeGbnf, type Bound } from "../../src/engine/numberRanges.ts";
import { withOwnRules } from "../../src/engine/ownRules.ts";

/**
 * The range grammars, checked exhaustively against the range itself: each GBNF is turned into a JavaScript
 * regular expression (its rules form no cycle, so they inline) and every candidate text is matched.
 */

/** A regular expression matching exactly what a GBNF expression (the subset the range rules use) matches. */
function gbnfRegex(expression: string, rules: Map<string, string>): RegExp {
  const convert = (text: string, depth: number): string => {
    assert.ok(depth < 50, "the rules form a cycle");
    let out = "";
    for (let i = 0; i < text.length;) {
      const c = text[i]!;
      if (c === " ") i++;
      else if (c === '"') {
        const end = text.indexOf('"', i + 1);
        out += `(?:${text.slice(i + 1, end).replace(/[.*+?^${}()|[\]\\-]/g, "\\$&")})`;
        i = end + 1;
      } else if (c === "[") {
        const end = text.indexOf("]", i);
        out += text.slice(i, end + 1);
        i = end + 1;
      } else if (c === "(") {
        out += "(?:";
        i++;
      } else if (")|?*+".includes(c)) {
        out += c;
        i++;
      } else if (c === "{") {
        const end = text.indexOf("}", i);
        out += text.slice(i, end + 1);
        i = end + 1;
      } else {
        const name = /^[a-z0-9-]+/.exec(text.slice(i))![0];
        const body = rules.get(name);
        assert.ok(body !== undefined, `rule ${name} is defined`);
        out += `(?:${convert(body, depth + 1)})`;
        i += name.length;
      }
    }
    return out;
  };
  return new RegExp(`^(?:${convert(expression, 0)})$`);
}

const inRange = (value: number, min?: Bound, max?: Bound) =>
  (min === undefined || (min.exclusive ? value > min.value : value >= min.value)) &&
  (max === undefined || (max.exclusive ? value < max.value : value <= max.value));

/** Canonical texts: integers from -1100 to 1100, and decimals with one to three fraction digits near the bounds. */
function candidates(integer: boolean, near: number[]): string[] {
  const texts = new Set<string>();
  for (let i = -1100; i <= 1100; i++) texts.add(String(i));
  if (!integer)
    for (const centre of [0, ...near])
      for (let k = -2000; k <= 2000; k++) {
        const value = Math.round(centre * 100) / 100 + k / 1000;
        for (const digits of [1, 2, 3]) {
          const text = value.toFixed(digits);
          if (text !== "-0.0" && text !== "-0.00" && text !== "-0.000") texts.add(text);
        }
      }
  return [...texts];
}

const b = (value: number, exclusive = false): Bound => ({ value, exclusive });

test("integer ranges: every integer in the range and nothing else", () => {
  const cases: [Bound | undefined, Bound | undefined][] = [
    [b(0), b(10)],
    [b(1), b(5)],
    [b(-5), b(5)],
    [b(-120), b(-7)],
    [b(17), b(999)],
    [b(0), b(1000)],
    [b(3), undefined],
    [undefined, b(42)],
    [undefined, b(-42)],
    [b(-999), undefined],
    [b(0, true), b(10, true)],
    [b(1.5), b(7.5)],
    [b(-2.5, true), b(2.5, true)],
    [b(123), b(123)],
    [b(99), b(101)],
    [b(5), b(1050)],
  ];
  for (const [min, max] of cases) {
    const grammar = numberRangeGbnf("r", true, min, max);
    assert.ok(grammar, `${JSON.stringify([min, max])} has integers`);
    const regex = gbnfRegex(grammar.expression, grammar.rules);
    for (const text of candidates(true, []))
      assert.equal(
        regex.test(text),
        inRange(Number(text), min, max),
        `${text} in ${JSON.stringify([min, max])}`,
      );
    // Never leading zeros, a sign on zero, a fraction or an exponent.
    for (const text of ["007", "-0", "1.0", "1e2", "+1", ""]) assert.equal(regex.test(text), false, text);
    // Past the candidates: large numbers follow the bounds too.
    for (const text of ["123456789", "-123456789"])
      assert.equal(regex.test(text), inRange(Number(text), min, max), text);
  }
  assert.equal(numberRangeGbnf("r", true, b(5), b(3)), undefined);
  assert.equal(numberRangeGbnf("r", true, b(1.2), b(1.8)), undefined);
  assert.equal(numberRangeGbnf("r", true, b(1, true), b(2, true)), undefined);
});

test("number ranges: the decimals in the range and nothing else, fractions bounded where a bound is hit", () => {
  const cases: [Bound | undefined, Bound | undefined][] = [
    [b(0), b(1)],
    [b(0, true), b(1, true)],
    [b(-1), b(1)],
    [b(0.25), b(0.75)],
    [b(0.25, true), b(0.75, true)],
    [b(-3.14), b(2.718)],
    [b(1.5), b(1.55)],
    [b(1.05, true), b(1.5)],
    [b(0.001), undefined],
    [b(-0.5, true), undefined],
    [undefined, b(-0.125)],
    [undefined, b(0, true)],
    [b(0), undefined],
    [b(-12.5), b(-3.75, true)],
    [b(9.99), b(10.01)],
    [b(2), b(2)],
    [b(100), b(1000)],
  ];
  for (const [min, max] of cases) {
    const grammar = numberRangeGbnf("r", false, min, max);
    assert.ok(grammar, `${JSON.stringify([min, max])} has numbers`);
    const regex = gbnfRegex(grammar.expression, grammar.rules);
    const near = [min?.value, max?.value].filter((v) => v !== undefined);
    for (const text of candidates(false, near))
      assert.equal(
        regex.test(text),
        inRange(Number(text), min, max),
        `${text} in ${JSON.stringify([min, max])}`,
      );
    for (const text of ["01", "-0", "1.", ".5", "1e2", "1E-2", ""])
      assert.equal(regex.test(text), false, text);
    // Many fraction digits follow the bound digit by digit.
    for (const text of ["0.2500000001", "0.24999999", "0.7500000000001", "1.5499999999", "-3.14000001"])
      assert.equal(
        regex.test(text),
        inRange(Number(text), min, max),
        `${text} in ${JSON.stringify([min, max])}`,
      );
  }
  assert.equal(numberRangeGbnf("r", false, b(1), b(1, true)), undefined);
  assert.equal(numberRangeGbnf("r", false, b(2), b(1)), undefined);
});

test("a plain integer or number in a schema gets this project's grammar: no exponent, within the safe integers", () => {
  const { schema, rules } = withOwnRules({
    type: "object",
    properties: { n: { type: "integer" }, x: { type: ["number", "null"] }, s: { type: "string" } },
  });
  const properties = (schema as { properties: Record<string, unknown> }).properties;
  assert.deepEqual(properties.n, { const: rules[0]!.placeholder });
  assert.deepEqual(properties.x, { oneOf: [{ const: rules[1]!.placeholder }, { type: ["null"] }] });
  assert.deepEqual(properties.s, { type: "string" });
  assert.equal(rules.length, 2);
  const integer = gbnfRegex(rules[0]!.expression, rules[0]!.rules);
  for (const text of ["0", "-2666", "42", "9007199254740991", "-9007199254740991"])
    assert.equal(integer.test(text), true, text);
  for (const text of ["-2666E8206", "1e2", "2E+3", "9007199254740992", "12345678901234567890", "1.5", "-0"])
    assert.equal(integer.test(text), false, text);
  const number = gbnfRegex(rules[1]!.expression, rules[1]!.rules);
  for (const text of ["0", "-0.5", "3.25", "-2666", "9007199254740991"])
    assert.equal(number.test(text), true, text);
  for (const text of ["-2666E8206", "1.5e3", "2E-3", "9007199254740992", "1e2"])
    assert.equal(number.test(text), false, text);
});

test("a one-sided range is bounded at the safe integers on its other side, unless its bound lies past them", () => {
  const [below] = withOwnRules({ type: "integer", minimum: 5 }).rules;
  const regex = gbnfRegex(below!.expression, below!.rules);
  for (const text of ["5", "9007199254740991"]) assert.equal(regex.test(text), true, text);
  for (const text of ["4", "9007199254740992", "-1"]) assert.equal(regex.test(text), false, text);
  const [far] = withOwnRules({ type: "integer", minimum: 1e17 }).rules;
  const farRegex = gbnfRegex(far!.expression, far!.rules);
  assert.equal(farRegex.test("100000000000000000"), true);
  assert.equal(farRegex.test("1000000000000000000000"), true);
  assert.equal(farRegex.test("99999999999999999"), false);
});
