/**
 * The vocabulary and wire shapes of evaluations that the HTTP API (both faces), the CLI, the dashboard and the
 * domain share: graders, item sources, eval and eval-run records, per-item results, and the before/after
 * summary a fine-tuning run carries. Each is defined here once.
 */
import { Type, type Static } from "@sinclair/typebox";
import { noControlCharacters, noNul, REASON } from "./patterns.ts";

/** Eval run states: QUEUED → RUNNING → COMPLETED | FAILED | CANCELLED; QUEUED → CANCELLED. */
export const evalRunStatuses = ["QUEUED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED"] as const;
export type EvalRunStatus = (typeof evalRunStatuses)[number];

/** Normalisations an exact-match or contains grader applies to both the answer and the reference. */
export const NORMALIZATIONS = ["case", "whitespace", "punctuation"] as const;
export type Normalization = (typeof NORMALIZATIONS)[number];

/** Text-similarity metrics: normalised token F1 (SQuAD's), or a character-level Levenshtein ratio. */
export const SIMILARITY_METRICS = ["token_f1", "fuzzy_match"] as const;
export type SimilarityMetric = (typeof SIMILARITY_METRICS)[number];

/** Limits the API enforces on evals. */
export const evalLimits = {
  /** Items of one eval run. */
  maxItems: 5000,
  /** Models one eval run scores. */
  maxModels: 8,
  /** Graders of one eval. */
  maxGraders: 16,
  /** Answers in flight at once (the engine batches them). */
  maxParallel: 64,
  maxTokens: 4096,
} as const;

/** Defaults of an eval run. */
export const evalDefaults = {
  /** Most tokens of each answer. */
  maxTokens: 128,
  /** An exact-match grader's normalisation. */
  normalize: ["whitespace"] as Normalization[],
  similarityMetric: "token_f1" as SimilarityMetric,
  /** A similarity score at or above this passes. */
  passThreshold: 0.5,
};

const GraderName = Type.Optional(
  Type.String({
    minLength: 1,
    maxLength: 64,
    pattern: noControlCharacters,
    description: "The grader's name in results. Defaults to its type (a second of a type gets `_2`, ...).",
  }),
);
const Normalize = Type.Optional(
  Type.Array(Type.Union(NORMALIZATIONS.map((n) => Type.Literal(n))), {
    maxItems: 3,
    description:
      "Applied to the answer and the reference before comparing: `case` (lower case), `whitespace` (trimmed, runs " +
      "of whitespace as one space), `punctuation` (punctuation and symbols at either end removed). Defaults to " +
      '`["whitespace"]`.',
  }),
);

export const ExactMatchGrader = Type.Object(
  { type: Type.Literal("exact_match"), name: GraderName, normalize: Normalize },
  {
    additionalProperties: false,
    description: "1 when the answer equals the item's expected answer, else 0.",
  },
);
export const ContainsGrader = Type.Object(
  {
    type: Type.Literal("contains"),
    name: GraderName,
    value: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 10_000,
        pattern: noNul,
        description: "The text to look for. Defaults to the item's expected answer.",
      }),
    ),
    normalize: Normalize,
  },
  { additionalProperties: false, description: "1 when the answer contains the text, else 0." },
);
export const RegexGrader = Type.Object(
  {
    type: Type.Literal("regex"),
    name: GraderName,
    pattern: Type.String({
      minLength: 1,
      maxLength: 2000,
      description:
        "A regular expression in RE2 syntax (JavaScript's without lookaround and backreferences), matched in linear time.",
    }),
    flags: Type.Optional(
      Type.String({
        pattern: "^[imsu]{0,4}$",
        [REASON]: "may hold only the flags i, m, s and u",
        description: "Its flags (`i`, `m`, `s`, `u`). Defaults to none.",
      }),
    ),
  },
  { additionalProperties: false, description: "1 when the pattern matches the answer, else 0." },
);
export const JsonSchemaGrader = Type.Object(
  {
    type: Type.Literal("json_schema"),
    name: GraderName,
    schema: Type.Record(Type.String(), Type.Unknown(), {
      description: "A JSON Schema (draft 2020-12 subset Ajv knows).",
    }),
  },
  { additionalProperties: false, description: "1 when the answer is JSON valid against the schema, else 0." },
);
export const SimilarityGrader = Type.Object(
  {
    type: Type.Literal("similarity"),
    name: GraderName,
    metric: Type.Optional(
      Type.Union(
        SIMILARITY_METRICS.map((m) => Type.Literal(m)),
        {
          description:
            "`token_f1`: F1 of the answer's and the expected answer's words (lower case, punctuation removed, as in " +
            "SQuAD); `fuzzy_match`: 1 − Levenshtein distance / the longer length, on characters. Defaults to `token_f1`.",
        },
      ),
    ),
    passThreshold: Type.Optional(
      Type.Number({
        minimum: 0,
        maximum: 1,
        description: "A score at or above it passes. Defaults to `0.5`.",
      }),
    ),
  },
  {
    additionalProperties: false,
    description: "A score from 0 to 1 of how close the answer is to the expected one.",
  },
);

/** The grader types a `multi` grader combines: those that score an answer by themselves. */
export const SCORING_GRADER_TYPES = [
  "exact_match",
  "contains",
  "regex",
  "json_schema",
  "similarity",
] as const;

/** A grader that scores an answer by itself, as asked (a `multi` grader's parts). */
export type ScoringGraderSpec =
  | Static<typeof ExactMatchGrader>
  | Static<typeof ContainsGrader>
  | Static<typeof RegexGrader>
  | Static<typeof JsonSchemaGrader>
  | Static<typeof SimilarityGrader>;

export const MultiGrader = Type.Object(
  {
    type: Type.Literal("multi"),
    name: GraderName,
    graders: Type.Record(
      Type.String(),
      Type.Unsafe<ScoringGraderSpec>(Type.Object({ type: Type.String() }, { additionalProperties: true })),
      {
        minProperties: 1,
        maxProperties: evalLimits.maxGraders,
        description:
          "The graders it combines, by the name the formula gives each (a letter or `_`, then letters, digits or " +
          "`_`): `exact_match`, `contains`, `regex`, `json_schema` or `similarity`, each with its own fields.",
      },
    ),
    calculateOutput: Type.String({
      minLength: 1,
      maxLength: 1000,
      description:
        "The score, from its graders' scores by name: numbers, `+ - * / ^`, parentheses and `min max abs floor " +
        "ceil exp sqrt log`, e.g. `(exact + similar) / 2`. A score that is not a finite number is 0.",
    }),
    passThreshold: Type.Optional(
      Type.Number({ description: "A score at or above it passes. Defaults to `0.5`." }),
    ),
  },
  {
    additionalProperties: false,
    description:
      "A score computed from several graders' scores of the same answer (OpenAI's `multi` grader).",
  },
);

/** Bounds of a model grader (a judge): its prompt template, the prompt it makes, and its answer. */
export const judgeLimits = {
  /** Messages of a judge's template. */
  maxMessages: 16,
  /** Characters of one template message. */
  maxTemplateChars: 20_000,
  /** Characters one `{{…}}` puts into the prompt (an item's field, the answer); a longer value is cut there. */
  maxValueChars: 20_000,
  /** Characters of the whole rendered prompt; a longer one is a grader error for that answer. */
  maxPromptChars: 100_000,
  /** Most tokens of the judge's answer. */
  maxTokens: 1024,
  /** A score model's or label model's answer is at most this many tokens unless it says. */
  defaultMaxTokens: 64,
  /** Labels of a label model. */
  maxLabels: 32,
} as const;

const JudgeModel = Type.String({
  minLength: 1,
  maxLength: 256,
  pattern: noControlCharacters,
  description:
    "The judge: any model this server serves you (a base model, a run id or an `ft:` name). One that does not exist is a 400 at creation.",
});
const JudgeInput = Type.Array(
  Type.Object(
    {
      role: Type.Union([Type.Literal("system"), Type.Literal("user"), Type.Literal("assistant")]),
      content: Type.String({ minLength: 1, maxLength: judgeLimits.maxTemplateChars, pattern: noNul }),
    },
    { additionalProperties: false },
  ),
  {
    minItems: 1,
    maxItems: judgeLimits.maxMessages,
    description:
      "The judge's prompt: chat messages in which `{{sample.output_text}}` is the model's answer and `{{item.<field>}}` " +
      "a field of the item (`item.input`: its last user message, `item.expected`: its expected answer; an OpenAI item: " +
      `its own fields). Each value is cut at ${judgeLimits.maxValueChars} characters; a prompt over ${judgeLimits.maxPromptChars} is a grader error.`,
  },
);
const JudgeSampling = {
  temperature: Type.Optional(
    Type.Number({
      minimum: 0,
      maximum: 2,
      description: "The judge's temperature. Defaults to `0` (greedy).",
    }),
  ),
  maxTokens: Type.Optional(
    Type.Integer({
      minimum: 1,
      maximum: judgeLimits.maxTokens,
      description: `Most tokens of the judge's answer. Defaults to \`${judgeLimits.defaultMaxTokens}\` (a label model: that plus its longest label's characters).`,
    }),
  ),
};

export const ScoreModelGrader = Type.Object(
  {
    type: Type.Literal("score_model"),
    name: GraderName,
    model: JudgeModel,
    input: JudgeInput,
    range: Type.Optional(
      Type.Array(Type.Number(), {
        minItems: 2,
        maxItems: 2,
        description: "The scores the judge may give, `[min, max]`. Defaults to `[0, 1]`.",
      }),
    ),
    passThreshold: Type.Optional(
      Type.Number({ description: "A score at or above it passes. Defaults to the middle of `range`." }),
    ),
    ...JudgeSampling,
  },
  {
    additionalProperties: false,
    description: 'A model reads the prompt and answers `{"score": <number>}`, held to `range` by a grammar.',
  },
);
export const LabelModelGrader = Type.Object(
  {
    type: Type.Literal("label_model"),
    name: GraderName,
    model: JudgeModel,
    input: JudgeInput,
    labels: Type.Array(Type.String({ minLength: 1, maxLength: 256, pattern: noNul }), {
      minItems: 1,
      maxItems: judgeLimits.maxLabels,
      description: "The labels the judge chooses from.",
    }),
    passingLabels: Type.Array(Type.String({ minLength: 1, maxLength: 256, pattern: noNul }), {
      minItems: 1,
      maxItems: judgeLimits.maxLabels,
      description: "The labels that pass (each one of `labels`).",
    }),
    ...JudgeSampling,
  },
  {
    additionalProperties: false,
    description:
      'A model reads the prompt and answers `{"label": <one of labels>}` (a grammar makes it); 1 when the label is a passing one.',
  },
);

export const Grader = Type.Union(
  [
    ExactMatchGrader,
    ContainsGrader,
    RegexGrader,
    JsonSchemaGrader,
    SimilarityGrader,
    MultiGrader,
    ScoreModelGrader,
    LabelModelGrader,
  ],
  {
    description: "How each answer is scored.",
  },
);
/** A grader as asked, before its defaults are filled in and its name settled (`settleGraders`); both faces ask in it. */
export type GraderSpec = Static<typeof Grader>;

/** A grader with its defaults filled in and its name settled, as stored. */
export type EvalGrader = ScoringGrader | MultiEvalGrader | ModelGrader;

/** A grader that scores an answer by itself, as stored. */
export type ScoringGrader =
  | { type: "exact_match"; name: string; normalize: Normalization[] }
  | { type: "contains"; name: string; value: string | null; normalize: Normalization[] }
  | { type: "regex"; name: string; pattern: string; flags: string }
  | { type: "json_schema"; name: string; schema: Record<string, unknown> }
  | { type: "similarity"; name: string; metric: SimilarityMetric; passThreshold: number };

/** A `multi` grader as stored: its parts by the formula's names (each part's `name` is that name). */
export interface MultiEvalGrader {
  type: "multi";
  name: string;
  graders: Record<string, ScoringGrader>;
  calculateOutput: string;
  passThreshold: number;
}

/** A grader whose judge is a model (`score_model`, `label_model`), as stored. */
export type ModelGrader =
  | ({
      type: "score_model";
      name: string;
      range: [number, number];
      passThreshold: number;
    } & JudgeSettings)
  | ({ type: "label_model"; name: string; labels: string[]; passingLabels: string[] } & JudgeSettings);

/** What every model grader has: its judge, its prompt template, its sampling. */
export interface JudgeSettings {
  model: string;
  input: { role: "system" | "user" | "assistant"; content: string }[];
  temperature: number;
  maxTokens: number;
}

/** One chat turn of an item's prompt. */
export const EvalMessage = Type.Object(
  {
    role: Type.Union([Type.Literal("system"), Type.Literal("user"), Type.Literal("assistant")]),
    content: Type.String({ maxLength: 100_000, pattern: noNul }),
  },
  { additionalProperties: false },
);

/** An item: a prompt (text, or chat turns) and the answer expected. */
export const EvalItem = Type.Object(
  {
    input: Type.Optional(
      Type.String({ maxLength: 100_000, pattern: noNul, description: "The user's message." }),
    ),
    messages: Type.Optional(
      Type.Array(EvalMessage, {
        minItems: 1,
        maxItems: 256,
        description: "The conversation so far, instead of `input`.",
      }),
    ),
    expected: Type.String({ maxLength: 100_000, pattern: noNul, description: "The answer expected." }),
  },
  { additionalProperties: false },
);
export type EvalItemWire = Static<typeof EvalItem>;

/** What an eval's items are. */
export const EvalSource = Type.Union(
  [
    Type.Object(
      {
        type: Type.Literal("file"),
        fileId: Type.String({
          minLength: 1,
          maxLength: 128,
          description: "One of your dataset files (IO pairs or chat examples).",
        }),
      },
      { additionalProperties: false },
    ),
    Type.Object(
      {
        type: Type.Literal("run"),
        runId: Type.String({
          minLength: 1,
          maxLength: 128,
          description: "One of your READY fine-tuning runs: its validation file, or the pairs it held out.",
        }),
      },
      { additionalProperties: false },
    ),
    Type.Object(
      {
        type: Type.Literal("items"),
        items: Type.Array(EvalItem, { minItems: 1, maxItems: evalLimits.maxItems }),
      },
      { additionalProperties: false },
    ),
  ],
  { description: "The items: a dataset file, a run's held-out split, or items given here." },
);
export type EvalSourceWire = Static<typeof EvalSource>;

export const CreateEvalBody = Type.Object(
  {
    name: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 256,
        pattern: noControlCharacters,
        description: "Defaults to `eval`.",
      }),
    ),
    source: Type.Optional(EvalSource),
    graders: Type.Array(
      Type.Unsafe<GraderSpec>(
        Type.Object(
          {
            type: Type.String({
              description:
                "`exact_match`, `contains`, `regex`, `json_schema`, `similarity`, `multi`, `score_model` or `label_model`.",
            }),
          },
          { additionalProperties: true },
        ),
      ),
      {
        minItems: 1,
        maxItems: evalLimits.maxGraders,
        description:
          "How each answer is scored, each from 0 to 1: `exact_match` (`normalize`), `contains` (`value`, `normalize`), " +
          "`regex` (`pattern`, `flags`), `json_schema` (`schema`), `similarity` (`metric`, `passThreshold`), " +
          "`multi` (`graders`, `calculateOutput`, `passThreshold`), " +
          "`score_model` (`model`, `input`, `range`, `passThreshold`) and `label_model` (`model`, `input`, `labels`, " +
          "`passingLabels`), whose judge is a model. A bad " +
          "grader is a 400 naming its field (`graders[1].pattern`).",
      },
    ),
    systemPrompt: Type.Optional(
      Type.String({
        maxLength: 100_000,
        pattern: noNul,
        description: "Opens every prompt (a fine-tune's own system prompt wins for it). Defaults to none.",
      }),
    ),
  },
  { additionalProperties: false },
);
export type CreateEvalBodyWire = Static<typeof CreateEvalBody>;

export const CreateEvalRunBody = Type.Object(
  {
    models: Type.Array(Type.String({ minLength: 1, maxLength: 256 }), {
      minItems: 1,
      maxItems: evalLimits.maxModels,
      description: "Base model names, run ids or `ft:` names; each answers every item.",
    }),
    name: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: noControlCharacters })),
    source: Type.Optional(EvalSource),
    maxTokens: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: evalLimits.maxTokens,
        description: "Most tokens of each answer. Defaults to `128`.",
      }),
    ),
    parallel: Type.Optional(
      Type.Integer({
        minimum: 1,
        maximum: evalLimits.maxParallel,
        description:
          "Answers in flight at once, batched by the engine. Defaults to `CONDUIT_EVAL_PARALLEL` (8).",
      }),
    ),
  },
  { additionalProperties: false },
);
export type CreateEvalRunBodyWire = Static<typeof CreateEvalRunBody>;

/** A grader's totals over one model's answers. */
export interface GraderTotals {
  name: string;
  type: EvalGrader["type"];
  passed: number;
  failed: number;
  /** Mean score over the items answered. */
  meanScore: number;
}

/** One model's totals in an eval run. */
export interface ModelTotals {
  model: string;
  answered: number;
  errored: number;
  /** Answers that passed every grader. */
  passed: number;
  graders: GraderTotals[];
  promptTokens: number;
  completionTokens: number;
  /** Mean seconds per answer (each answer's own time, batched with others). */
  meanLatencySeconds: number;
  /** The tokens model graders' judges took to grade this model's answers, by judge. Absent: none. */
  judgeUsage?: JudgeUsage[];
}

/** Progress and totals of an eval run. */
export interface EvalRunProgress {
  /** Answers scored so far, over every model. */
  completed: number;
  /** Items × models. */
  total: number;
  /** The model being answered now. */
  model: string | null;
}

const Timestamp = Type.String({ description: "UTC time, `YYYY-MM-DD HH:MM:SS.mmm`" });
const Any = Type.Record(Type.String(), Type.Unknown());

export const Eval = Type.Object(
  {
    id: Type.String(),
    name: Type.String(),
    source: Type.Union([Any, Type.Null()], {
      description:
        "Where the items come from (inline items are counted, not repeated); null: each run names them.",
    }),
    itemCount: Type.Union([Type.Integer(), Type.Null()], {
      description: "Items given inline; null for a file or run.",
    }),
    graders: Type.Array(Any),
    systemPrompt: Type.String(),
    runId: Type.Union([Type.String(), Type.Null()], {
      description: "The fine-tuning run this eval was made for (the automatic before/after); null otherwise.",
    }),
    createdAt: Timestamp,
  },
  { description: "An eval: its graders and where its items come from." },
);
export type EvalWire = Static<typeof Eval>;

export const EvalRun = Type.Object(
  {
    id: Type.String(),
    evalId: Type.String(),
    name: Type.String(),
    models: Type.Array(Type.String()),
    status: Type.Union(evalRunStatuses.map((s) => Type.Literal(s))),
    progress: Type.Unsafe<EvalRunProgress>(Any),
    results: Type.Unsafe<ModelTotals[]>(
      Type.Array(Any, {
        description: "Per model: each grader's passed, failed and mean score; tokens; latency.",
      }),
    ),
    maxTokens: Type.Integer(),
    error: Type.Union([Type.String(), Type.Null()]),
    createdAt: Timestamp,
    updatedAt: Timestamp,
  },
  { description: "One scoring of one or more models on every item of an eval." },
);
export type EvalRunWire = Static<typeof EvalRun>;

/** One grader's score of one answer. */
export interface GraderScore {
  name: string;
  score: number;
  passed: boolean;
  /** Why the grader could not score the answer (it ran past its time limit): the score is then 0. */
  error?: string;
  /** A model grader's judge's answer, as it wrote it. */
  judgeAnswer?: string;
  /** A label model's label. */
  label?: string;
  /** A model grader's judge and the tokens its verdict took. */
  usage?: JudgeUsage;
}

/** A judge's tokens: of one verdict, or summed over a run's verdicts (`invocations` of them). */
export interface JudgeUsage {
  model: string;
  promptTokens: number;
  completionTokens: number;
  invocations?: number;
}

export const EvalResult = Type.Object(
  {
    model: Type.String(),
    item: Type.Integer({ description: "The item's index (0-based)." }),
    input: Type.String({ description: "The item's last user message." }),
    expected: Type.String(),
    answer: Type.String(),
    scores: Type.Unsafe<GraderScore[]>(Type.Array(Any)),
    latencySeconds: Type.Number(),
    promptTokens: Type.Integer(),
    completionTokens: Type.Integer(),
    error: Type.Union([Type.String(), Type.Null()]),
  },
  { description: "One model's answer to one item, with each grader's score." },
);
export type EvalResultWire = Static<typeof EvalResult>;

/** One model's side of a run's before/after. */
export interface EvaluationSide {
  model: string;
  items: number;
  /** Answers that matched exactly (whitespace normalised). */
  exact: number;
  /** Mean token-F1 similarity, 0 to 1. */
  similarity: number;
  /** The judge's mean score, 0 to 1, when the run has a `judgeModel`. */
  judge?: number;
}

/**
 * A fine-tuning run's automatic before/after (`run.evaluation`): its base model and the fine-tune on the run's
 * held-out pairs or validation file, greedy, exact match and similarity.
 */
export interface RunEvaluation {
  evalId: string;
  evalRunId: string;
  status: EvalRunStatus;
  base: EvaluationSide | null;
  fineTuned: EvaluationSide | null;
  /** Whether the fine-tune did better than its base: more exact matches, or as many and a higher similarity. Null until completed. */
  improved: boolean | null;
  /** `base 0/20 → fine-tune 20/20 exact (similarity 0.05 → 0.98)`, or what is happening. */
  summary: string;
}
