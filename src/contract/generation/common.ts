/** Generation wire types both API faces use: `response_format`, usage, log probabilities, text completions, models. */
import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { Nullable } from "../nullable.ts";
import { REASON } from "../patterns.ts";

/**
 * `response_format`, OpenAI's shape: `text` (free text, the default), `json_object` (any JSON object) or
 * `json_schema` (a value matching `json_schema.schema`), enforced by a grammar while sampling.
 */
/** The names OpenAI takes for a function or a response format: letters, digits, `_` and `-`, at most 64. */
export const openAiName = "^[a-zA-Z0-9_-]{1,64}$";

export const ResponseFormat = Type.Union(
  [
    Type.Object({ type: Type.Literal("text") }, { additionalProperties: false }),
    Type.Object({ type: Type.Literal("json_object") }, { additionalProperties: false }),
    Type.Object(
      {
        type: Type.Literal("json_schema"),
        json_schema: Type.Object(
          {
            name: Type.String({
              pattern: openAiName,
              description: "The format's name: letters, digits, `_` and `-`, at most 64. Not used.",
            }),
            description: Nullable(Type.String(), { description: "Not used." }),
            schema: Type.Record(Type.String(), Type.Unknown(), {
              description:
                "The JSON Schema the answer must match: `type`, `const`, `enum`, `oneOf`/`anyOf`, `$ref` into `$defs`, " +
                "`properties` (all written, as in OpenAI's strict mode), `additionalProperties`, `items`, " +
                "`prefixItems`, `minItems`/`maxItems`, `minLength`/`maxLength`, `minProperties`/`maxProperties`, " +
                "and `format` `date-time`, `date` or `time`. Any other keyword (`pattern`, `minimum`, …) is a `400`, and so " +
                "is a schema over the grammar's size bounds (`enum` values, alternatives, subschemas, nesting; see " +
                "`GrammarSchema`).",
            }),
            strict: Nullable(Type.Boolean(), {
              description: "Accepted; the schema is always enforced exactly.",
            }),
          },
          { additionalProperties: false },
        ),
      },
      { additionalProperties: false },
    ),
  ],
  {
    description:
      '`{"type": "text"}` (free text, the default), `{"type": "json_object"}` (a JSON object) or ' +
      '`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` (a value matching `schema`), ' +
      "enforced by a grammar while sampling. The answer can still be cut short by `max_tokens` (`finish_reason: " +
      '"length"`) and is then not valid JSON.',
    [REASON]:
      'must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}',
  },
);

/** `logprobs` of a text completion, OpenAI's legacy form. */
export const COMPLETION_LOGPROBS =
  "Each answer token's log probability (`choices[].logprobs`: `tokens`, `token_logprobs`, `top_logprobs` with " +
  "this many most likely tokens at each position, `text_offset`), streamed with its chunk. They are the model's " +
  "own distribution, the log-softmax of its raw logits before penalties, temperature, top-k/top-p and grammar. " +
  "Tokens of a stop sequence are left out. Defaults to none.";

export const Usage = Type.Object({
  prompt_tokens: Type.Integer(),
  completion_tokens: Type.Integer(),
  total_tokens: Type.Integer(),
  prompt_tokens_details: Type.Object({
    cached_tokens: Type.Integer({
      description:
        "Prompt tokens found in the KV cache (a prefix shared with an earlier request on the same model, such as " +
        "the earlier turns of a chat or a system prompt) and not evaluated again.",
    }),
  }),
});
export const FinishReason = Type.Union([Type.Literal("stop"), Type.Literal("length")]);

/** `logprobs` of a text completion choice (or chunk), OpenAI's legacy form. */
export const CompletionLogprobs = Type.Object(
  {
    tokens: Type.Array(Type.String(), { description: "The answer's tokens, as text." }),
    token_logprobs: Type.Array(Type.Number(), { description: "Each token's log probability." }),
    top_logprobs: Type.Array(Type.Record(Type.String(), Type.Number()), {
      description:
        "At each position, the most likely tokens (as many as `logprobs` asked): text → log probability.",
    }),
    text_offset: Type.Array(Type.Integer(), {
      description: "Where each token starts in `text`: the lengths of the tokens before it.",
    }),
  },
  { additionalProperties: false },
);

export const CompletionResult = Type.Object(
  {
    id: Type.String(),
    object: Type.Literal("text_completion"),
    created: Type.Integer(),
    model: Type.String(),
    choices: Type.Array(
      Type.Object({
        text: Type.String(),
        index: Type.Integer(),
        logprobs: Type.Union([CompletionLogprobs, Type.Null()], {
          description: "`null` unless the request asks for `logprobs`.",
        }),
        finish_reason: FinishReason,
      }),
    ),
    usage: Usage,
  },
  { $id: "CompletionResult" },
);

export const Nullish = <T extends TSchema>(schema: T, description: string) =>
  Type.Union([schema, Type.Null()], { description });

/** A model you can name: OpenAI's model object, plus what Conduit knows about the model. */
export const ModelEntry = Type.Object({
  id: Type.String({ description: "What to pass as `model`." }),
  object: Type.Literal("model"),
  created: Type.Integer({ description: "Unix seconds: the file's time, or when the run became READY." }),
  owned_by: Type.String({ description: "`conduit` for base models, your user id for your runs." }),
  kind: Type.Union([Type.Literal("base"), Type.Literal("fine-tuned"), Type.Literal("adapter")], {
    description:
      "`base`: a model in the models directory; `fine-tuned`: one of your READY runs; `adapter`: a LoRA adapter " +
      "you imported (`POST /conduit/models/adapters`).",
  }),
  context_length: Nullish(
    Type.Integer(),
    "Tokens of the model's training context, from its GGUF header (a LoRA fine-tune: its base's); `null` when unknown.",
  ),
  size_bytes: Nullish(
    Type.Integer(),
    "Bytes of the model's own file (a LoRA fine-tune: its adapter's); `null` when the file is not on this server.",
  ),
  quantization: Nullish(
    Type.String(),
    "The weights' file type as llama.cpp names it (`F32`, `F16`, `Q8_0`, `Q4_K_M`, …; a LoRA fine-tune: its base's); `null` when unknown.",
  ),
  base_model: Nullish(Type.String(), "The model a fine-tune was trained from; `null` for a base model."),
  chat_template: Nullish(
    Type.Object({
      source: Type.Union([Type.Literal("embedded"), Type.Literal("architecture"), Type.Literal("fallback")], {
        description:
          "`embedded`: the model's own `tokenizer.chat_template`; `architecture`: none is embedded, so its family's " +
          "format (from `general.architecture`, `general.name`/`basename` and the turn tokens in its vocabulary); " +
          "`fallback`: no family is known, so ChatML written as plain text, an assistant turn ending with the EOS token.",
      }),
      name: Type.String({
        description:
          "The format: `gemma`, `llama3`, `phi3`, `chatml`, `mistral`, or `custom` for an embedded one.",
      }),
    }),
    "The chat template chats with this model are rendered with, and its fine-tunes trained with (a LoRA fine-tune: its base's); `null` when the file cannot be read.",
  ),
});

export const ModelList = Type.Object({ object: Type.Literal("list"), data: Type.Array(ModelEntry) });

/** A model held in memory now, as `GET /conduit/v1/models/loaded` shows it. */
export const LoadedModelEntry = Type.Object({
  id: Type.String({ description: "The model's id: a base model, or one of your runs." }),
  kind: Type.Union([Type.Literal("base"), Type.Literal("fine-tuned"), Type.Literal("adapter")]),
  base_model: Nullish(Type.String(), "The base model a fine-tune runs on; `null` for a base model."),
  memory_bytes: Type.Integer({
    description:
      "Bytes of model file this entry holds in memory: the weights of a base model or a full fine-tune, the adapter of a LoRA fine-tune (which shares its base model's weights).",
  }),
  context_size: Type.Integer({ description: "Tokens each of its sequences holds (prompt and completion)." }),
  active_generations: Type.Integer({ description: "Generations running on it now." }),
  queued_requests: Type.Integer({ description: "Requests waiting for one of its sequences." }),
  last_used: Type.Integer({ description: "Unix seconds of its last use." }),
  idle_seconds: Type.Integer({ description: "Seconds since its last use; `0` while it generates." }),
});

export const LoadedModelList = Type.Object({
  object: Type.Literal("list"),
  data: Type.Array(LoadedModelEntry),
});

export type ResponseFormatWire = Static<typeof ResponseFormat>;
