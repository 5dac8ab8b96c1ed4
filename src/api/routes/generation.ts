import type { FastifyInstance } from "fastify";
import { Type, type TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import type { ChatMessage, ResponseFormat, SamplingOptions } from "../../engine/types.ts";
import { completionLogprobs, respondWithGeneration, usageOf, type ResponseShape } from "../generate.ts";
import {
  ChatBody,
  ChatResult,
  CompletionResult,
  CompletionsBody,
  LoadedModelList,
  ModelEntry,
  ModelList,
  type ResponseFormatWire,
} from "../../contract/generation.ts";
import { jsonOrEvents, noControlCharacters, responses } from "../../contract/schemas.ts";
import { ConduitError } from "../../errors.ts";

/** What a streamed chat answers. */
export const chatEvents =
  "Server-Sent Events: `data: {chat.completion.chunk}` lines, then `data: [DONE]`; an error after the first " +
  'chunk is a final `data: {"error":{...}}`.';

/** The Conduit API's sampling fields → engine options. */
export function conduitSampling(body: {
  /** Absent: up to the room left in the context (the Conduit endpoints always have one, default 256). */
  max_tokens?: number | undefined;
  top_k: number;
  top_p: number;
  temperature: number;
  presence_penalty: number;
  frequency_penalty: number;
  stop?: string | string[] | undefined;
  seed?: number | undefined;
}): SamplingOptions {
  return {
    ...(body.max_tokens !== undefined ? { maxTokens: body.max_tokens } : {}),
    temperature: body.temperature,
    topK: body.top_k,
    topP: body.top_p,
    presencePenalty: body.presence_penalty,
    frequencyPenalty: body.frequency_penalty,
    ...(body.stop !== undefined ? { stop: typeof body.stop === "string" ? [body.stop] : body.stop } : {}),
    ...(body.seed !== undefined ? { seed: body.seed } : {}),
  };
}

/** `response_format` → the engine's grammar request; `text` (or none) is free text. */
export function responseFormat(wire: ResponseFormatWire | undefined): ResponseFormat | undefined {
  if (wire?.type === "json_object") return { kind: "json" };
  if (wire?.type === "json_schema") return { kind: "json_schema", schema: wire.json_schema.schema };
  return undefined;
}

/**
 * `system_prompt`, then `history` as alternating user/assistant turns, then `prompt` as the user's turn.
 * An odd `history` ends with a user turn that got no answer; `prompt` follows it (as in OpenAI's
 * `messages`, two user turns in a row are the chat template's to format, or to refuse).
 */
export function chatMessages(body: {
  prompt: string;
  system_prompt?: string | undefined;
  history?: string[] | undefined;
}): ChatMessage[] {
  const history = body.history ?? [];
  const messages: ChatMessage[] = [];
  if (body.system_prompt) messages.push({ role: "system", content: body.system_prompt });
  history.forEach((content, i) => messages.push({ role: i % 2 === 0 ? "user" : "assistant", content }));
  messages.push({ role: "user", content: body.prompt });
  return messages;
}

/** Native chat result: each choice has `role` and the text as both `content` and `text`. */
export const conduitChatShape: ResponseShape = {
  idPrefix: "chatcmpl",
  result: (base, result) => ({
    ...base,
    object: "chat.completion",
    choices: result.choices.map((c) => ({
      index: c.index,
      role: "assistant",
      content: c.text,
      text: c.text,
      finish_reason: c.finishReason,
    })),
    usage: usageOf(result),
  }),
  chunk: (base, index, text, finishReason, first) => ({
    ...base,
    object: "chat.completion.chunk",
    choices: [
      {
        index,
        delta: first ? { role: "assistant", content: text } : { content: text },
        finish_reason: finishReason,
      },
    ],
  }),
  streamUsage: "last-chunk",
};

/** A text completion; one per request, as a stream's chunks count each choice's text offsets. */
export function completionShape(): ResponseShape {
  const streamed = new Map<number, number>();
  return {
    idPrefix: "cmpl",
    result: (base, result) => ({
      ...base,
      object: "text_completion",
      choices: result.choices.map((c) => ({
        text: c.text,
        index: c.index,
        logprobs: completionLogprobs(c.logprobs),
        finish_reason: c.finishReason,
      })),
      usage: usageOf(result),
    }),
    chunk: (base, index, text, finishReason, _first, logprobs) => {
      const offset = streamed.get(index) ?? 0;
      if (logprobs) streamed.set(index, offset + logprobs.reduce((n, l) => n + l.token.length, 0));
      return {
        ...base,
        object: "text_completion",
        choices: [
          { text, index, logprobs: completionLogprobs(logprobs, offset), finish_reason: finishReason },
        ],
      };
    },
    streamUsage: "last-chunk",
  };
}

/** API document 4.1: generation. */
export default async function generationRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ["generation"];
  const errors = [400, 401, 404, 409, 413, 415, 429, 503];

  r.post(
    "/conduit/v1/chat",
    {
      schema: {
        tags,
        summary: "Chat with a model",
        description:
          "`system_prompt`, then `history` (alternating user, assistant, … oldest first), then `prompt` as the user's turn, " +
          "formatted with the model's chat template. `stream: true` answers with Server-Sent Events (`chat.completion.chunk`, then `data: [DONE]`). " +
          "`response_format` constrains the answer to JSON (a JSON object, or a value matching a JSON schema).",
        body: ChatBody,
        response: responses({ 200: jsonOrEvents(ChatResult, chatEvents) }, errors),
      },
    },
    async (request, reply) =>
      respondWithGeneration(
        core,
        request,
        reply,
        {
          model: request.body.model,
          messages: chatMessages(request.body),
          sampling: conduitSampling(request.body),
          responseFormat: responseFormat(request.body.response_format),
        },
        { stream: request.body.stream, shape: conduitChatShape },
      ),
  );

  r.post(
    "/conduit/v1/completions",
    {
      schema: {
        tags,
        summary: "Complete a conversation",
        description:
          "`messages` formatted with the model's chat template; the answer is a text completion. `stream: true` streams `text_completion` chunks.",
        body: CompletionsBody,
        response: responses(
          {
            200: jsonOrEvents(
              CompletionResult,
              "Server-Sent Events: `data: {text_completion chunk}` lines, then `data: [DONE]`.",
            ),
          },
          errors,
        ),
      },
    },
    async (request, reply) =>
      respondWithGeneration(
        core,
        request,
        reply,
        {
          model: request.body.model,
          messages: request.body.messages.map((m) => ({ role: m.role, content: m.content })),
          sampling: conduitSampling(request.body),
          logprobs: request.body.logprobs,
        },
        { stream: request.body.stream, shape: completionShape() },
      ),
  );

  r.get(
    "/conduit/v1/models",
    {
      schema: {
        tags,
        summary: "Models you can generate with: the models directory and your READY runs",
        response: responses({ 200: ModelList }, [401]),
      },
    },
    async (request) => ({ object: "list" as const, data: await core.inference.list(request.userId) }),
  );

  r.get(
    "/conduit/v1/models/loaded",
    {
      schema: {
        tags,
        summary: "Models loaded in memory now: base models and your own fine-tunes",
        description:
          "Like `ps`: each model the engine holds, its memory, what runs on it and how long it has been idle. " +
          "Other users' fine-tunes are never shown. Idle models are unloaded, least recently used first, when " +
          "loading another would pass `CONDUIT_MODEL_MEMORY_BUDGET`.",
        response: responses({ 200: LoadedModelList }, [401]),
      },
    },
    async (request) => ({
      object: "list" as const,
      data: await core.inference.loaded(request.userId),
    }),
  );

  r.get(
    "/conduit/v1/models/:model",
    {
      schema: {
        tags,
        summary: "One model you can generate with: a base model, or one of your READY runs",
        description:
          "What `GET /conduit/v1/models` lists for it, with the chat template its chats are rendered with " +
          "(`chat_template`). Another user's run answers `404`, like a model that does not exist.",
        params: Type.Object({
          model: Type.String({ minLength: 1, maxLength: 256, pattern: noControlCharacters }),
        }),
        response: responses({ 200: ModelEntry }, [400, 401, 404]),
      },
    },
    async (request) => {
      const model = await core.inference.get(request.userId, request.params.model);
      if (!model)
        throw new ConduitError("model_not_found", `model "${request.params.model}" not found`, {
          param: "model",
        });
      return model;
    },
  );
}
