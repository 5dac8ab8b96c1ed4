import type { Llama, LlamaGrammar } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import { GbnfWriter, GbnfWriterStopped } from "./GbnfWriter.ts";
import { boundDigits, MAX_BOUND_DIGITS } from "./numberRanges.ts";
import { emptyRange, OWN_FORMATS, RANGE_KEYWORDS, spliceOwnRules, withOwnRules } from "./ownRules.ts";
import { MAX_GRAMMAR_COUNT, schemaOverBounds } from "./schemaBounds.ts";
import type { ResponseFormat } from "./types.ts";

/** Compiled grammars kept for reuse, keyed by the schema's JSON text. */
const CACHE_SIZE = 64;

/**
 * What node-llama-cpp's `createGrammarForJsonSchema` makes of its GBNF text: its JSON value ends with a run of
 * newlines, its stop trigger, trimmed from the answer.
 */
const JSON_SCHEMA_GRAMMAR = { stopGenerationTriggers: ["\n".repeat(4)], trimWhitespaceSuffix: true };

/**
 * Compiles `response_format` into node-llama-cpp grammars, at most once per distinct schema (the most
 * recently used `CACHE_SIZE` are kept). A schema over `SCHEMA_BOUNDS` or one node-llama-cpp cannot honour is an
 * `invalid_request` naming `response_format` (`tools` for a forced tool call), before any model is loaded. The
 * GBNF text is written in a worker thread (`GbnfWriter`); llama.cpp parses it on the event loop, which the
 * bounds keep short.
 */
export class GrammarCache {
  private readonly grammars = new Map<string, Promise<LlamaGrammar>>();
  private readonly writer = new GbnfWriter();

  get(llama: Llama, format: ResponseFormat): Promise<LlamaGrammar> {
    const param = format.kind === "wrapped_json_schema" ? "tools" : "response_format";
    if (format.kind !== "json") {
      const over = schemaOverBounds(format.schema);
      if (over !== undefined)
        throw new ConduitError(
          "invalid_request",
          format.kind === "json_schema"
            ? `field "response_format": its JSON schema ${over}`
            : `field "tools": the schema of a call to these functions ${over}`,
          { param },
        );
    }
    const key =
      format.kind === "json"
        ? "json"
        : format.kind === "json_schema"
          ? `schema:${JSON.stringify(format.schema)}`
          : `wrapped:${JSON.stringify([format.prefix, format.suffix, format.schema])}`;
    let grammar = this.grammars.get(key);
    if (grammar) this.grammars.delete(key);
    else {
      if (format.kind !== "json") {
        const reason = unsupportedJsonSchema(format.schema);
        if (reason !== undefined)
          throw new ConduitError(
            "invalid_request",
            `field "${param}" has an unsupported JSON schema: ${reason}`,
            { param },
          );
      }
      grammar =
        format.kind === "json"
          ? llama.getGrammarFor("json")
          : format.kind === "json_schema"
            ? this.gbnf(format.schema).then((gbnf) =>
                llama.createGrammar({ grammar: gbnf, ...JSON_SCHEMA_GRAMMAR }),
              )
            : this.wrappedGrammar(llama, format.schema, format.prefix, format.suffix);
      grammar = grammar.catch((error: unknown) => {
        this.grammars.delete(key);
        if (error instanceof GbnfWriterStopped) throw error;
        throw new ConduitError(
          "invalid_request",
          `field "${param}" could not be compiled into a grammar: ${error instanceof Error ? error.message : error}`,
          { param, cause: error },
        );
      });
    }
    this.grammars.set(key, grammar);
    if (this.grammars.size > CACHE_SIZE) this.grammars.delete(this.grammars.keys().next().value!);
    return grammar;
  }

  /** Stops the grammar writer's worker thread. */
  dispose(): Promise<void> {
    return this.writer.dispose();
  }

  /** The GBNF of a JSON schema: node-llama-cpp's, with this project's own rules (`ownRules.ts`) spliced in. */
  async gbnf(schema: unknown): Promise<string> {
    const own = withOwnRules(anyOfAsOneOf(rootAsDefinition(schema)));
    return spliceOwnRules(await this.writer.write(own.schema), own.rules);
  }

  /**
   * A grammar for `prefix`, a JSON value matching `schema`, then `suffix`, and nothing after it (the model can
   * only end its turn). node-llama-cpp's JSON-schema grammar ends its root rule with a run of newlines (its stop
   * trigger); that tail is replaced by the suffix.
   */
  private async wrappedGrammar(
    llama: Llama,
    schema: unknown,
    prefix: string,
    suffix: string,
  ): Promise<LlamaGrammar> {
    const inner = await this.gbnf(schema);
    const tail = ' "\\n\\n\\n\\n" [\\n]*';
    const lines = inner.split("\n");
    const root = lines.findIndex((line) => line.startsWith("root ::= "));
    if (root === -1 || !lines[root]!.endsWith(tail))
      throw new Error("node-llama-cpp's JSON-schema grammar no longer ends its root rule as expected");
    const body = lines[root]!.slice("root ::= ".length, -tail.length);
    const parts = [
      prefix === "" ? "" : `${gbnfLiteral(prefix)} `,
      `( ${body} )`,
      suffix === "" ? "" : ` ${gbnfLiteral(suffix)}`,
    ];
    lines[root] = `root ::= ${parts.join("")}`;
    return llama.createGrammar({ grammar: lines.join("\n") });
  }
}

/**
 * A schema whose `$ref: "#"` (recursion into the root, as OpenAI's structured outputs allow) point at a
 * definition of the root instead, which node-llama-cpp's grammar knows: `{$defs: {…, root}, $ref: root}`.
 */
export function rootAsDefinition(schema: unknown): unknown {
  if (typeof schema !== "object" || schema === null || Array.isArray(schema) || !refersToRoot(schema))
    return schema;
  const { $defs, ...root } = schema as Record<string, unknown>;
  const defs = typeof $defs === "object" && $defs !== null ? ($defs as Record<string, unknown>) : {};
  let name = "root";
  while (Object.hasOwn(defs, name)) name = `_${name}`;
  const ref = `#/$defs/${name}`;
  const rewrite = (value: unknown, key?: string): unknown => {
    if (key === "const" || key === "enum") return value;
    if (Array.isArray(value)) return value.map((item) => rewrite(item));
    if (typeof value !== "object" || value === null) return value;
    return Object.fromEntries(
      Object.entries(value).map(([k, v]) => [
        k,
        k === "$ref" && v === "#"
          ? ref
          : key === "properties" || key === "$defs"
            ? rewrite(v)
            : rewrite(v, k),
      ]),
    );
  };
  return { $defs: { ...(rewrite(defs, "$defs") as object), [name]: rewrite(root) }, $ref: ref };
}

/** Whether a `$ref: "#"` is anywhere in `schema` (not inside `const` or `enum` values). */
function refersToRoot(schema: unknown, key?: string): boolean {
  if (key === "const" || key === "enum") return false;
  if (Array.isArray(schema)) return schema.some((item) => refersToRoot(item));
  if (typeof schema !== "object" || schema === null) return false;
  return Object.entries(schema).some(
    ([k, v]) =>
      (k === "$ref" && v === "#") || refersToRoot(v, key === "properties" || key === "$defs" ? undefined : k),
  );
}

/** A GBNF string literal. */
function gbnfLiteral(text: string): string {
  return JSON.stringify(text);
}

/** node-llama-cpp knows `oneOf` only; as a grammar, `anyOf` is the same choice among alternatives. */
function anyOfAsOneOf(schema: unknown, names = false): unknown {
  if (Array.isArray(schema)) return schema.map((item) => anyOfAsOneOf(item));
  if (typeof schema !== "object" || schema === null) return schema;
  return Object.fromEntries(
    Object.entries(schema).map(([key, value]) => [
      key === "anyOf" && !names ? "oneOf" : key,
      names
        ? anyOfAsOneOf(value)
        : key === "const" || key === "enum"
          ? value
          : anyOfAsOneOf(value, key === "properties" || key === "$defs"),
    ]),
  );
}

const isLiteral = (value: unknown) =>
  value === null || ["string", "number", "boolean"].includes(typeof value);

const TYPES = new Set(["string", "number", "integer", "boolean", "null", "object", "array"]);
const FORMATS = new Set(["date-time", "date", "time", ...OWN_FORMATS]);
/** Keywords that only describe (the grammar ignores them), with the JSON type each must have. */
const ANNOTATIONS: Record<string, "string" | "array"> = {
  title: "string",
  description: "string",
  $schema: "string",
  $id: "string",
  $comment: "string",
  examples: "array",
};
const BY_TYPE: Record<string, string[]> = {
  string: ["minLength", "maxLength", "format"],
  object: ["properties", "required", "additionalProperties", "minProperties", "maxProperties"],
  array: ["items", "prefixItems", "minItems", "maxItems"],
  number: [...RANGE_KEYWORDS],
  integer: [...RANGE_KEYWORDS],
};

/**
 * Why the JSON-schema grammar (node-llama-cpp's 3.22, with this project's own rules) cannot honour `schema`, or `undefined` when it can. It
 * supports `type` (one or a list of `string`, `number`, `integer`, `boolean`, `null`, `object`, `array`),
 * `const` and `enum` (of strings, numbers, booleans, `null`), `oneOf`/`anyOf`, `$ref` to `$defs`, `properties`, `required`, `additionalProperties`,
 * `minProperties`/`maxProperties` (every property in `properties` is always written, as OpenAI's strict mode
 * requires), `items`, `prefixItems`, `minItems`/`maxItems`, `minLength`/`maxLength`
 * and `format` (`date-time`, `date`, `time`), and with this project's own rules (`ownRules.ts`) `minimum`,
 * `maximum`, `exclusiveMinimum`, `exclusiveMaximum` and the formats `uuid`, `ipv4`, `ipv6`, `hostname`, `email`
 * and `duration`; anything else (`pattern`, `multipleOf`, `allOf`, `not`, …) would be silently ignored by the
 * grammar, so it is refused here, naming the keyword.
 */
export function unsupportedJsonSchema(
  schema: unknown,
  at = "schema",
  defs = new Set<string>(),
): string | undefined {
  if (typeof schema !== "object" || schema === null || Array.isArray(schema))
    return `${at} must be an object`;
  const s = schema as Record<string, unknown>;
  if (at === "schema" && s.$defs !== undefined) {
    if (typeof s.$defs !== "object" || s.$defs === null) return "schema.$defs must be an object";
    for (const name of Object.keys(s.$defs)) defs.add(name);
    for (const [name, def] of Object.entries(s.$defs)) {
      const reason = unsupportedJsonSchema(def, `schema.$defs.${name}`, defs);
      if (reason) return reason;
    }
  }
  for (const [key, type] of Object.entries(ANNOTATIONS)) {
    const value = s[key];
    if (value !== undefined && (type === "array" ? !Array.isArray(value) : typeof value !== type))
      return `${at}.${key} must be ${type === "array" ? "an array" : "a string"}`;
  }
  const allowed = new Set([...Object.keys(ANNOTATIONS), ...(at === "schema" ? ["$defs"] : [])]);
  const check = (key: string, value: unknown): string | undefined => {
    if (Array.isArray(value)) {
      for (const [i, v] of value.entries()) {
        const reason = unsupportedJsonSchema(v, `${at}.${key}[${i}]`, defs);
        if (reason) return reason;
      }
    }
    return undefined;
  };
  if ("$ref" in s) {
    const ref = s.$ref;
    const name =
      typeof ref === "string" && ref.startsWith("#/$defs/") ? ref.slice("#/$defs/".length) : undefined;
    if (ref !== "#" && (name === undefined || !defs.has(name)))
      return `${at}.$ref must be "#" (the root) or point into the root's $defs ("#/$defs/name")`;
    allowed.add("$ref");
  } else if ("const" in s) {
    if (!isLiteral(s.const)) return `${at}.const must be a string, number, boolean or null`;
    allowed.add("const");
  } else if ("enum" in s) {
    if (!Array.isArray(s.enum) || s.enum.length === 0) return `${at}.enum must be a non-empty array`;
    if (!s.enum.every(isLiteral)) return `${at}.enum values must be strings, numbers, booleans or null`;
    allowed.add("enum");
  } else if ("oneOf" in s || "anyOf" in s) {
    const key = "oneOf" in s ? "oneOf" : "anyOf";
    if (!Array.isArray(s[key]) || (s[key] as unknown[]).length === 0)
      return `${at}.${key} must be a non-empty array`;
    allowed.add(key);
    const reason = check(key, s[key]);
    if (reason) return reason;
  } else if ("type" in s) {
    const types = Array.isArray(s.type) ? (s.type as unknown[]) : [s.type];
    for (const [i, t] of types.entries()) {
      if (typeof t !== "string" || !TYPES.has(t)) return `${at}.type ${JSON.stringify(t)} is not a JSON type`;
      if (types.indexOf(t) !== i) return `${at}.type lists "${t}" twice`;
    }
    allowed.add("type");
    for (const t of types) for (const key of BY_TYPE[t as string] ?? []) allowed.add(key);
    if (s.format !== undefined && (typeof s.format !== "string" || !FORMATS.has(s.format)))
      return `${at}.format must be one of ${[...FORMATS].map((f) => `"${f}"`).join(", ")}`;
    if (
      typeof s.format === "string" &&
      (OWN_FORMATS as readonly string[]).includes(s.format) &&
      (s.minLength !== undefined || s.maxLength !== undefined)
    )
      return `${at}.format "${s.format}" cannot be combined with minLength or maxLength`;
    for (const key of RANGE_KEYWORDS) {
      if (s[key] !== undefined && (typeof s[key] !== "number" || !Number.isFinite(s[key])))
        return `${at}.${key} must be a number`;
      if (typeof s[key] === "number" && boundDigits(s[key]) > MAX_BOUND_DIGITS)
        return `${at}.${key} has more than ${MAX_BOUND_DIGITS} decimal digits`;
    }
    if (types.includes("number") || types.includes("integer")) {
      const empty = emptyRange(s, !types.includes("number"));
      if (empty) return `${at} ${empty}`;
    }
    if (s.properties !== undefined) {
      if (typeof s.properties !== "object" || s.properties === null)
        return `${at}.properties must be an object`;
      for (const [name, sub] of Object.entries(s.properties)) {
        const reason = unsupportedJsonSchema(sub, `${at}.properties.${name}`, defs);
        if (reason) return reason;
      }
    }
    if (
      s.required !== undefined &&
      (!Array.isArray(s.required) || s.required.some((r) => typeof r !== "string"))
    )
      return `${at}.required must be an array of property names`;
    if (typeof s.additionalProperties === "object" && s.additionalProperties !== null) {
      const reason = unsupportedJsonSchema(s.additionalProperties, `${at}.additionalProperties`, defs);
      if (reason) return reason;
    } else if (s.additionalProperties !== undefined && typeof s.additionalProperties !== "boolean")
      return `${at}.additionalProperties must be a boolean or a schema`;
    if (typeof s.items === "object" && s.items !== null && !Array.isArray(s.items)) {
      const reason = unsupportedJsonSchema(s.items, `${at}.items`, defs);
      if (reason) return reason;
    } else if (s.items !== undefined && typeof s.items !== "boolean") return `${at}.items must be a schema`;
    if (s.prefixItems !== undefined) {
      if (!Array.isArray(s.prefixItems)) return `${at}.prefixItems must be an array`;
      const reason = check("prefixItems", s.prefixItems);
      if (reason) return reason;
    }
    for (const key of ["minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties"])
      if (
        s[key] !== undefined &&
        !(Number.isInteger(s[key]) && (s[key] as number) >= 0 && (s[key] as number) <= MAX_GRAMMAR_COUNT)
      )
        return `${at}.${key} must be an integer from 0 to ${MAX_GRAMMAR_COUNT}`;
  } else return `${at} needs one of "type", "const", "enum", "oneOf", "anyOf" or "$ref"`;
  const unknown = Object.keys(s).find((key) => !allowed.has(key));
  if (unknown !== undefined) return `${at}.${unknown} is not supported by the grammar`;
  return undefined;
}
