/**
 * Model graders (`score_model`, `label_model`): the judge's prompt from its template, the JSON schema its answer is
 * held to while sampling, and the score read from that answer. Pure functions; the eval service runs the judge.
 */
import { judgeLimits, type GraderScore, type ModelGrader } from "../contract/evals.ts";

type Json = Record<string, unknown>;

/** What a template's `{{…}}` can name: the item's fields and the model's answer (`sample.output_text`). */
export interface JudgeContext {
  item: Json;
  sample: { output_text: string };
}

/** `{{item.a.b}}` or `{{sample.output_text}}`; the path is short, so the match is linear in the template. */
const PLACEHOLDER = /\{\{\s*(item|sample)((?:\.[A-Za-z0-9_]{1,64}){1,8})\s*\}\}/g;

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function lookup(root: unknown, path: string): unknown {
  let value = root;
  for (const key of path.slice(1).split(".")) value = isObject(value) ? value[key] : undefined;
  return value;
}

/** One template text with its placeholders filled: text as is, anything else as JSON, each cut at its bound. */
function renderText(template: string, context: JudgeContext): string {
  return template.replace(PLACEHOLDER, (_, root: "item" | "sample", path: string) => {
    const value = lookup(context[root], path);
    const text = typeof value === "string" ? value : value === undefined ? "" : JSON.stringify(value);
    return text.length > judgeLimits.maxValueChars ? text.slice(0, judgeLimits.maxValueChars) : text;
  });
}

/** The judge's messages for one answer, or why there are none (the prompt is over its bound). */
export function judgePrompt(
  grader: ModelGrader,
  context: JudgeContext,
): { messages: ModelGrader["input"] } | { error: string } {
  const messages = grader.input.map((m) => ({ role: m.role, content: renderText(m.content, context) }));
  const chars = messages.reduce((n, m) => n + m.content.length, 0);
  if (chars > judgeLimits.maxPromptChars)
    return {
      error: `the judge's prompt is ${chars} characters; at most ${judgeLimits.maxPromptChars} are allowed`,
    };
  return { messages };
}

/** The JSON schema the judge's answer must match, enforced by a grammar: `{"score": n}` or `{"label": one of labels}`. */
export function judgeSchema(grader: ModelGrader): Record<string, unknown> {
  const verdict =
    grader.type === "score_model" ? { score: scoreSchema(grader.range) } : { label: { enum: grader.labels } };
  return {
    type: "object",
    properties: verdict,
    required: Object.keys(verdict),
    additionalProperties: false,
  };
}

/**
 * A score in `range`, which the grammar keeps the judge in: an integer range of at most {@link MAX_ENUM_SCORES}
 * values lists them (`enum`), any other is a number between the bounds (`minimum`, `maximum`).
 */
function scoreSchema([min, max]: [number, number]): Record<string, unknown> {
  if (Number.isInteger(min) && Number.isInteger(max) && max - min < MAX_ENUM_SCORES)
    return { enum: Array.from({ length: max - min + 1 }, (_, i) => min + i) };
  return { type: "number", minimum: min, maximum: max };
}

/** Most values an integer score range lists for the grammar. */
const MAX_ENUM_SCORES = 101;

/**
 * The grader's score of one answer from its judge's answer (kept as `judgeAnswer`). A score model's score must be
 * in its range and passes at its threshold; a label model's label scores 1 when it is a passing label. An answer
 * that does not parse (cut short by the token cap) is a grader error.
 */
export function readVerdict(grader: ModelGrader, judgeAnswer: string): GraderScore {
  const failed = (error: string): GraderScore => ({
    name: grader.name,
    score: 0,
    passed: false,
    error,
    judgeAnswer,
  });
  let verdict: unknown;
  try {
    verdict = JSON.parse(judgeAnswer);
  } catch {
    return failed(`the judge's answer is not complete JSON (at most ${grader.maxTokens} tokens)`);
  }
  if (!isObject(verdict)) return failed("the judge's answer is not a JSON object");
  if (grader.type === "score_model") {
    const score = verdict.score;
    const [min, max] = grader.range;
    if (typeof score !== "number" || !Number.isFinite(score))
      return failed("the judge's answer has no numeric score");
    if (score < min || score > max) return failed(`the judge's score ${score} is outside [${min}, ${max}]`);
    return { name: grader.name, score, passed: score >= grader.passThreshold, judgeAnswer };
  }
  const label = verdict.label;
  if (typeof label !== "string" || !grader.labels.includes(label))
    return failed("the judge's answer has no label of the grader's labels");
  const passed = grader.passingLabels.includes(label);
  return { name: grader.name, score: passed ? 1 : 0, passed, label, judgeAnswer };
}
