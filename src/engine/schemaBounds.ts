/**
 * Largest `minLength`, `maxLength`, `minItems`, … a schema may hold. They become repetitions in the
 * grammar, and llama.cpp refuses to parse a grammar that repeats a rule 2000 times or more ("exceeds sane
 * defaults"; measured with node-llama-cpp 3.22: `minLength` 2000 and `minItems` 2000 fail, 1000 compiles).
 */
export const MAX_GRAMMAR_COUNT = 1000;

/**
 * How large a JSON schema may be before it is compiled into a grammar. Compiling is CPU work on behalf of one
 * request: node-llama-cpp's JavaScript writes the GBNF text (in a worker thread, `GbnfWriter.ts`), then
 * llama.cpp parses it on the event loop, once per distinct schema and again for every generation (its grammar
 * sampler). That parse grows with the number of alternatives that can start at one position (squared: llama.cpp
 * de-duplicates its parse stacks by linear search) and with optional repetitions; a `$ref` reached through nested
 * alternatives multiplies them. Measured on a shared 2-core EPYC (`bench/eventLoop.ts --phases`, CPU time): an
 * `enum` of 10,000 strings took 87 ms to parse and 93 ms per generation, 30,000 took 1 s and 1 s; 100 strings
 * with `maxLength` 1000 took 59 ms and 41 ms. Within these bounds the costliest shapes measured took 8 ms and 11 ms
 * (ten `maxLength` 1000), the rest 5 ms or less. The depth bound keeps the recursive walks over a schema (this
 * project's, node-llama-cpp's) far from the stack's limit.
 *
 * Counts are over the schema as the grammar expands it: a `$ref` counts as the definition it points to, at every
 * place it is used (a `$ref` back into a definition it is inside counts as one subschema, as the grammar's rule
 * for it does).
 */
export const SCHEMA_BOUNDS = {
  /** Nesting of the schema's JSON (objects and arrays, annotations included). */
  depth: 64,
  /** Subschemas: the root and every schema under `properties`, `items`, `prefixItems`, `oneOf`, `anyOf`, … . */
  subschemas: 2000,
  /** Values of every `enum`, together. */
  enumValues: 1000,
  /** Branches of every `oneOf` and `anyOf`, together. */
  alternatives: 1000,
  /** `minLength`, `maxLength`, `minItems`, `maxItems`, `minProperties` and `maxProperties`, added up. */
  repetitions: 10_000,
  /** Characters of the grammar's literal text: `enum` and `const` strings and property names. */
  literalCharacters: 120_000,
} as const;

const REPETITION_KEYWORDS = [
  "minLength",
  "maxLength",
  "minItems",
  "maxItems",
  "minProperties",
  "maxProperties",
] as const;

/** A schema still to count, with the `$defs` names being expanded above it (to stop at a `$ref` cycle). */
interface Pending {
  schema: unknown;
  expanding: ReadonlySet<string>;
}

/**
 * Why `schema` is over {@link SCHEMA_BOUNDS} (`has 100000 enum values; at most 1000 are allowed`), or
 * `undefined` when it is within them. Runs in time linear in the schema's JSON, whatever its shape: the
 * expansion of `$ref`s stops as soon as it passes the subschema bound. Anything that is not a schema the
 * grammar supports is left for `unsupportedJsonSchema` to name; counts only read what they can.
 */
export function schemaOverBounds(schema: unknown): string | undefined {
  const depth = jsonDepth(schema, SCHEMA_BOUNDS.depth);
  if (depth > SCHEMA_BOUNDS.depth)
    return `nests more than ${SCHEMA_BOUNDS.depth} levels of objects and arrays; at most ${SCHEMA_BOUNDS.depth} are allowed`;
  const defs = isObject(schema) && isObject(schema.$defs) ? schema.$defs : {};
  const count = { subschemas: 0, enumValues: 0, alternatives: 0, repetitions: 0, literalCharacters: 0 };
  const pending: Pending[] = [{ schema, expanding: new Set() }];
  while (pending.length > 0) {
    const { schema: s, expanding } = pending.pop()!;
    if (!isObject(s)) continue;
    const name = typeof s.$ref === "string" && s.$ref.startsWith("#/$defs/") ? s.$ref.slice(8) : undefined;
    if (name !== undefined && Object.hasOwn(defs, name) && !expanding.has(name)) {
      pending.push({ schema: defs[name], expanding: new Set([...expanding, name]) });
      continue;
    }
    if (++count.subschemas > SCHEMA_BOUNDS.subschemas)
      return (
        `has more than ${SCHEMA_BOUNDS.subschemas} subschemas (each $ref counted as its definition); ` +
        `at most ${SCHEMA_BOUNDS.subschemas} are allowed`
      );
    const add = (child: unknown) => pending.push({ schema: child, expanding });
    if (Array.isArray(s.enum)) {
      count.enumValues += s.enum.length;
      for (const value of s.enum) if (typeof value === "string") count.literalCharacters += value.length;
    }
    if (typeof s.const === "string") count.literalCharacters += s.const.length;
    for (const key of ["oneOf", "anyOf", "prefixItems"])
      if (Array.isArray(s[key])) {
        if (key !== "prefixItems") count.alternatives += s[key].length;
        s[key].forEach(add);
      }
    if (isObject(s.properties))
      for (const [property, sub] of Object.entries(s.properties)) {
        count.literalCharacters += property.length;
        add(sub);
      }
    add(s.items);
    add(s.additionalProperties);
    for (const key of REPETITION_KEYWORDS) {
      const value = s[key];
      // Other values are refused by `unsupportedJsonSchema`, with their own reason.
      if (Number.isInteger(value) && (value as number) >= 0 && (value as number) <= MAX_GRAMMAR_COUNT)
        count.repetitions += value as number;
    }
  }
  const over = (key: Exclude<keyof typeof count, "subschemas">, what: string) =>
    count[key] > SCHEMA_BOUNDS[key] ? `${what}; at most ${SCHEMA_BOUNDS[key]} are allowed` : undefined;
  return (
    over("enumValues", `has ${count.enumValues} enum values`) ??
    over("alternatives", `has ${count.alternatives} oneOf/anyOf alternatives`) ??
    over(
      "repetitions",
      `has minLength, maxLength, minItems, maxItems, minProperties and maxProperties adding up to ${count.repetitions}`,
    ) ??
    over(
      "literalCharacters",
      `has ${count.literalCharacters} characters of enum and const strings and property names`,
    )
  );
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** How deeply `value`'s objects and arrays nest (a literal: 0), counted no further than `limit + 1`. */
function jsonDepth(value: unknown, limit: number): number {
  if (typeof value !== "object" || value === null) return 0;
  let deepest = 1;
  const pending: [object, number][] = [[value, 1]];
  while (pending.length > 0) {
    const [item, depth] = pending.pop()!;
    for (const child of Array.isArray(item) ? item : Object.values(item)) {
      // Literals (most of a large enum) are not containers: only objects and arrays are queued.
      if (typeof child !== "object" || child === null) continue;
      if (depth + 1 > limit) return depth + 1;
      deepest = Math.max(deepest, depth + 1);
      pending.push([child as object, depth + 1]);
    }
  }
  return deepest;
}
