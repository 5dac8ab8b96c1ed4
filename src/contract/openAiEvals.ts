import { Type, type Static } from "@sinclair/typebox";
import { noControlCharacters } from "./patterns.ts";

/**
 * OpenAI's Evals API as Conduit speaks it (`/v1/evals`, `/v1/evals/{id}/runs`, output items). Bodies are checked
 * field by field by the translator (`src/api/openAiEvals.ts`), which names the field of a 400; the schemas here hold
 * the outer shape and document it.
 */

const Id = Type.String({ minLength: 1, maxLength: 128, pattern: noControlCharacters });
const Any = Type.Record(Type.String(), Type.Unknown());
const Metadata = Type.Union([Type.Record(Type.String(), Type.String({ maxLength: 512 })), Type.Null()], {
  description: "Up to 16 string pairs, returned as given.",
});

export const OpenAiEvalParams = Type.Object({ eval_id: Id });
export const OpenAiEvalRunParams = Type.Object({ eval_id: Id, run_id: Id });
export const OpenAiOutputItemParams = Type.Object({ eval_id: Id, run_id: Id, output_item_id: Id });

export const OpenAiEvalCreateBody = Type.Object(
  {
    name: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: noControlCharacters })),
    data_source_config: Type.Object(
      { type: Type.String() },
      {
        additionalProperties: true,
        description:
          "`{type: custom, item_schema, include_sample_schema}`; `logs` and `stored_completions` are refused.",
      },
    ),
    testing_criteria: Type.Array(Type.Object({ type: Type.String() }, { additionalProperties: true }), {
      minItems: 1,
      maxItems: 16,
      description:
        "`string_check` (`input` `{{sample.output_text}}`, `reference` `{{item.<field>}}` or text, `operation` `eq`, " +
        "`like` or `ilike`) and `text_similarity` (`evaluation_metric` `fuzzy_match` or `token_f1`, `pass_threshold`).",
    }),
    metadata: Type.Optional(Metadata),
  },
  { additionalProperties: false },
);
export type OpenAiEvalCreateBodyWire = Static<typeof OpenAiEvalCreateBody>;

export const OpenAiEvalUpdateBody = Type.Object(
  {
    name: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: noControlCharacters })),
    metadata: Type.Optional(Metadata),
  },
  { additionalProperties: false },
);

export const OpenAiEval = Type.Object({
  object: Type.Literal("eval"),
  id: Type.String(),
  name: Type.String(),
  created_at: Type.Integer(),
  data_source_config: Any,
  testing_criteria: Type.Array(Any),
  metadata: Type.Union([Any, Type.Null()]),
});

export const OpenAiEvalRunCreateBody = Type.Object(
  {
    name: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: noControlCharacters })),
    data_source: Type.Object(
      { type: Type.String() },
      {
        additionalProperties: true,
        description:
          "`{type: completions, model, source: {type: file_content, content: [{item}]} | {type: file_id, id}, " +
          "input_messages?: {type: template, template: [{role, content}]}, sampling_params?: {max_completion_tokens}}`. " +
          "Answers are always greedy.",
      },
    ),
    metadata: Type.Optional(Metadata),
  },
  { additionalProperties: false },
);
export type OpenAiEvalRunCreateBodyWire = Static<typeof OpenAiEvalRunCreateBody>;

export const OpenAiEvalRun = Type.Object({
  object: Type.Literal("eval.run"),
  id: Type.String(),
  eval_id: Type.String(),
  name: Type.String(),
  model: Type.String(),
  status: Type.String({ description: "`queued`, `in_progress`, `completed`, `failed` or `canceled`." }),
  created_at: Type.Integer(),
  data_source: Any,
  error: Type.Union([Any, Type.Null()]),
  metadata: Type.Union([Any, Type.Null()]),
  result_counts: Type.Object({
    total: Type.Integer(),
    errored: Type.Integer(),
    failed: Type.Integer(),
    passed: Type.Integer(),
  }),
  per_model_usage: Type.Array(Any),
  per_testing_criteria_results: Type.Array(Any),
  report_url: Type.String(),
});

export const OpenAiOutputItem = Type.Object({
  object: Type.Literal("eval.run.output_item"),
  id: Type.String(),
  run_id: Type.String(),
  eval_id: Type.String(),
  created_at: Type.Integer(),
  status: Type.String({ description: "`pass`, `fail` or `error`." }),
  datasource_item_id: Type.Integer(),
  datasource_item: Any,
  results: Type.Array(Any),
  sample: Any,
});

export const OpenAiEvalListQuery = Type.Object({
  after: Type.Optional(Id),
  limit: Type.Integer({ minimum: 1, maximum: 100, default: 20, description: "Defaults to `20`." }),
  order: Type.Union([Type.Literal("asc"), Type.Literal("desc")], {
    default: "asc",
    description: "Defaults to `asc`.",
  }),
  order_by: Type.Optional(Type.Union([Type.Literal("created_at"), Type.Literal("updated_at")])),
  status: Type.Optional(Type.String({ maxLength: 32 })),
});

export function listOf<T extends ReturnType<typeof Type.Object>>(item: T) {
  return Type.Object({
    object: Type.Literal("list"),
    data: Type.Array(item),
    first_id: Type.Union([Type.String(), Type.Null()]),
    last_id: Type.Union([Type.String(), Type.Null()]),
    has_more: Type.Boolean(),
  });
}
