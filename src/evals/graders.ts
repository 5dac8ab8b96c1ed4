/**
 * Graders: how an answer is scored against an item's expected answer. Pure functions: `settleGraders` checks a
 * request's graders and fills in their defaults (a bad one is a 400 naming its field), `grade` scores one answer.
 */
import { Ajv, type ValidateFunction } from "ajv";
import { Value } from "@sinclair/typebox/value";
import { ValueErrorType } from "@sinclair/typebox/errors";
import type { TSchema } from "@sinclair/typebox";
import { ConduitError } from "../errors.ts";
import {
  ContainsGrader,
  ExactMatchGrader,
  JsonSchemaGrader,
  RegexGrader,
  SimilarityGrader,
  evalDefaults,
  type EvalGrader,
  type GraderScore,
  type GraderWire,
  type Normalization,
} from "../contract/evals.ts";

/** Applies the normalisations to a text: lower case, whitespace collapsed and trimmed, punctuation stripped at the ends. */
export function normalize(text: string, options: readonly Normalization[]): string {
  let out = text;
  if (options.includes("whitespace")) out = out.replace(/\s+/gu, " ").trim();
  if (options.includes("case")) out = out.toLowerCase();
  if (options.includes("punctuation")) out = out.replace(/^[\p{P}\p{S}\s]+|[\p{P}\p{S}\s]+$/gu, "");
  return out;
}

/** Words for token F1: lower case, punctuation removed, split on whitespace (SQuAD's normalisation, without articles). */
function words(text: string): string[] {
  return text
    .toLowerCase()
    .replace(/[\p{P}\p{S}]/gu, " ")
    .split(/\s+/u)
    .filter((w) => w !== "");
}

/** F1 of the two texts' words (as multisets): 1 when both have none. */
export function tokenF1(answer: string, expected: string): number {
  const a = words(answer);
  const b = words(expected);
  if (a.length === 0 || b.length === 0) return a.length === b.length ? 1 : 0;
  const counts = new Map<string, number>();
  for (const w of b) counts.set(w, (counts.get(w) ?? 0) + 1);
  let common = 0;
  for (const w of a) {
    const left = counts.get(w) ?? 0;
    if (left > 0) {
      common++;
      counts.set(w, left - 1);
    }
  }
  if (common === 0) return 0;
  const precision = common / a.length;
  const recall = common / b.length;
  return (2 * precision * recall) / (precision + recall);
}

/** 1 − Levenshtein distance / the longer length, on the trimmed texts' characters (code points). */
export function fuzzyMatch(answer: string, expected: string): number {
  const a = [...answer.trim()];
  const b = [...expected.trim()];
  const longer = Math.max(a.length, b.length);
  if (longer === 0) return 1;
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const current = [i];
    for (let j = 1; j <= b.length; j++)
      current[j] = Math.min(
        (previous[j] as number) + 1,
        (current[j - 1] as number) + 1,
        (previous[j - 1] as number) + (a[i - 1] === b[j - 1] ? 0 : 1),
      );
    previous = current;
  }
  return 1 - (previous[b.length] as number) / longer;
}

const ajv = new Ajv({ strict: false, allErrors: false });
const compiled = new WeakMap<object, ValidateFunction>();

function schemaValidator(schema: Record<string, unknown>): ValidateFunction {
  let validate = compiled.get(schema);
  if (!validate) compiled.set(schema, (validate = ajv.compile(schema)));
  return validate;
}

/**
 * The request's graders, checked, with defaults filled in and names settled (a name given twice is a 400). `param`
 * is the field that holds them (`graders`, `testing_criteria`).
 */
export function settleGraders(graders: readonly GraderWire[], param = "graders"): EvalGrader[] {
  const names = new Map<string, number>();
  return graders
    .map((grader, i) => {
      const at = `${param}[${i}]`;
      let name = grader.name;
      if (name === undefined) {
        const count = (names.get(grader.type) ?? 0) + 1;
        name = count === 1 ? grader.type : `${grader.type}_${count}`;
        names.set(grader.type, count);
      } else names.set(name, (names.get(name) ?? 0) + 1);
      const settled = settle(grader, name, at);
      return settled;
    })
    .map((grader, i, all) => {
      if (all.findIndex((g) => g.name === grader.name) !== i)
        throw new ConduitError(
          "invalid_request",
          `"${param}[${i}].name": two graders are named "${grader.name}"; give each its own name`,
          {
            param: `${param}[${i}].name`,
          },
        );
      return grader;
    });
}

const graderSchemas: Record<GraderWire["type"], TSchema> = {
  exact_match: ExactMatchGrader,
  contains: ContainsGrader,
  regex: RegexGrader,
  json_schema: JsonSchemaGrader,
  similarity: SimilarityGrader,
};

/** Checks one grader against its type's schema; the first problem is a 400 naming the field (`graders[1].pattern`). */
export function checkGrader(grader: unknown, at: string): GraderWire {
  const type = (grader as { type?: unknown } | null)?.type;
  if (typeof type !== "string" || !(type in graderSchemas))
    throw new ConduitError(
      "invalid_request",
      `"${at}.type" must be one of ${Object.keys(graderSchemas).join(", ")}`,
      { param: `${at}.type` },
    );
  const schema = graderSchemas[type as GraderWire["type"]];
  const [first] = Value.Errors(schema, grader);
  if (first) {
    const field = first.path
      .split("/")
      .filter((s) => s !== "")
      .map((s) => (/^\d+$/.test(s) ? `[${s}]` : `.${s}`))
      .join("");
    const known = Object.keys((schema as { properties?: object }).properties ?? {});
    const extra =
      first.type === ValueErrorType.ObjectAdditionalProperties
        ? Object.keys(grader as object).find((k) => !known.includes(k))
        : undefined;
    const param = extra !== undefined ? `${at}.${extra}` : `${at}${field}`;
    throw new ConduitError(
      "invalid_request",
      extra !== undefined
        ? `"${param}" is not a field of a ${type} grader (its fields: ${known.join(", ")})`
        : `"${param}" ${reasonOf(first)}`,
      { param },
    );
  }
  return grader as GraderWire;
}

/** A schema error in words: `is required`, `must be one of case, whitespace, punctuation`, or TypeBox's own. */
function reasonOf(error: { type: ValueErrorType; schema: TSchema; message: string }): string {
  if (error.type === ValueErrorType.ObjectRequiredProperty) return "is required";
  const options = (error.schema as { anyOf?: { const?: unknown }[] }).anyOf?.map((o) => o.const);
  if (options && options.every((o) => o !== undefined)) return `must be one of ${options.join(", ")}`;
  return error.message.replace(/^expected /, "must be ").toLowerCase();
}

function settle(raw: GraderWire, name: string, at: string): EvalGrader {
  const grader = checkGrader(raw, at);
  switch (grader.type) {
    case "exact_match":
      return { type: "exact_match", name, normalize: [...(grader.normalize ?? evalDefaults.normalize)] };
    case "contains":
      return {
        type: "contains",
        name,
        value: grader.value ?? null,
        normalize: [...(grader.normalize ?? evalDefaults.normalize)],
      };
    case "regex": {
      const flags = grader.flags ?? "";
      try {
        new RegExp(grader.pattern, flags);
      } catch (error) {
        throw new ConduitError(
          "invalid_request",
          `"${at}.pattern" is not a regular expression: ${(error as Error).message}`,
          {
            param: `${at}.pattern`,
          },
        );
      }
      return { type: "regex", name, pattern: grader.pattern, flags };
    }
    case "json_schema":
      try {
        schemaValidator(grader.schema);
      } catch (error) {
        throw new ConduitError(
          "invalid_request",
          `"${at}.schema" is not a JSON Schema: ${(error as Error).message}`,
          {
            param: `${at}.schema`,
          },
        );
      }
      return { type: "json_schema", name, schema: grader.schema };
    case "similarity":
      return {
        type: "similarity",
        name,
        metric: grader.metric ?? evalDefaults.similarityMetric,
        passThreshold: grader.passThreshold ?? evalDefaults.passThreshold,
      };
  }
}

/** One grader's score of `answer` against `expected`. */
export function grade(grader: EvalGrader, answer: string, expected: string): GraderScore {
  const binary = (passed: boolean): GraderScore => ({ name: grader.name, score: passed ? 1 : 0, passed });
  switch (grader.type) {
    case "exact_match":
      return binary(normalize(answer, grader.normalize) === normalize(expected, grader.normalize));
    case "contains":
      return binary(
        normalize(answer, grader.normalize).includes(normalize(grader.value ?? expected, grader.normalize)),
      );
    case "regex":
      return binary(new RegExp(grader.pattern, grader.flags).test(answer));
    case "json_schema": {
      let value: unknown;
      try {
        value = JSON.parse(answer);
      } catch {
        return binary(false);
      }
      return binary(schemaValidator(grader.schema)(value) === true);
    }
    case "similarity": {
      const score =
        grader.metric === "fuzzy_match" ? fuzzyMatch(answer, expected) : tokenF1(answer, expected);
      return { name: grader.name, score, passed: score >= grader.passThreshold };
    }
  }
}
