/**
 * Evaluations as the domain knows them: what an eval is asked (its graders, where its items come from), its runs,
 * their items and per-item results, as the store keeps them and the eval service hands them out. The graders'
 * vocabulary (types, defaults, limits) is `src/contract/evals.ts`; each API face maps its bodies into the eval
 * service's commands (`src/evals/commands.ts`).
 */
import type {
  EvalGrader,
  EvalRunProgress,
  EvalRunStatus,
  GraderScore,
  ModelTotals,
} from "../contract/evals.ts";

/** One chat turn of an item's prompt. */
export interface EvalMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

/** An item as given: a prompt (the user's message `input`, or the turns `messages`) and the answer expected. */
export interface EvalItem {
  input?: string | undefined;
  messages?: EvalMessage[] | undefined;
  expected: string;
}

/** Where an eval's items come from: one of the user's dataset files, a READY run's eval split, or items given. */
export type EvalSource =
  { type: "file"; fileId: string } | { type: "run"; runId: string } | { type: "items"; items: EvalItem[] };

/** What an eval holds besides its name. */
export interface EvalConfig {
  graders: EvalGrader[];
  /** Where its items come from; null: each run names them (OpenAI's evals). */
  source: EvalSource | null;
  systemPrompt: string;
  /** What a compatibility face was asked besides the eval's graders and items; absent otherwise. */
  faceRequest?: EvalFaceRequest;
}

/**
 * What the OpenAI face was asked (`/v1/evals`), returned as it was sent. Evals stored before it have `openai` with
 * OpenAI's field names; the store reads them as this.
 */
export interface EvalFaceRequest {
  face: "openai";
  /** Its `data_source_config`, as sent. */
  dataSourceConfig: unknown;
  /** Its `testing_criteria`, as sent. */
  testingCriteria: unknown;
  metadata: Record<string, string> | null;
  /** The item field the criteria's references name (`{{item.expected}}`): each item's expected answer. */
  expectedField: string | null;
}

export interface Eval {
  id: string;
  userId: string;
  name: string;
  config: EvalConfig;
  runId: string | null;
  createdAt: string;
  updatedAt: string;
}

/** An item as an eval run answers it: the prompt turns and the expected answer. */
export interface ResolvedItem {
  messages: EvalMessage[];
  expected: string;
  /** The item as given (OpenAI's `datasource_item`), when it came through the OpenAI face. */
  raw?: Record<string, unknown>;
}

/** What an eval run was asked, besides its models and items. */
export interface EvalRunConfig {
  graders: EvalGrader[];
  systemPrompt: string;
  maxTokens: number;
  parallel: number;
  /** What a compatibility face was asked besides the run's models and items; absent otherwise. */
  faceRequest?: EvalRunFaceRequest;
}

/**
 * What the OpenAI face was asked (`/v1/evals/{id}/runs`): its `data_source` and `metadata`. Runs stored before it
 * have `openai` with OpenAI's field names; the store reads them as this.
 */
export interface EvalRunFaceRequest {
  face: "openai";
  /** Its `data_source`, as sent. */
  dataSource: unknown;
  metadata: Record<string, string> | null;
}

export interface EvalRun {
  id: string;
  evalId: string;
  userId: string;
  name: string;
  status: EvalRunStatus;
  models: string[];
  items: ResolvedItem[];
  config: EvalRunConfig;
  progress: EvalRunProgress;
  results: ModelTotals[];
  error: string | null;
  createdAt: string;
  updatedAt: string;
}

/** What a run's before/after is told from: the latest eval made for it, and that eval's latest run. */
export type RunEvalRun = Pick<
  EvalRun,
  "id" | "evalId" | "status" | "models" | "progress" | "results" | "error"
>;

export interface EvalResult {
  runId: string;
  modelIndex: number;
  itemIndex: number;
  model: string;
  answer: string;
  scores: GraderScore[];
  latencyMs: number;
  promptTokens: number;
  completionTokens: number;
  error: string | null;
}

/** The last user turn of an item: what a table of results shows as its question. */
export function questionOf(item: EvalRun["items"][number] | undefined): string {
  if (!item) return "";
  for (let i = item.messages.length - 1; i >= 0; i--)
    if (item.messages[i]?.role === "user") return item.messages[i]?.content ?? "";
  return item.messages.at(-1)?.content ?? "";
}
