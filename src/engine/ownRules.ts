import { randomBytes } from "node:crypto";
import { numberRangeGbnf, type Bound } from "./numberRanges.ts";

/**
 * The schema keywords node-llama-cpp's JSON-schema grammar does not honour but this project writes its own
 * GBNF for: every `number` and `integer`, with or without a range (`minimum`, `maximum`, `exclusiveMinimum`,
 * `exclusiveMaximum`), and string formats past `date-time`, `date` and `time`. Each such subschema is swapped
 * for a `const` placeholder before node-llama-cpp translates the schema, and the placeholder's literal in its
 * GBNF is then replaced by this project's rule (`spliceOwnRules`).
 */

/** String formats written here (node-llama-cpp writes `date-time`, `date` and `time`). */
export const OWN_FORMATS = ["uuid", "ipv4", "ipv6", "hostname", "email", "duration"] as const;
export const RANGE_KEYWORDS = ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] as const;

const HEX = "[0-9a-fA-F]";
/** A hostname label of 1 to 62 characters (so four labels stay under 253). */
const LABEL = "[a-zA-Z0-9] ( [a-zA-Z0-9-]{0,60} [a-zA-Z0-9] )?";
const OCTET = '( "25" [0-5] | "2" [0-4] [0-9] | "1" [0-9] [0-9] | [1-9] [0-9] | [0-9] )';
const N = "[0-9]{1,6}";
const DURATION_TIME = `"T" ( ${N} "H" ( ${N} "M" ( ${N} "S" )? )? | ${N} "M" ( ${N} "S" )? | ${N} "S" )`;
const DURATION_DATE = `( ${N} "Y" ( ${N} "M" ( ${N} "D" )? )? | ${N} "M" ( ${N} "D" )? | ${N} "D" )`;

/**
 * Each format's GBNF, quotes included. Some are subsets of what the format allows, so that every text is
 * valid: `ipv6` is the full eight-group form (no `::`), `hostname` has at most four labels of at most 62
 * characters, `email` is a dot-atom local part of at most four atoms of 1 to 15 characters at a hostname of two
 * to four labels.
 */
const FORMAT_GBNF: Record<(typeof OWN_FORMATS)[number], string> = {
  uuid: `"\\"" ${HEX}{8} "-" ${HEX}{4} "-" ${HEX}{4} "-" ${HEX}{4} "-" ${HEX}{12} "\\""`,
  ipv4: `"\\"" ${OCTET} "." ${OCTET} "." ${OCTET} "." ${OCTET} "\\""`,
  ipv6: `"\\"" ${HEX}{1,4} ( ":" ${HEX}{1,4} ){7} "\\""`,
  hostname: `"\\"" ${LABEL} ( "." ${LABEL} ){0,3} "\\""`,
  email: `"\\"" [a-zA-Z0-9_%+-]{1,15} ( "." [a-zA-Z0-9_%+-]{1,15} ){0,3} "@" ${LABEL} ( "." ${LABEL} ){1,3} "\\""`,
  duration: `"\\"" "P" ( ${DURATION_DATE} ( ${DURATION_TIME} )? | ${DURATION_TIME} | ${N} "W" ) "\\""`,
};

/** A placeholder and what replaces its literal in the GBNF. */
interface OwnRule {
  placeholder: string;
  expression: string;
  rules: Map<string, string>;
}

export interface WithOwnRules {
  /** The schema with placeholders, for node-llama-cpp. */
  schema: unknown;
  rules: OwnRule[];
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value);

/** The lower and upper bounds a schema sets (`unsupportedJsonSchema` has checked they are finite numbers). */
export function boundsOf(s: Record<string, unknown>): { min?: Bound; max?: Bound } {
  const pick = (inclusive: unknown, exclusive: unknown, tighter: (a: number, b: number) => boolean) => {
    const a = typeof inclusive === "number" ? { value: inclusive, exclusive: false } : undefined;
    const b = typeof exclusive === "number" ? { value: exclusive, exclusive: true } : undefined;
    if (!a || !b) return a ?? b;
    // The exclusive bound wins a tie.
    return tighter(a.value, b.value) ? a : b;
  };
  const min = pick(s.minimum, s.exclusiveMinimum, (a, b) => a > b);
  const max = pick(s.maximum, s.exclusiveMaximum, (a, b) => a < b);
  return { ...(min ? { min } : {}), ...(max ? { max } : {}) };
}

/**
 * Why a range has no number in it (`minimum 5 is above maximum 3`), or `undefined` when it has some. `integer`:
 * only integers count.
 */
export function emptyRange(s: Record<string, unknown>, integer: boolean): string | undefined {
  const { min, max } = boundsOf(s);
  if (!min && !max) return undefined;
  return numberRangeGbnf("check", integer, min, max) === undefined
    ? `has no ${integer ? "integer" : "number"} between its lower and upper bounds`
    : undefined;
}

/** Replaces the subschemas this project writes the grammar of by placeholders (see the module's comment). */
export function withOwnRules(schema: unknown): WithOwnRules {
  const nonce = randomBytes(6).toString("hex");
  const rules: OwnRule[] = [];
  const own = (expression: string, ruleMap = new Map<string, string>()) => {
    const placeholder = `conduit-own-${nonce}-${rules.length}`;
    rules.push({ placeholder, expression, rules: ruleMap });
    return { const: placeholder };
  };
  const walk = (s: unknown): unknown => {
    if (Array.isArray(s)) return s.map(walk);
    if (!isObject(s)) return s;
    const types = Array.isArray(s.type) ? (s.type as unknown[]) : s.type === undefined ? [] : [s.type];
    const numeric = types.includes("number") ? "number" : types.includes("integer") ? "integer" : undefined;
    let replaced: unknown;
    let rest: string[] = [];
    if (numeric) {
      // Every number goes through this project's grammar, bounded or not: node-llama-cpp's lets the model write
      // exponents (`-2666E8206`), which JSON parsers read as an infinity or a rounded value.
      const { min, max } = withSafeDefaults(boundsOf(s));
      const range = numberRangeGbnf(`cdt-own-${rules.length}`, numeric === "integer", min, max);
      // An empty range is refused before (`emptyRange`); a number type stays for its other types.
      if (range) replaced = own(range.expression, range.rules);
      rest = types.filter((t) => t !== "number" && t !== "integer") as string[];
    } else if (
      types.includes("string") &&
      typeof s.format === "string" &&
      (OWN_FORMATS as readonly string[]).includes(s.format)
    ) {
      replaced = own(FORMAT_GBNF[s.format as (typeof OWN_FORMATS)[number]]);
      rest = types.filter((t) => t !== "string") as string[];
    }
    if (replaced !== undefined) {
      if (rest.length === 0) return replaced;
      // The schema's other types keep their own keywords.
      const others = walk({ ...s, type: rest, format: undefined, ...clearedRange }) as Record<
        string,
        unknown
      >;
      return { oneOf: [replaced, JSON.parse(JSON.stringify(others))] };
    }
    return Object.fromEntries(
      Object.entries(s).map(([key, value]) => [
        key,
        key === "const" || key === "enum"
          ? value
          : key === "properties" || key === "$defs"
            ? isObject(value)
              ? Object.fromEntries(Object.entries(value).map(([name, sub]) => [name, walk(sub)]))
              : value
            : walk(value),
      ]),
    );
  };
  return { schema: walk(schema), rules };
}

/**
 * A side a schema leaves unbounded is bounded at ±`Number.MAX_SAFE_INTEGER` (9007199254740991), the integers a
 * JSON parser keeps exact, so that the model cannot write a number of thousands of digits; a side whose other
 * bound lies past it stays unbounded.
 */
function withSafeDefaults({ min, max }: { min?: Bound; max?: Bound }): { min?: Bound; max?: Bound } {
  const limit = Number.MAX_SAFE_INTEGER;
  return {
    min: min ?? (max !== undefined && max.value < -limit ? undefined : { value: -limit, exclusive: false }),
    max: max ?? (min !== undefined && min.value > limit ? undefined : { value: limit, exclusive: false }),
  };
}

const clearedRange = Object.fromEntries(RANGE_KEYWORDS.map((key) => [key, undefined]));

/** Puts this project's rules where node-llama-cpp wrote their placeholders. */
export function spliceOwnRules(gbnf: string, rules: readonly OwnRule[]): string {
  let text = gbnf;
  const extra: string[] = [];
  for (const rule of rules) {
    const literal = JSON.stringify(JSON.stringify(rule.placeholder));
    if (!text.includes(literal))
      throw new Error("node-llama-cpp's JSON-schema grammar no longer writes a const as expected");
    text = text.split(literal).join(`( ${rule.expression} )`);
    for (const [name, body] of rule.rules) extra.push(`${name} ::= ${body}`);
  }
  return extra.length === 0 ? text : `${text}\n${extra.join("\n")}`;
}
