/**
 * OpenAI's Evals API ↔ Conduit's evals: pure translations, each way. An OpenAI eval is an eval whose graders come
 * from `testing_criteria`; an OpenAI eval run is an eval run of one model whose items come from its `data_source`;
 * an output item is one result. A field Conduit cannot honour is a 400 naming it.
 */
import { ConduitError } from "../../errors.ts";
import {
  evalLimits,
  type EvalGrader,
  type GraderSpec,
  type ModelTotals,
  type ScoringGraderSpec,
} from "../../contract/evals.ts";
import type { Eval, EvalResult, EvalRun, ResolvedItem } from "../../domain/evals.ts";
import { questionOf } from "../../domain/evals.ts";
import { parseTimestamp } from "../../domain/time.ts";

type Json = Record<string, unknown>;

function bad(message: string, param: string): ConduitError {
  return new ConduitError("invalid_request", message, { param });
}

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Unix seconds of a stored timestamp. */
function seconds(timestamp: string): number {
  return Math.floor(parseTimestamp(timestamp) / 1000);
}

const ITEM_REFERENCE = /^\{\{\s*item\.([A-Za-z0-9_.]+)\s*\}\}$/;
const SAMPLE_OUTPUT = /^\{\{\s*sample\.output_text\s*\}\}$/;

/**
 * `testing_criteria` as graders, and the item field their references name (each item's expected answer):
 * `string_check` `eq` is exact match, `like` contains, `ilike` contains ignoring case (with a reference that is
 * not `{{item.*}}`, the reference itself is looked for); `text_similarity` is the similarity grader.
 */
export function gradersOfCriteria(criteria: readonly Json[]): {
  graders: GraderSpec[];
  expectedField: string | null;
} {
  let expectedField: string | null = null;
  const graderOf = (criterion: Json, at: string): GraderSpec => {
    const name = typeof criterion.name === "string" && criterion.name !== "" ? criterion.name : undefined;
    const { type } = criterion;
    if (type === "score_model" || type === "label_model") return modelGraderOf(criterion, at);
    if (type === "multi") return multiGraderOf(criterion, at);
    if (type !== "string_check" && type !== "text_similarity")
      throw bad(
        `"${at}.type" ${JSON.stringify(type)} is not supported; Conduit grades with string_check, text_similarity, multi, score_model and label_model`,
        `${at}.type`,
      );
    if (typeof criterion.input !== "string" || !SAMPLE_OUTPUT.test(criterion.input))
      throw bad(
        `"${at}.input" must be "{{sample.output_text}}": the model's answer is what is graded`,
        `${at}.input`,
      );
    if (typeof criterion.reference !== "string")
      throw bad(`"${at}.reference" is required: "{{item.<field>}}" or a text`, `${at}.reference`);
    const field = ITEM_REFERENCE.exec(criterion.reference)?.[1];
    if (field !== undefined) {
      if (expectedField !== null && expectedField !== field)
        throw bad(
          `"${at}.reference" names item.${field}, another criterion item.${expectedField}; every criterion compares with the same field`,
          `${at}.reference`,
        );
      expectedField = field;
    }
    const named = name === undefined ? {} : { name };
    if (type === "text_similarity") {
      const metric = criterion.evaluation_metric;
      if (metric !== "fuzzy_match" && metric !== "token_f1")
        throw bad(
          `"${at}.evaluation_metric" ${JSON.stringify(metric)} is not supported; use fuzzy_match or token_f1`,
          `${at}.evaluation_metric`,
        );
      if (field === undefined)
        throw bad(`"${at}.reference" must be "{{item.<field>}}" for text_similarity`, `${at}.reference`);
      const threshold = criterion.pass_threshold;
      if (typeof threshold !== "number" || threshold < 0 || threshold > 1)
        throw bad(`"${at}.pass_threshold" must be a number from 0 to 1`, `${at}.pass_threshold`);
      return { type: "similarity", ...named, metric, passThreshold: threshold };
    }
    const operation = criterion.operation;
    if (operation === "eq") {
      if (field === undefined)
        throw bad(`"${at}.reference" must be "{{item.<field>}}" with operation eq`, `${at}.reference`);
      return { type: "exact_match", ...named, normalize: [] };
    }
    if (operation === "like" || operation === "ilike")
      return {
        type: "contains",
        ...named,
        ...(field === undefined ? { value: criterion.reference } : {}),
        normalize: operation === "ilike" ? ["case"] : [],
      };
    throw bad(
      `"${at}.operation" ${JSON.stringify(operation)} is not supported; use eq, like or ilike`,
      `${at}.operation`,
    );
  };
  /** OpenAI's `multi`: its `graders` (string checks and similarities) by name, and `calculate_output`. */
  const multiGraderOf = (criterion: Json, at: string): GraderSpec => {
    if (!isObject(criterion.graders))
      throw bad(`"${at}.graders" must be an object of graders by name`, `${at}.graders`);
    const graders = Object.fromEntries(
      Object.entries(criterion.graders).map(([key, part]): [string, ScoringGraderSpec] => {
        const partAt = `${at}.graders.${key}`;
        if (!isObject(part) || (part.type !== "string_check" && part.type !== "text_similarity"))
          throw bad(`"${partAt}.type" must be string_check or text_similarity`, `${partAt}.type`);
        // A part is named by its key (the formula's name for it).
        const { name: _name, ...spec } = graderOf(part, partAt) as ScoringGraderSpec;
        return [key, spec];
      }),
    );
    if (typeof criterion.calculate_output !== "string")
      throw bad(
        `"${at}.calculate_output" is required: a formula of its graders' names`,
        `${at}.calculate_output`,
      );
    const name = typeof criterion.name === "string" && criterion.name !== "" ? { name: criterion.name } : {};
    return { type: "multi", ...name, graders, calculateOutput: criterion.calculate_output };
  };
  const graders = criteria.map((criterion, i) => graderOf(criterion, `testing_criteria[${i}]`));
  return { graders, expectedField };
}

/** The eval command's grader fields (`graders[1].passThreshold`) → OpenAI's, in an error of the eval service. */
const openAiGraderFields: [RegExp, string][] = [
  [/\bgraders\[/g, "testing_criteria["],
  [/\.calculateOutput\b/g, ".calculate_output"],
  [/\.passThreshold\b/g, ".pass_threshold"],
  [/\.passingLabels\b/g, ".passing_labels"],
  [/\.maxTokens\b/g, ".sampling_params.max_completions_tokens"],
  [/\.temperature\b/g, ".sampling_params.temperature"],
];

export function openAiGraderError(error: unknown): unknown {
  if (!(error instanceof ConduitError) || error.param === null) return error;
  const rename = (text: string) => openAiGraderFields.reduce((t, [from, to]) => t.replace(from, to), text);
  return new ConduitError(error.code, rename(error.message), { param: rename(error.param) });
}

/**
 * OpenAI's `score_model` (`range`, `pass_threshold`) and `label_model` (`labels`, `passing_labels`): `input` is the
 * judge's template (messages; `developer` is a system turn), `sampling_params` its `temperature` and
 * `max_completions_tokens`. The item and the answer reach the judge through the template only.
 */
function modelGraderOf(criterion: Json, at: string): GraderSpec {
  if (typeof criterion.model !== "string")
    throw bad(`"${at}.model" is required: the judge model`, `${at}.model`);
  if (!Array.isArray(criterion.input) || criterion.input.length === 0)
    throw bad(`"${at}.input" must be a list of messages: the judge's prompt`, `${at}.input`);
  const input = criterion.input.map((message: unknown, i) => {
    const where = `${at}.input[${i}]`;
    if (!isObject(message)) throw bad(`"${where}" must be a message`, where);
    const role = message.role === "developer" ? "system" : message.role;
    if (role !== "system" && role !== "user" && role !== "assistant")
      throw bad(`"${where}.role" must be system, developer, user or assistant`, `${where}.role`);
    return { role, content: contentText(message.content, `${where}.content`) } as const;
  });
  const sampling = criterion.sampling_params ?? {};
  if (!isObject(sampling)) throw bad(`"${at}.sampling_params" must be an object`, `${at}.sampling_params`);
  for (const key of Object.keys(sampling))
    if (!["temperature", "max_completions_tokens", "top_p", "seed"].includes(key))
      throw bad(
        `"${at}.sampling_params.${key}" is not supported; a judge takes temperature and max_completions_tokens`,
        `${at}.sampling_params.${key}`,
      );
  if (sampling.top_p !== undefined && sampling.top_p !== null && sampling.top_p !== 1)
    throw bad(
      `"${at}.sampling_params.top_p" must be 1: a judge samples from every token`,
      `${at}.sampling_params.top_p`,
    );
  const common = {
    ...(typeof criterion.name === "string" && criterion.name !== "" ? { name: criterion.name } : {}),
    model: criterion.model,
    input,
    ...(sampling.temperature !== undefined && sampling.temperature !== null
      ? { temperature: sampling.temperature as number }
      : {}),
    ...(sampling.max_completions_tokens !== undefined && sampling.max_completions_tokens !== null
      ? { maxTokens: sampling.max_completions_tokens as number }
      : {}),
  };
  if (criterion.type === "score_model")
    return {
      type: "score_model",
      ...common,
      ...(criterion.range !== undefined && criterion.range !== null
        ? { range: criterion.range as number[] }
        : {}),
      ...(criterion.pass_threshold !== undefined && criterion.pass_threshold !== null
        ? { passThreshold: criterion.pass_threshold as number }
        : {}),
    };
  return {
    type: "label_model",
    ...common,
    labels: criterion.labels as string[],
    passingLabels: criterion.passing_labels as string[],
  };
}

/** `data_source_config`: only `custom` (items of the user's own schema). */
export function checkDataSourceConfig(config: Json): void {
  if (config.type !== "custom")
    throw bad(
      `"data_source_config.type" ${JSON.stringify(config.type)} is not supported; Conduit evals take "custom" items`,
      "data_source_config.type",
    );
  if (!isObject(config.item_schema))
    throw bad(
      `"data_source_config.item_schema" must be a JSON Schema object`,
      "data_source_config.item_schema",
    );
}

export function openAiEval(e: Eval) {
  const asked = e.config.faceRequest?.face === "openai" ? e.config.faceRequest : undefined;
  const itemSchema = isObject(asked?.dataSourceConfig) ? asked.dataSourceConfig.item_schema : undefined;
  return {
    object: "eval" as const,
    id: e.id,
    name: e.name,
    created_at: seconds(e.createdAt),
    data_source_config: {
      type: "custom",
      schema: {
        type: "object",
        properties: { item: itemSchema ?? { type: "object" }, sample: { type: "object" } },
        required: ["item"],
      },
    },
    testing_criteria: Array.isArray(asked?.testingCriteria)
      ? (asked.testingCriteria as Json[])
      : e.config.graders.map((g) => ({ ...g })),
    metadata: asked?.metadata ?? null,
  };
}

/** Text of a template message's content: a string, or OpenAI's content parts. */
function contentText(content: unknown, param: string): string {
  if (typeof content === "string") return content;
  const parts = Array.isArray(content) ? content : [content];
  return parts
    .map((part, i) => {
      if (typeof part === "string") return part;
      if (isObject(part) && typeof part.text === "string") return part.text;
      throw bad(
        `"${param}" must be text (a string or input_text parts)`,
        Array.isArray(content) ? `${param}[${i}]` : param,
      );
    })
    .join("");
}

function lookup(item: Json, path: string): unknown {
  let value: unknown = item;
  for (const key of path.split(".")) value = isObject(value) ? value[key] : undefined;
  return value;
}

/** `{{item.field}}` replaced with the item's value (JSON for what is not a string). */
function render(template: string, item: Json): string {
  return template.replace(/\{\{\s*item\.([A-Za-z0-9_.]+)\s*\}\}/g, (_, path: string) => {
    const value = lookup(item, path);
    return typeof value === "string" ? value : value === undefined ? "" : JSON.stringify(value);
  });
}

/** What an OpenAI run asks: its model, its items (raw), the prompt template, and max tokens. */
export interface OpenAiRunRequest {
  model: string;
  /** Items given inline; undefined for a file (`fileId`). */
  items: Json[] | undefined;
  fileId: string | undefined;
  template: { role: "system" | "user" | "assistant"; content: string }[] | undefined;
  maxTokens: number | undefined;
}

/** Checks a run's `data_source` (type `completions`). */
export function runRequest(dataSource: Json): OpenAiRunRequest {
  if (dataSource.type !== "completions")
    throw bad(
      `"data_source.type" ${JSON.stringify(dataSource.type)} is not supported; Conduit generates the answers ("completions")`,
      "data_source.type",
    );
  if (typeof dataSource.model !== "string" || dataSource.model === "")
    throw bad(`"data_source.model" is required: the model that answers`, "data_source.model");
  const source = dataSource.source;
  if (!isObject(source)) throw bad(`"data_source.source" is required`, "data_source.source");
  let items: Json[] | undefined;
  let fileId: string | undefined;
  if (source.type === "file_content") {
    if (!Array.isArray(source.content) || source.content.length === 0)
      throw bad(`"data_source.source.content" must be a list of {item}`, "data_source.source.content");
    if (source.content.length > evalLimits.maxItems)
      throw bad(
        `"data_source.source.content" has more than ${evalLimits.maxItems} items`,
        "data_source.source.content",
      );
    items = source.content.map((row: unknown, i) => {
      if (!isObject(row) || !isObject(row.item))
        throw bad(
          `"data_source.source.content[${i}].item" must be an object`,
          `data_source.source.content[${i}].item`,
        );
      return row.item;
    });
  } else if (source.type === "file_id") {
    if (typeof source.id !== "string" || source.id === "")
      throw bad(`"data_source.source.id" is required`, "data_source.source.id");
    fileId = source.id;
  } else
    throw bad(
      `"data_source.source.type" ${JSON.stringify(source.type)} is not supported; use file_content or file_id`,
      "data_source.source.type",
    );
  let template: OpenAiRunRequest["template"];
  const input = dataSource.input_messages;
  if (input !== undefined && input !== null) {
    if (!isObject(input) || input.type !== "template" || !Array.isArray(input.template))
      throw bad(
        `"data_source.input_messages" must be {type: template, template: [...]}`,
        "data_source.input_messages",
      );
    template = input.template.map((message: unknown, i) => {
      const at = `data_source.input_messages.template[${i}]`;
      if (!isObject(message)) throw bad(`"${at}" must be a message`, at);
      const role = message.role === "developer" ? "system" : message.role;
      if (role !== "system" && role !== "user" && role !== "assistant")
        throw bad(`"${at}.role" must be system, developer, user or assistant`, `${at}.role`);
      return { role, content: contentText(message.content, `${at}.content`) };
    });
  }
  const sampling = isObject(dataSource.sampling_params) ? dataSource.sampling_params : {};
  const maxTokens = sampling.max_completion_tokens ?? sampling.max_tokens;
  if (
    maxTokens !== undefined &&
    maxTokens !== null &&
    (typeof maxTokens !== "number" ||
      !Number.isInteger(maxTokens) ||
      maxTokens < 1 ||
      maxTokens > evalLimits.maxTokens)
  )
    throw bad(
      `"data_source.sampling_params.max_completion_tokens" must be an integer from 1 to ${evalLimits.maxTokens}`,
      "data_source.sampling_params.max_completion_tokens",
    );
  return {
    model: dataSource.model,
    items,
    fileId,
    template,
    maxTokens: typeof maxTokens === "number" ? maxTokens : undefined,
  };
}

/**
 * Raw items as Conduit items: the template rendered with each (without one, the item's `input`), and the expected
 * answer from `expectedField`.
 */
export function resolveOpenAiItems(
  raw: Json[],
  template: OpenAiRunRequest["template"],
  expectedField: string | null,
): ResolvedItem[] {
  return raw.map((item, i) => {
    const at = `data_source.source.content[${i}].item`;
    let messages: ResolvedItem["messages"];
    if (template) messages = template.map((m) => ({ role: m.role, content: render(m.content, item) }));
    else if (typeof item.input === "string") messages = [{ role: "user", content: item.input }];
    else
      throw bad(
        `"${at}.input" must be text, or "data_source.input_messages" must say how to make a prompt of an item`,
        `${at}.input`,
      );
    const expected = expectedField === null ? "" : lookup(item, expectedField);
    if (expectedField !== null && typeof expected !== "string")
      throw bad(
        `"${at}.${expectedField}" must be text: the testing criteria compare with it`,
        `${at}.${expectedField}`,
      );
    return { messages, expected: String(expected), raw: item };
  });
}

const STATUS = {
  QUEUED: "queued",
  RUNNING: "in_progress",
  COMPLETED: "completed",
  FAILED: "failed",
  CANCELLED: "canceled",
} as const;

/**
 * OpenAI's `per_model_usage`: each model's tokens, its answers' and, for a model that judged (a model grader's),
 * its verdicts'; a model that both answered and judged is one entry.
 */
export function perModelUsage(totals: readonly ModelTotals[]) {
  const usage = new Map<string, { invocations: number; promptTokens: number; completionTokens: number }>();
  const add = (model: string, invocations: number, promptTokens: number, completionTokens: number) => {
    const entry = usage.get(model) ?? { invocations: 0, promptTokens: 0, completionTokens: 0 };
    entry.invocations += invocations;
    entry.promptTokens += promptTokens;
    entry.completionTokens += completionTokens;
    usage.set(model, entry);
  };
  for (const t of totals) add(t.model, t.answered + t.errored, t.promptTokens, t.completionTokens);
  for (const t of totals)
    for (const judge of t.judgeUsage ?? [])
      add(judge.model, judge.invocations ?? 0, judge.promptTokens, judge.completionTokens);
  return [...usage].map(([model, u]) => ({
    model_name: model,
    invocation_count: u.invocations,
    prompt_tokens: u.promptTokens,
    completion_tokens: u.completionTokens,
    total_tokens: u.promptTokens + u.completionTokens,
    cached_tokens: 0,
  }));
}

export function openAiEvalRun(run: EvalRun, reportUrl: string) {
  const totals = run.results;
  const graders = run.config.graders;
  const answered = totals.reduce((sum, t) => sum + t.answered, 0);
  const passed = totals.reduce((sum, t) => sum + t.passed, 0);
  const errored = totals.reduce((sum, t) => sum + t.errored, 0);
  const asked = run.config.faceRequest?.face === "openai" ? run.config.faceRequest : undefined;
  return {
    object: "eval.run" as const,
    id: run.id,
    eval_id: run.evalId,
    name: run.name,
    model: run.models[0] ?? "",
    status: STATUS[run.status],
    created_at: seconds(run.createdAt),
    data_source: isObject(asked?.dataSource)
      ? asked.dataSource
      : { type: "completions", model: run.models[0] },
    error:
      run.error === null ? null : { code: run.status === "FAILED" ? "failed" : "error", message: run.error },
    metadata: asked?.metadata ?? null,
    result_counts: { total: run.progress.completed, errored, failed: answered - passed, passed },
    per_model_usage: perModelUsage(totals),
    per_testing_criteria_results: graders.map((g, i) => ({
      testing_criteria: g.name,
      passed: totals.reduce((sum, t) => sum + (t.graders[i]?.passed ?? 0), 0),
      failed: totals.reduce((sum, t) => sum + (t.graders[i]?.failed ?? 0), 0),
    })),
    report_url: reportUrl,
  };
}

function judgeOf(grader: EvalGrader | undefined): string | null {
  return grader && "model" in grader ? grader.model : null;
}

/** An output item's id: its model's and item's index in the run (`outputitem_0_12`), usable as a cursor. */
/** An output item's id: `outputitem_<model index>_<item index>`. */
export const OUTPUT_ITEM_ID = "^outputitem_(\\d{1,3})_(\\d{1,6})$";

export function outputItemId(result: Pick<EvalResult, "modelIndex" | "itemIndex">): string {
  return `outputitem_${result.modelIndex}_${result.itemIndex}`;
}

/** The position of an output item id in its run's results (model by model), or undefined for another id. */
export function outputItemPosition(
  id: string,
  items: number,
): { modelIndex: number; itemIndex: number; offset: number } | undefined {
  const match = new RegExp(OUTPUT_ITEM_ID).exec(id);
  if (!match) return undefined;
  const modelIndex = Number(match[1]);
  const itemIndex = Number(match[2]);
  return { modelIndex, itemIndex, offset: modelIndex * items + itemIndex };
}

export function openAiOutputItem(run: EvalRun, result: EvalResult, createdAt: string) {
  const item = run.items[result.itemIndex];
  return {
    object: "eval.run.output_item" as const,
    id: outputItemId(result),
    run_id: run.id,
    eval_id: run.evalId,
    created_at: seconds(createdAt),
    status:
      result.error !== null || result.scores.some((s) => s.error !== undefined)
        ? "error"
        : result.scores.every((s) => s.passed)
          ? "pass"
          : "fail",
    datasource_item_id: result.itemIndex,
    datasource_item: item?.raw ?? { input: questionOf(item), expected: item?.expected ?? "" },
    results: result.scores.map((s, i) => ({
      name: s.name,
      type: run.config.graders[i]?.type ?? null,
      score: s.score,
      passed: s.passed,
      // A model grader's judge, what it answered and the tokens that took.
      sample:
        s.judgeAnswer === undefined
          ? null
          : {
              output: [{ role: "assistant", content: s.judgeAnswer }],
              model: judgeOf(run.config.graders[i]),
              ...(s.usage
                ? {
                    usage: {
                      prompt_tokens: s.usage.promptTokens,
                      completion_tokens: s.usage.completionTokens,
                      total_tokens: s.usage.promptTokens + s.usage.completionTokens,
                      cached_tokens: 0,
                    },
                  }
                : {}),
            },
      ...(s.label !== undefined ? { label: s.label } : {}),
      ...(s.error !== undefined ? { error: s.error } : {}),
    })),
    sample: {
      input: item?.messages ?? [],
      output: [{ role: "assistant", content: result.answer }],
      finish_reason: result.error === null ? "stop" : "error",
      model: result.model,
      usage: {
        prompt_tokens: result.promptTokens,
        completion_tokens: result.completionTokens,
        total_tokens: result.promptTokens + result.completionTokens,
        cached_tokens: 0,
      },
      error: result.error === null ? null : { code: "generation_failed", message: result.error },
      temperature: 0,
      max_completion_tokens: run.config.maxTokens,
      top_p: 1,
      seed: 0,
    },
  };
}
