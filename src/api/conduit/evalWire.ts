import type {
  CreateEvalBodyWire,
  CreateEvalRunBodyWire,
  EvalResultWire,
  EvalRunWire,
  EvalSourceWire,
  EvalWire,
} from "../../contract/evals.ts";
import { questionOf, type Eval, type EvalResult, type EvalRun, type EvalSource } from "../../domain/evals.ts";
import type { CreateEval, CreateEvalRun } from "../../evals/commands.ts";

/** The Conduit API's eval bodies → the eval service's commands; evals, eval runs and results → its wire shapes. */

function fromEvalSource(source: EvalSourceWire | undefined): EvalSource | undefined {
  if (source?.type !== "items") return source && { ...source };
  return { type: "items", items: source.items.map((item) => ({ ...item })) };
}

export function fromCreateEvalBody(body: CreateEvalBodyWire): CreateEval {
  return {
    name: body.name,
    graders: body.graders,
    source: fromEvalSource(body.source),
    systemPrompt: body.systemPrompt,
  };
}

export function fromCreateEvalRunBody(body: CreateEvalRunBodyWire): CreateEvalRun {
  return {
    models: body.models,
    name: body.name,
    source: fromEvalSource(body.source),
    maxTokens: body.maxTokens,
    parallel: body.parallel,
  };
}

export function evalWire(e: Eval): EvalWire {
  const source = e.config.source;
  return {
    id: e.id,
    name: e.name,
    // Inline items are counted, not sent back: the eval's runs and results show them.
    source: source === null ? null : source.type === "items" ? { type: "items" } : { ...source },
    itemCount: source?.type === "items" ? source.items.length : null,
    graders: e.config.graders.map((g) => ({ ...g })),
    systemPrompt: e.config.systemPrompt,
    runId: e.runId,
    createdAt: e.createdAt,
  };
}

export function evalRunWire(r: EvalRun): EvalRunWire {
  return {
    id: r.id,
    evalId: r.evalId,
    name: r.name,
    models: r.models,
    status: r.status,
    progress: r.progress,
    results: r.results,
    maxTokens: r.config.maxTokens,
    error: r.error,
    createdAt: r.createdAt,
    updatedAt: r.updatedAt,
  };
}

export function evalResultWire(run: EvalRun, r: EvalResult): EvalResultWire {
  const item = run.items[r.itemIndex];
  return {
    model: r.model,
    item: r.itemIndex,
    input: questionOf(item),
    expected: item?.expected ?? "",
    answer: r.answer,
    scores: r.scores,
    latencySeconds: r.latencyMs / 1000,
    promptTokens: r.promptTokens,
    completionTokens: r.completionTokens,
    error: r.error,
  };
}
