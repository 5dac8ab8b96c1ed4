/** Generation wire types of the OpenAI-compatible routes: their request bodies and chat result, with OpenAI's defaults. */
import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { Nullable, OrNull } from "../nullable.ts";
import { noControlCharacters, noNul, REASON } from "../patterns.ts";
import { COMPLETION_LOGPROBS, openAiName, ResponseFormat, Usage } from "./common.ts";
import { ConduitSampling } from "./conduit.ts";

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
export function NotYet(what: string, off?: { schema: TSchema; text: string }) {
  const only = off ? `; only ${off.text} is accepted` : "";
  const options = {
    description: `Not supported yet (${what})${only}.`,
    [REASON]: `is not supported yet${only}`,
  };
  return off ? Nullable(off.schema, options) : Type.Optional(Type.Null(options));
}

export const Nothing = Type.Array(Type.Unknown(), { maxItems: 0 });
export const Empty = Type.Object({}, { additionalProperties: false });
const NoneOrAuto = Type.Union([Type.Literal("none"), Type.Literal("auto")]);

/** At most this many choices per request: `n`, times the prompts of a completion. */
export const MAX_CHOICES = 8;

export const OpenAiSampling = {
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

export const FunctionName = Type.String({
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

export type OpenAiChatBodyWire = Static<typeof OpenAiChatBody>;
export type OpenAiCompletionBodyWire = Static<typeof OpenAiCompletionBody>;
