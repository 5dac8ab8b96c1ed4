/**
 * Graders: how an answer is scored against an item's expected answer. Pure functions: `settleGraders` checks a
 * request's graders and fills in their defaults (a bad one is a 400 naming its field), `grade` scores one answer.
 */
import { Ajv, type ValidateFunction } from "ajv";
import { Value } from "@sinclair/typebox/value";
import { ValueErrorType } from "@sinclair/typebox/errors";
import type { TSchema } from "@sinclair/typebox";
import { ConduitError } from "../errors.ts";
import { ajvLinearRegExp, compileLinearRegex, LinearRegexError, type LinearRegex } from "./linearRegex.ts";
import {
  ContainsGrader,
  ExactMatchGrader,
  JsonSchemaGrader,
  RegexGrader,
  SimilarityGrader,
  MultiGrader,
  SCORING_GRADER_TYPES,
  ScoreModelGrader,
  LabelModelGrader,
  evalDefaults,
  judgeLimits,
  type EvalGrader,
  type GraderScore,
  type GraderSpec,
  type JudgeSettings,
  type ModelGrader,
  type Normalization,
  type ScoringGrader,
} from "../contract/evals.ts";
import { evaluateFormula, FormulaError, isFormulaName, parseFormula, type Formula } from "./formula.ts";

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
  return 1 - levenshtein(a, b) / longer;
}

/**
 * The Levenshtein distance of two sequences of characters, by Myers' bit-parallel algorithm in Hyyrö's blocked
 * form: the shorter sequence is the pattern, 32 of its rows a machine word, so a 100,000-character reference
 * against a 1,000-character answer takes 32 word steps per reference character instead of 1,000 cell updates.
 */
export function levenshtein(x: readonly string[], y: readonly string[]): number {
  const [pattern, text] = x.length <= y.length ? [x, y] : [y, x];
  const m = pattern.length;
  if (m === 0) return text.length;
  const blocks = Math.ceil(m / 32);
  // Per character of the pattern, the rows it is on, 32 rows a word.
  const peq = new Map<string, Uint32Array>();
  for (let i = 0; i < m; i++) {
    const c = pattern[i] as string;
    let bits = peq.get(c);
    if (!bits) peq.set(c, (bits = new Uint32Array(blocks)));
    bits[i >>> 5] = ((bits[i >>> 5] as number) | (1 << (i & 31))) >>> 0;
  }
  const none = new Uint32Array(blocks);
  // Vertical deltas of the column: +1 (pv) or −1 (mv) per row.
  const pv = new Uint32Array(blocks).fill(0xffffffff);
  const mv = new Uint32Array(blocks);
  const lastBit = (1 << ((m - 1) & 31)) >>> 0;
  let score = m;
  for (const c of text) {
    const eqs = peq.get(c) ?? none;
    // Row 0 of each column grows by one: the horizontal delta entering the first block is +1.
    let carry = 1;
    for (let b = 0; b < blocks; b++) {
      let eq = eqs[b] as number;
      const p = pv[b] as number;
      const n = mv[b] as number;
      const xv = (eq | n) >>> 0;
      if (carry < 0) eq = (eq | 1) >>> 0;
      const xh = (((((eq & p) + p) >>> 0) ^ p) | eq) >>> 0;
      let ph = (n | ~(xh | p)) >>> 0;
      let mh = (p & xh) >>> 0;
      const high = b === blocks - 1 ? lastBit : 0x80000000;
      const out = ph & high ? 1 : mh & high ? -1 : 0;
      ph = (ph << 1) >>> 0;
      mh = (mh << 1) >>> 0;
      if (carry < 0) mh = (mh | 1) >>> 0;
      else if (carry > 0) ph = (ph | 1) >>> 0;
      pv[b] = (mh | ~(xv | ph)) >>> 0;
      mv[b] = (ph & xv) >>> 0;
      carry = out;
    }
    score += carry;
  }
  return score;
}

// A schema's `pattern` keywords match on RE2's engine too: linear time whatever the pattern.
const ajv = new Ajv({ strict: false, allErrors: false, code: { regExp: ajvLinearRegExp } });
/** Compiled patterns, by pattern and flags: an eval run scores every answer with the same few. */
const regexes = new Map<string, LinearRegex>();

function regexOf(pattern: string, flags: string): LinearRegex {
  const key = `${flags}/${pattern}`;
  let regex = regexes.get(key);
  if (!regex) {
    regex = compileLinearRegex(pattern, flags);
    if (regexes.size >= 256) regexes.clear();
    regexes.set(key, regex);
  }
  return regex;
}

/** Compiled schemas, by their JSON: graders reach the grading thread as copies, so identity says nothing. */
const compiled = new Map<string, ValidateFunction>();

function schemaValidator(schema: Record<string, unknown>): ValidateFunction {
  const key = JSON.stringify(schema);
  let validate = compiled.get(key);
  if (!validate) {
    validate = ajv.compile(schema);
    if (compiled.size >= 64) {
      compiled.clear();
      ajv.removeSchema();
    }
    compiled.set(key, validate);
  }
  return validate;
}

/**
 * The request's graders, checked, with defaults filled in and names settled (a name given twice is a 400). `param`
 * is the field that holds them (`graders`, `testing_criteria`).
 */
export function settleGraders(graders: readonly GraderSpec[], param = "graders"): EvalGrader[] {
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

const graderSchemas: Record<GraderSpec["type"], TSchema> = {
  exact_match: ExactMatchGrader,
  contains: ContainsGrader,
  regex: RegexGrader,
  json_schema: JsonSchemaGrader,
  similarity: SimilarityGrader,
  multi: MultiGrader,
  score_model: ScoreModelGrader,
  label_model: LabelModelGrader,
};

/** Checks one grader against its type's schema; the first problem is a 400 naming the field (`graders[1].pattern`). */
export function checkGrader(grader: unknown, at: string): GraderSpec {
  const type = (grader as { type?: unknown } | null)?.type;
  if (typeof type !== "string" || !(type in graderSchemas))
    throw new ConduitError(
      "invalid_request",
      `"${at}.type" must be one of ${Object.keys(graderSchemas).join(", ")}`,
      { param: `${at}.type` },
    );
  const schema = graderSchemas[type as GraderSpec["type"]];
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
  return grader as GraderSpec;
}

/** A schema error in words: `is required`, `must be one of case, whitespace, punctuation`, or TypeBox's own. */
function reasonOf(error: { type: ValueErrorType; schema: TSchema; message: string }): string {
  if (error.type === ValueErrorType.ObjectRequiredProperty) return "is required";
  const options = (error.schema as { anyOf?: { const?: unknown }[] }).anyOf?.map((o) => o.const);
  if (options && options.every((o) => o !== undefined)) return `must be one of ${options.join(", ")}`;
  return error.message.replace(/^expected /, "must be ").toLowerCase();
}

function settle(raw: GraderSpec, name: string, at: string): EvalGrader {
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
        regexOf(grader.pattern, flags);
      } catch (error) {
        if (!(error instanceof LinearRegexError)) throw error;
        throw new ConduitError("invalid_request", `"${at}.pattern": ${error.message}`, {
          param: `${at}.pattern`,
        });
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
    case "multi": {
      const graders: [string, ScoringGrader][] = [];
      for (const [key, part] of Object.entries(grader.graders)) {
        const partAt = `${at}.graders.${key}`;
        if (!isFormulaName(key))
          throw new ConduitError(
            "invalid_request",
            `"${partAt}": a grader's name in a formula is a letter or _, then letters, digits or _ (at most 64), and not a function's`,
            { param: partAt },
          );
        if (!(SCORING_GRADER_TYPES as readonly string[]).includes(part.type))
          throw new ConduitError(
            "invalid_request",
            `"${partAt}.type" must be one of ${SCORING_GRADER_TYPES.join(", ")}`,
            { param: `${partAt}.type` },
          );
        graders.push([key, settle(part, key, partAt) as ScoringGrader]);
      }
      try {
        formulaOf(
          grader.calculateOutput,
          graders.map(([key]) => key),
        );
      } catch (error) {
        if (!(error instanceof FormulaError)) throw error;
        throw new ConduitError("invalid_request", `"${at}.calculateOutput" ${error.message}`, {
          param: `${at}.calculateOutput`,
        });
      }
      return {
        type: "multi",
        name,
        // Own properties whatever the names (`__proto__` included).
        graders: Object.fromEntries(graders),
        calculateOutput: grader.calculateOutput,
        passThreshold: grader.passThreshold ?? evalDefaults.passThreshold,
      };
    }
    case "score_model": {
      const [min, max] = (grader.range ?? [0, 1]) as [number, number];
      const range: [number, number] = [min, max];
      if (!(range[0] < range[1]))
        throw new ConduitError("invalid_request", `"${at}.range" must be [min, max] with min below max`, {
          param: `${at}.range`,
        });
      const passThreshold = grader.passThreshold ?? (range[0] + range[1]) / 2;
      if (passThreshold < range[0] || passThreshold > range[1])
        throw new ConduitError(
          "invalid_request",
          `"${at}.passThreshold" must be within range [${range[0]}, ${range[1]}]`,
          { param: `${at}.passThreshold` },
        );
      return {
        type: "score_model",
        name,
        range: [range[0], range[1]],
        passThreshold,
        ...judgeSettings(grader),
      };
    }
    case "label_model": {
      const labels = [...new Set(grader.labels)];
      const unknown = grader.passingLabels.findIndex((label) => !labels.includes(label));
      if (unknown >= 0)
        throw new ConduitError(
          "invalid_request",
          `"${at}.passingLabels[${unknown}]" ${JSON.stringify(grader.passingLabels[unknown])} is not one of "labels"`,
          { param: `${at}.passingLabels[${unknown}]` },
        );
      return {
        type: "label_model",
        name,
        labels,
        passingLabels: [...new Set(grader.passingLabels)],
        // Room for the longest label (a token is rarely shorter than a character) and the JSON around it.
        ...judgeSettings(grader, judgeLimits.defaultMaxTokens + Math.max(...labels.map((l) => l.length))),
      };
    }
  }
}

/** A model grader's judge, template and sampling, defaults filled in (greedy, a short answer). */
function judgeSettings(
  grader: {
    model: string;
    input: { role: "system" | "user" | "assistant"; content: string }[];
    temperature?: number | undefined;
    maxTokens?: number | undefined;
  },
  defaultMaxTokens: number = judgeLimits.defaultMaxTokens,
): JudgeSettings {
  return {
    model: grader.model,
    input: grader.input.map(({ role, content }) => ({ role, content })),
    temperature: grader.temperature ?? 0,
    maxTokens: grader.maxTokens ?? Math.min(judgeLimits.maxTokens, defaultMaxTokens),
  };
}

/** Whether a grader's judge is a model: the eval service scores it through the inference path, not here. */
export function isModelGrader(grader: EvalGrader): grader is ModelGrader {
  return grader.type === "score_model" || grader.type === "label_model";
}

/**
 * Whether a grader's cost is bounded by the texts' lengths alone (a comparison, a search for a string), so it
 * may score on the event loop; the others (a pattern, a schema, a similarity of long texts) score on the grading
 * thread, with a deadline.
 */
export function gradesInline(grader: EvalGrader): boolean {
  if (grader.type === "multi") return Object.values(grader.graders).every(gradesInline);
  return grader.type === "exact_match" || grader.type === "contains";
}

/** Read formulas, by their text and names: an eval run scores every answer with the same few. */
const formulas = new Map<string, Formula>();

function formulaOf(text: string, names: readonly string[]): Formula {
  const key = `${names.join(",")}/${text}`;
  let formula = formulas.get(key);
  if (!formula) {
    formula = parseFormula(text, new Set(names));
    if (formulas.size >= 256) formulas.clear();
    formulas.set(key, formula);
  }
  return formula;
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
      return binary(regexOf(grader.pattern, grader.flags).test(answer));
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
    case "multi": {
      const scores = Object.fromEntries(
        Object.entries(grader.graders).map(([key, part]) => [key, grade(part, answer, expected).score]),
      );
      const value = evaluateFormula(formulaOf(grader.calculateOutput, Object.keys(grader.graders)), scores);
      const score = Number.isFinite(value) ? value : 0;
      return { name: grader.name, score, passed: score >= grader.passThreshold };
    }
    case "score_model":
    case "label_model":
      throw new Error(`a ${grader.type} grader is scored by its judge model, through the eval service`);
  }
}
