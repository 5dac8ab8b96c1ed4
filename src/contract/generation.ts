import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { Nullable, OrNull } from "./nullable.ts";
import { samplingDefaults } from "./sampling.ts";
import { noControlCharacters, noNul, REASON } from "./schemas.ts";

/** Wire types of generation: the Conduit API's chat and completions, and the OpenAI-compatible routes. */

/** Sampling parameters with the Conduit API's defaults. */
export const ConduitSampling = {
  max_tokens: Type.Integer({
    minimum: 1,
    default: samplingDefaults.max_tokens,
    description:
      "Most tokens to generate, a cap: generation also ends (`length`) when the model's context is full. Defaults to `256`.",
  }),
  top_k: Type.Integer({
    minimum: 0,
    default: samplingDefaults.top_k,
    description: "Sample from the k most likely tokens (0: all). Defaults to `50`.",
  }),
  top_p: Type.Number({
    exclusiveMinimum: 0,
    maximum: 1,
    default: samplingDefaults.top_p,
    description: "Nucleus sampling, in (0, 1]. Defaults to `0.9`.",
  }),
  temperature: Type.Number({
    minimum: 0,
    maximum: 2,
    default: samplingDefaults.temperature,
    description: "0 is greedy. Defaults to `1.0`.",
  }),
  presence_penalty: Type.Number({
    minimum: -2,
    maximum: 2,
    default: samplingDefaults.presence_penalty,
    description: "Defaults to `1.0`.",
  }),
  frequency_penalty: Type.Number({
    minimum: -2,
    maximum: 2,
    default: samplingDefaults.frequency_penalty,
    description: "Defaults to `1.0`.",
  }),
  stream: Type.Boolean({
    default: false,
    description: "Server-Sent Events in OpenAI's chunk format. Defaults to `false`.",
  }),
  model: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 256,
      pattern: noControlCharacters,
      description: "A model id or a READY run id. Defaults to `CONDUIT_DEFAULT_MODEL`.",
    }),
  ),
  stop: Type.Optional(
    Type.Union(
      [
        Type.String({ minLength: 1, pattern: noNul }),
        Type.Array(Type.String({ minLength: 1, pattern: noNul }), { maxItems: 4 }),
      ],
      {
        description: "Stop sequences (not included in the output).",
      },
    ),
  ),
  seed: Type.Optional(
    Type.Integer({ minimum: 0, maximum: 4294967295, description: "Sampling seed, for reproducible output." }),
  ),
};

/**
 * `response_format`, OpenAI's shape: `text` (free text, the default), `json_object` (any JSON object) or
 * `json_schema` (a value matching `json_schema.schema`), enforced by a grammar while sampling.
 */
/** The names OpenAI takes for a function or a response format: letters, digits, `_` and `-`, at most 64. */
const openAiName = "^[a-zA-Z0-9_-]{1,64}$";

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

const Role = Type.Union([Type.Literal("system"), Type.Literal("user"), Type.Literal("assistant")], {
  description: "`system`, `user` or `assistant`",
});

export const ChatMessage = Type.Object(
  { role: Role, content: Type.String({ pattern: noNul }) },
  { additionalProperties: true },
);

export const ChatBody = Type.Object(
  {
    prompt: Type.String({ minLength: 1, pattern: noNul, description: "The user's message." }),
    system_prompt: Type.Optional(
      Type.String({ pattern: noNul, description: "System prompt. Defaults to none." }),
    ),
    history: Type.Optional(
      Type.Array(Type.String({ pattern: noNul }), {
        description:
          "Earlier turns, alternating user then assistant, oldest first. An odd number ends with a user turn " +
          "that got no answer; `prompt` follows it as another user turn.",
      }),
    ),
    response_format: Type.Optional(ResponseFormat),
    ...ConduitSampling,
  },
  { additionalProperties: true },
);

/** `logprobs` of a text completion, OpenAI's legacy form. */
const COMPLETION_LOGPROBS =
  "Each answer token's log probability (`choices[].logprobs`: `tokens`, `token_logprobs`, `top_logprobs` with " +
  "this many most likely tokens at each position, `text_offset`), streamed with its chunk. They are the model's " +
  "own distribution, the log-softmax of its raw logits before penalties, temperature, top-k/top-p and grammar. " +
  "Tokens of a stop sequence are left out. Defaults to none.";

export const CompletionsBody = Type.Object(
  {
    messages: Type.Array(ChatMessage, { minItems: 1, description: "The conversation so far." }),
    logprobs: Type.Optional(Type.Integer({ minimum: 0, maximum: 5, description: COMPLETION_LOGPROBS })),
    ...ConduitSampling,
  },
  { additionalProperties: true },
);

/** `POST /conduit/finetuning/{id}/inference`: the chat fields, plus the Conduit API's run fields (accepted, ignored). */
export const RunInferenceBody = Type.Object(
  {
    prompt: Type.String({ minLength: 1, pattern: noNul }),
    system_prompt: Type.Optional(
      Type.String({ pattern: noNul, description: "Defaults to the run's `systemPrompt`." }),
    ),
    history: ChatBody.properties.history,
    response_format: ChatBody.properties.response_format,
    ...ConduitSampling,
  },
  { additionalProperties: true },
);

const Usage = Type.Object({
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
const FinishReason = Type.Union([Type.Literal("stop"), Type.Literal("length")]);

export const ChatResult = Type.Object(
  {
    id: Type.String(),
    object: Type.Literal("chat.completion"),
    created: Type.Integer(),
    model: Type.String(),
    choices: Type.Array(
      Type.Object({
        index: Type.Integer(),
        role: Type.Literal("assistant"),
        content: Type.String(),
        text: Type.String({ description: "Same as `content` (the API names it both ways)." }),
        finish_reason: FinishReason,
      }),
    ),
    usage: Usage,
  },
  { $id: "ChatResult" },
);

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

const TokenBytes = Type.Union([Type.Array(Type.Integer({ minimum: 0, maximum: 255 })), Type.Null()], {
  description:
    "The token's UTF-8 bytes; `null` for a token that ends inside a character (its text shows U+FFFD).",
});

/** `logprobs` of a chat completion choice (or chunk), OpenAI's form. */
export const ChatLogprobs = Type.Object(
  {
    content: Type.Array(
      Type.Object(
        {
          token: Type.String(),
          logprob: Type.Number(),
          bytes: TokenBytes,
          top_logprobs: Type.Array(
            Type.Object(
              { token: Type.String(), logprob: Type.Number(), bytes: TokenBytes },
              { additionalProperties: false },
            ),
            {
              description:
                "The most likely tokens at this position (`top_logprobs` of them), most likely first.",
            },
          ),
        },
        { additionalProperties: false },
      ),
    ),
    refusal: Type.Null(),
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

/**
 * `POST /v1/chat/completions`: OpenAI's chat completion object. Open to further fields (OpenAI adds
 * some over time), so the serializer passes them through.
 */
export const OpenAiChatResult = Type.Object(
  {
    id: Type.String(),
    object: Type.Literal("chat.completion"),
    created: Type.Integer(),
    model: Type.String(),
    choices: Type.Array(
      Type.Object(
        {
          index: Type.Integer(),
          message: Type.Object(
            {
              role: Type.Literal("assistant"),
              content: Type.Union([Type.String(), Type.Null()], {
                description: "The answer's text; `null` when it is only tool calls.",
              }),
              tool_calls: Type.Optional(
                Type.Array(
                  Type.Object(
                    {
                      id: Type.String(),
                      type: Type.Literal("function"),
                      function: Type.Object(
                        {
                          name: Type.String(),
                          arguments: Type.String({ description: "The arguments object as JSON text." }),
                        },
                        { additionalProperties: false },
                      ),
                    },
                    { additionalProperties: false },
                  ),
                  { description: "The functions the answer calls (with `tools`)." },
                ),
              ),
            },
            { additionalProperties: true },
          ),
          logprobs: Type.Union([ChatLogprobs, Type.Null()], {
            description: "`null` unless the request asks for `logprobs`.",
          }),
          finish_reason: Type.Union([
            Type.Literal("stop"),
            Type.Literal("length"),
            Type.Literal("tool_calls"),
          ]),
        },
        { additionalProperties: true },
      ),
    ),
    usage: Usage,
  },
  { $id: "OpenAiChatResult", additionalProperties: true },
);

const Nullish = <T extends TSchema>(schema: T, description: string) =>
  Type.Union([schema, Type.Null()], { description });

/** A model you can name: OpenAI's model object, plus what Conduit knows about the model. */
export const ModelEntry = Type.Object({
  id: Type.String({ description: "What to pass as `model`." }),
  object: Type.Literal("model"),
  created: Type.Integer({ description: "Unix seconds: the file's time, or when the run became READY." }),
  owned_by: Type.String({ description: "`conduit` for base models, your user id for your runs." }),
  kind: Type.Union([Type.Literal("base"), Type.Literal("fine-tuned")], {
    description: "`base`: a model in the models directory; `fine-tuned`: one of your READY runs.",
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

/**
 * OpenAI's request bodies, with OpenAI's defaults (penalties 0, `top_p` 1). Every field OpenAI
 * documents is here: honoured, or refused with a 400 that names it (`NotYet`). `null` means the
 * default wherever OpenAI accepts it (`Nullable`, `dropNulls`); a field OpenAI does not have is a 400.
 */

/**
 * A field Conduit does not implement yet. It takes only `off`, the value that asks for nothing
 * (`logprobs: false`, `tools: []`), or nothing but `null` when there is no such value; anything
 * else is a 400 naming the field, saying it is not supported yet.
 */
function NotYet(what: string, off?: { schema: TSchema; text: string }) {
  const only = off ? `; only ${off.text} is accepted` : "";
  const options = {
    description: `Not supported yet (${what})${only}.`,
    [REASON]: `is not supported yet${only}`,
  };
  return off ? Nullable(off.schema, options) : Type.Optional(Type.Null(options));
}

const Nothing = Type.Array(Type.Unknown(), { maxItems: 0 });
const Empty = Type.Object({}, { additionalProperties: false });
const NoneOrAuto = Type.Union([Type.Literal("none"), Type.Literal("auto")]);

/** At most this many choices per request: `n`, times the prompts of a completion. */
export const MAX_CHOICES = 8;

const OpenAiSampling = {
  model: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 256,
      pattern: noControlCharacters,
      description: "A model id or a READY run id. Defaults to `CONDUIT_DEFAULT_MODEL`.",
    }),
  ),
  max_tokens: Nullable(Type.Integer({ minimum: 1 }), {
    description:
      "Most tokens to generate; with the prompt, they must fit the model's context (else a `400` naming " +
      "`max_tokens`). Absent or `null`: up to the room left in the context.",
  }),
  temperature: OrNull(Type.Number({ minimum: 0, maximum: 2 }), {
    default: 1,
    description: "0 is greedy. Defaults to `1`.",
  }),
  top_p: OrNull(Type.Number({ exclusiveMinimum: 0, maximum: 1 }), {
    default: 1,
    description: "Nucleus sampling, in (0, 1]. Defaults to `1`.",
  }),
  top_k: OrNull(Type.Integer({ minimum: 0 }), {
    default: 0,
    description: "Conduit's own: sample from the k most likely tokens (0: all). Defaults to `0`.",
  }),
  presence_penalty: OrNull(Type.Number({ minimum: -2, maximum: 2 }), {
    default: 0,
    description: "Defaults to `0`.",
  }),
  frequency_penalty: OrNull(Type.Number({ minimum: -2, maximum: 2 }), {
    default: 0,
    description: "Defaults to `0`.",
  }),
  n: OrNull(Type.Integer({ minimum: 1, maximum: MAX_CHOICES }), {
    default: 1,
    description: `Choices to generate (for each prompt of a completion; ${MAX_CHOICES} in all at most). Defaults to \`1\`.`,
  }),
  stop: Nullable(ConduitSampling.stop),
  seed: Nullable(Type.Integer(), {
    description: "Sampling seed, any integer (the sampler takes its low 32 bits), for reproducible output.",
  }),
  stream: OrNull(Type.Boolean(), {
    default: false,
    description: "Server-Sent Events in OpenAI's chunk format. Defaults to `false`.",
  }),
  stream_options: Nullable(
    Type.Object(
      {
        include_usage: Nullable(Type.Boolean(), {
          description: "A last chunk with `usage` and no choices. Defaults to `false`.",
        }),
        include_obfuscation: NotYet("stream obfuscation", { schema: Type.Literal(false), text: "false" }),
      },
      { additionalProperties: false },
    ),
  ),
  logit_bias: NotYet("token biases", { schema: Empty, text: "{}" }),
  user: Nullable(Type.String(), { description: "Your end user's id; written to the request's log line." }),
};

const OpenAiTextPart = Type.Object(
  {
    type: Type.Literal("text"),
    text: Type.String({ pattern: noNul }),
    prompt_cache_breakpoint: NotYet("prompt caching"),
  },
  { additionalProperties: false },
);

const FunctionName = Type.String({
  pattern: openAiName,
  description: "Letters, digits, `_` and `-`, at most 64.",
});

/** A function call an assistant made, as OpenAI writes it: `arguments` is JSON text. */
const OpenAiToolCall = Type.Object(
  {
    id: Type.String({ minLength: 1, maxLength: 256, pattern: noControlCharacters }),
    type: Type.Literal("function"),
    function: Type.Object(
      { name: FunctionName, arguments: Type.String({ pattern: noNul }) },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false },
);

const OpenAiTool = Type.Object(
  {
    type: Type.Literal("function"),
    function: Type.Object(
      {
        name: FunctionName,
        description: Nullable(Type.String({ pattern: noNul })),
        parameters: Nullable(Type.Record(Type.String(), Type.Unknown()), {
          description:
            "A JSON Schema of the arguments object. A call forced by `tool_choice` follows it when the grammar " +
            "can express it (the keywords `response_format` takes), else its arguments are any JSON object.",
        }),
        strict: Nullable(Type.Boolean(), { description: "Accepted; see `parameters`." }),
      },
      { additionalProperties: false },
    ),
  },
  { additionalProperties: false },
);

const OpenAiMessage = Type.Object(
  {
    role: Type.Union(
      [
        Type.Literal("system"),
        Type.Literal("developer"),
        Type.Literal("user"),
        Type.Literal("assistant"),
        Type.Literal("tool"),
      ],
      {
        description: "`developer` is a system message; `tool` answers a call (`tool_call_id`).",
        [REASON]:
          'must be "system", "developer", "user", "assistant" or "tool"; function messages are not supported yet',
      },
    ),
    content: Nullable(Type.Union([Type.String({ pattern: noNul }), Type.Array(OpenAiTextPart)]), {
      description: "A string, or text parts (joined). Absent or `null` (an assistant turn): empty.",
      [REASON]:
        "must be a string or an array of text parts; image, audio, file and refusal parts are not supported yet",
    }),
    name: NotYet("participant names"),
    tool_calls: Nullable(Type.Array(OpenAiToolCall, { maxItems: 128 }), {
      description: "The functions an assistant turn called (a model whose template supports tools).",
    }),
    tool_call_id: Nullable(Type.String({ maxLength: 256, pattern: noControlCharacters }), {
      description: "The call a `tool` message answers.",
    }),
    function_call: NotYet("function calling"),
    refusal: NotYet("refusals"),
    audio: NotYet("audio"),
  },
  { additionalProperties: false },
);

export const OpenAiChatBody = Type.Object(
  {
    messages: Type.Array(OpenAiMessage, { minItems: 1 }),
    ...OpenAiSampling,
    max_completion_tokens: Nullable(Type.Integer({ minimum: 1 }), {
      description: "Same as `max_tokens`; wins over it.",
    }),
    safety_identifier: Nullable(Type.String(), {
      description: "Your end user's id; written to the request's log line.",
    }),
    logprobs: OrNull(Type.Boolean(), {
      default: false,
      description:
        "`true`: each answer token's log probability in `choices[].logprobs.content` (streamed with its chunk). " +
        "They are the model's own distribution, the log-softmax of its raw logits before penalties, temperature, " +
        "top-k/top-p and grammar: with sampling on, a chosen token need not be the most likely. Tokens of a stop " +
        "sequence are left out. Defaults to `false`.",
    }),
    top_logprobs: Nullable(Type.Integer({ minimum: 0, maximum: 20 }), {
      description: "With `logprobs: true`: this many most likely tokens at each position, most likely first.",
    }),
    response_format: Nullable(ResponseFormat),
    tools: Nullable(Type.Array(OpenAiTool, { maxItems: 128 }), {
      description:
        "Functions the model may call, rendered by the model's chat template; a model whose template has no tool " +
        "support is a `400` naming `tools`. Calls in the answer (`<tool_call>{…}</tool_call>` as Hermes, Qwen and " +
        "SmolLM3 write them, Mistral's list, or a Llama 3.x JSON call) come back as `message.tool_calls` with " +
        '`finish_reason: "tool_calls"`; streamed, such an answer comes whole once it is complete.',
    }),
    tool_choice: Nullable(
      Type.Union([
        Type.Literal("none"),
        Type.Literal("auto"),
        Type.Literal("required"),
        Type.Object(
          {
            type: Type.Literal("function"),
            function: Type.Object({ name: FunctionName }, { additionalProperties: false }),
          },
          { additionalProperties: false },
        ),
      ]),
      {
        description:
          '`"auto"` (the default): the model may call; `"none"`: the tools are shown but calls are not parsed; ' +
          '`"required"` or `{"type": "function", "function": {"name": …}}`: the model makes exactly one call, ' +
          "enforced by a grammar.",
        [REASON]: 'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
      },
    ),
    parallel_tool_calls: Nullable(Type.Boolean(), {
      description: "`false`: at most one call per answer (the first). Defaults to `true`.",
    }),
    functions: NotYet("function calling", { schema: Nothing, text: "[]" }),
    function_call: NotYet("function calling", {
      schema: NoneOrAuto,
      text: '"none" or "auto" (no functions to call)',
    }),
    audio: NotYet("audio output"),
    modalities: NotYet("audio output", { schema: Type.Array(Type.Literal("text")), text: '["text"]' }),
    prediction: NotYet("predicted outputs"),
    web_search_options: NotYet("web search"),
    reasoning_effort: NotYet("reasoning effort"),
    verbosity: NotYet("verbosity"),
    store: NotYet("stored completions", { schema: Type.Literal(false), text: "false" }),
    metadata: NotYet("stored completions", { schema: Empty, text: "{}" }),
    service_tier: NotYet("service tiers", {
      schema: Type.Union([Type.Literal("auto"), Type.Literal("default")]),
      text: '"auto" or "default"',
    }),
    prompt_cache_key: Nullable(Type.String({ maxLength: 1024 }), {
      description:
        "Accepted and unused: Conduit's prefix cache is automatic (a request reuses the longest prompt prefix " +
        "found in a sequence's KV cache; `usage.prompt_tokens_details.cached_tokens` counts it).",
    }),
    prompt_cache_retention: NotYet("choosing how long prompts stay cached"),
    prompt_cache_options: NotYet("prompt cache options"),
    moderation: NotYet("moderation"),
  },
  {
    additionalProperties: false,
    // For readers of the document (and fuzzers): a forced call needs tools to choose from. The route checks it
    // itself, with a 400 naming `tool_choice` (Ajv's draft-07 mode leaves `dependentSchemas` alone).
    dependentSchemas: {
      tool_choice: {
        if: { properties: { tool_choice: { anyOf: [{ const: "required" }, { type: "object" }] } } },
        then: { required: ["tools"], properties: { tools: { type: "array", minItems: 1 } } },
      },
    },
  },
);

export const OpenAiCompletionBody = Type.Object(
  {
    prompt: OrNull(
      Type.Union([
        Type.String({ pattern: noNul }),
        Type.Array(Type.String({ pattern: noNul }), { minItems: 1, maxItems: MAX_CHOICES }),
      ]),
      {
        default: "",
        description: `A raw prompt (no chat template), or up to ${MAX_CHOICES} of them: each gets \`n\` choices, numbered in order. Absent or \`null\`: empty.`,
        [REASON]: `must be a string or an array of 1 to ${MAX_CHOICES} strings; token-id prompts are not supported yet`,
      },
    ),
    ...OpenAiSampling,
    best_of: NotYet("best_of", { schema: Type.Literal(1), text: "1" }),
    echo: NotYet("echo", { schema: Type.Literal(false), text: "false" }),
    logprobs: Nullable(Type.Integer({ minimum: 0, maximum: 5 }), {
      description: COMPLETION_LOGPROBS,
    }),
    suffix: NotYet("insertion", { schema: Type.Literal(""), text: '""' }),
  },
  { additionalProperties: false, allOf: choiceRules() },
);

/**
 * `n` times the prompts is at most {@link MAX_CHOICES}, as JSON Schema can say it: the more prompts, the lower
 * `n`'s maximum (2 prompts: 4, 3 or 4 prompts: 2, 5 or more: 1).
 */
function choiceRules() {
  const rules: object[] = [];
  for (let prompts = 2, last = MAX_CHOICES; prompts <= MAX_CHOICES; prompts++) {
    const most = Math.floor(MAX_CHOICES / prompts);
    if (most < last)
      rules.push({
        if: { required: ["prompt"], properties: { prompt: { type: "array", minItems: prompts } } },
        then: {
          properties: {
            n: {
              maximum: most,
              [REASON]: `is at most ${most} for ${prompts} or more prompts: n times the prompts is at most ${MAX_CHOICES} choices`,
            },
          },
        },
      });
    last = most;
  }
  return rules;
}

export type ResponseFormatWire = Static<typeof ResponseFormat>;
export type ChatBodyWire = Static<typeof ChatBody>;
export type CompletionsBodyWire = Static<typeof CompletionsBody>;
export type OpenAiChatBodyWire = Static<typeof OpenAiChatBody>;
export type OpenAiCompletionBodyWire = Static<typeof OpenAiCompletionBody>;

/** A model held in memory now, as `GET /conduit/v1/models/loaded` shows it. */
export const LoadedModelEntry = Type.Object({
  id: Type.String({ description: "The model's id: a base model, or one of your runs." }),
  kind: Type.Union([Type.Literal("base"), Type.Literal("fine-tuned")]),
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
