import { Type, type Static } from "@sinclair/typebox";
import { noControlCharacters } from "./schemas.ts";

/** Wire types of generation: the seed's chat and completions, and the OpenAI-compatible routes. */

/** Sampling parameters with the seed's defaults (seed part 8). */
export const SeedSampling = {
  max_tokens: Type.Integer({
    minimum: 1,
    default: 256,
    description:
      "Most tokens to generate, a cap: generation also ends (`length`) when the model's context is full. Defaults to `256`.",
  }),
  top_k: Type.Integer({
    minimum: 0,
    default: 50,
    description: "Sample from the k most likely tokens (0: all). Defaults to `50`.",
  }),
  top_p: Type.Number({
    exclusiveMinimum: 0,
    maximum: 1,
    default: 0.9,
    description: "Nucleus sampling, in (0, 1]. Defaults to `0.9`.",
  }),
  temperature: Type.Number({
    minimum: 0,
    maximum: 2,
    default: 1.0,
    description: "0 is greedy. Defaults to `1.0`.",
  }),
  presence_penalty: Type.Number({ minimum: -2, maximum: 2, default: 1.0, description: "Defaults to `1.0`." }),
  frequency_penalty: Type.Number({
    minimum: -2,
    maximum: 2,
    default: 1.0,
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
    Type.Union([Type.String({ minLength: 1 }), Type.Array(Type.String({ minLength: 1 }), { maxItems: 4 })], {
      description: "Stop sequences (not included in the output).",
    }),
  ),
  seed: Type.Optional(
    Type.Integer({ minimum: 0, maximum: 4294967295, description: "Sampling seed, for reproducible output." }),
  ),
};

const Role = Type.Union([Type.Literal("system"), Type.Literal("user"), Type.Literal("assistant")], {
  description: "`system`, `user` or `assistant`",
});

export const ChatMessage = Type.Object(
  { role: Role, content: Type.String() },
  { additionalProperties: true },
);

export const ChatBody = Type.Object(
  {
    prompt: Type.String({ minLength: 1, description: "The user's message." }),
    system_prompt: Type.Optional(Type.String({ description: "System prompt. Defaults to none." })),
    history: Type.Optional(
      Type.Array(Type.String(), {
        description:
          "Earlier turns, alternating user then assistant, oldest first (so an even number of entries).",
      }),
    ),
    ...SeedSampling,
  },
  { additionalProperties: true },
);

export const CompletionsBody = Type.Object(
  {
    messages: Type.Array(ChatMessage, { minItems: 1, description: "The conversation so far." }),
    ...SeedSampling,
  },
  { additionalProperties: true },
);

/** `POST /conduit/finetuning/{id}/inference`: the chat fields, plus the seed's run fields (accepted, ignored). */
export const RunInferenceBody = Type.Object(
  {
    prompt: Type.String({ minLength: 1 }),
    system_prompt: Type.Optional(Type.String({ description: "Defaults to the run's `systemPrompt`." })),
    history: ChatBody.properties.history,
    ...SeedSampling,
  },
  { additionalProperties: true },
);

const Usage = Type.Object({
  prompt_tokens: Type.Integer(),
  completion_tokens: Type.Integer(),
  total_tokens: Type.Integer(),
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
        text: Type.String({ description: "Same as `content` (the seed names it both ways)." }),
        finish_reason: FinishReason,
      }),
    ),
    usage: Usage,
  },
  { $id: "ChatResult" },
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
        logprobs: Type.Null(),
        finish_reason: FinishReason,
      }),
    ),
    usage: Usage,
  },
  { $id: "CompletionResult" },
);

/** OpenAI's request bodies: their defaults (penalties 0, top_p 1), extra fields ignored. */
const OpenAiSampling = {
  model: Type.Optional(Type.String({ minLength: 1, maxLength: 256, pattern: noControlCharacters })),
  max_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
  max_completion_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
  temperature: Type.Number({ minimum: 0, maximum: 2, default: 1 }),
  top_p: Type.Number({ exclusiveMinimum: 0, maximum: 1, default: 1 }),
  top_k: Type.Integer({ minimum: 0, default: 0 }),
  presence_penalty: Type.Number({ minimum: -2, maximum: 2, default: 0 }),
  frequency_penalty: Type.Number({ minimum: -2, maximum: 2, default: 0 }),
  n: Type.Integer({ minimum: 1, maximum: 8, default: 1 }),
  stop: SeedSampling.stop,
  seed: Type.Optional(Type.Integer()),
  stream: Type.Boolean({ default: false }),
  stream_options: Type.Optional(
    Type.Union([
      Type.Null(),
      Type.Object({ include_usage: Type.Optional(Type.Boolean()) }, { additionalProperties: true }),
    ]),
  ),
};

const OpenAiContentPart = Type.Object(
  { type: Type.Literal("text"), text: Type.String() },
  { additionalProperties: true },
);

export const OpenAiChatBody = Type.Object(
  {
    messages: Type.Array(
      Type.Object(
        {
          role: Type.Union([
            Type.Literal("system"),
            Type.Literal("developer"),
            Type.Literal("user"),
            Type.Literal("assistant"),
          ]),
          content: Type.Union([Type.String(), Type.Array(OpenAiContentPart), Type.Null()]),
        },
        { additionalProperties: true },
      ),
      { minItems: 1 },
    ),
    ...OpenAiSampling,
  },
  { additionalProperties: true },
);

export const OpenAiCompletionBody = Type.Object(
  {
    prompt: Type.Union([Type.String(), Type.Array(Type.String(), { minItems: 1, maxItems: 1 })]),
    ...OpenAiSampling,
  },
  { additionalProperties: true },
);

export type ChatBodyWire = Static<typeof ChatBody>;
export type CompletionsBodyWire = Static<typeof CompletionsBody>;
export type OpenAiChatBodyWire = Static<typeof OpenAiChatBody>;
export type OpenAiCompletionBodyWire = Static<typeof OpenAiCompletionBody>;
