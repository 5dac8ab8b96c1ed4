/** Generation wire types of the Conduit API: its chat, completions and run inference bodies, with its defaults. */
import { Type, type Static } from "@sinclair/typebox";
import { samplingDefaults } from "../sampling.ts";
import { noControlCharacters, noNul } from "../patterns.ts";
import { COMPLETION_LOGPROBS, FinishReason, ResponseFormat, Usage } from "./common.ts";

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

export type ChatBodyWire = Static<typeof ChatBody>;
export type CompletionsBodyWire = Static<typeof CompletionsBody>;
