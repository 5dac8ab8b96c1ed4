import type { FastifyInstance, FastifyRequest } from "fastify";
import { Type } from "@sinclair/typebox";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import type { ChatMessage, SamplingOptions, ToolCall } from "../../engine/types.ts";
import { ConduitError } from "../../errors.ts";
import { chatLogprobs, respondWithGeneration, usageOf, type ResponseShape } from "../generate.ts";
import {
  CompletionResult,
  ModelEntry,
  ModelList,
  OpenAiChatBody,
  OpenAiChatResult,
  OpenAiCompletionBody,
  type OpenAiChatBodyWire,
  type OpenAiCompletionBodyWire,
} from "../../contract/generation.ts";
import { dropNulls } from "../nullable.ts";
import { jsonOrEvents, noControlCharacters, responses } from "../../contract/schemas.ts";
import { chatEvents, completionShape, responseFormat, conduitSampling } from "./generation.ts";

/**
 * OpenAI-compatible routes. They translate OpenAI requests into the same generation call as
 * the Conduit endpoints; only the shapes differ. Every OpenAI parameter is honoured or refused by
 * the body schemas (see `OpenAiChatBody`); `null` fields are dropped before validation, so the
 * handlers see them as absent. Without `max_tokens` a completion may use the room left in the
 * model's context (as OpenAI and vLLM do); the Conduit endpoints keep their default of 256.
 */
function openAiSampling(
  body: Parameters<typeof conduitSampling>[0] & { max_completion_tokens?: number | undefined },
): SamplingOptions {
  const maxTokens = body.max_completion_tokens ?? body.max_tokens;
  return {
    ...conduitSampling({
      ...body,
      max_tokens: maxTokens,
      // OpenAI seeds are any integer; the sampler takes 32 bits.
      seed: body.seed === undefined ? undefined : body.seed >>> 0,
    }),
    // As OpenAI: an explicit max_tokens that cannot fit after the prompt is a 400.
    ...(maxTokens !== undefined ? { maxTokensMustFit: true } : {}),
  };
}

/** OpenAI's end-user ids go to the request's log line, which is what they are for: tracing abuse. */
function logEndUser(request: FastifyRequest, body: { user?: string; safety_identifier?: string }): void {
  if (body.user !== undefined || body.safety_identifier !== undefined)
    request.log.info({ endUser: body.user, safetyIdentifier: body.safety_identifier }, "openai end user");
}

function openAiMessages(messages: OpenAiChatBodyWire["messages"]): ChatMessage[] {
  return messages.map((m) => ({
    role: m.role === "developer" ? "system" : m.role,
    content: typeof m.content === "string" ? m.content : (m.content ?? []).map((part) => part.text).join(""),
    ...(m.tool_calls && m.tool_calls.length > 0
      ? {
          toolCalls: m.tool_calls.map((c) => ({
            id: c.id,
            name: c.function.name,
            arguments: c.function.arguments,
          })),
        }
      : {}),
    ...(m.tool_call_id !== undefined ? { toolCallId: m.tool_call_id } : {}),
  }));
}

/** `tools` and `tool_choice` → the inference request's fields. */
function openAiTools(body: OpenAiChatBodyWire) {
  const choice = body.tool_choice;
  return {
    tools: body.tools?.map((t) => ({
      name: t.function.name,
      ...(t.function.description !== undefined ? { description: t.function.description } : {}),
      ...(t.function.parameters !== undefined ? { parameters: t.function.parameters } : {}),
    })),
    toolChoice: typeof choice === "object" ? { name: choice.function.name } : choice,
    parallelToolCalls: body.parallel_tool_calls,
  };
}

/** OpenAI's `tool_calls` of a message (or, with `index`, of a stream's delta). */
function wireToolCalls(calls: ToolCall[], streamed: boolean) {
  return calls.map((c, i) => ({
    ...(streamed ? { index: i } : {}),
    id: c.id,
    type: "function" as const,
    function: { name: c.name, arguments: c.arguments },
  }));
}

/** `logprobs: true` asks for log probabilities, `top_logprobs` for alternatives (only with `logprobs`). */
function chatLogprobCount(body: OpenAiChatBodyWire): number | undefined {
  if (body.top_logprobs !== undefined && body.top_logprobs > 0 && body.logprobs !== true)
    throw new ConduitError("invalid_request", 'field "top_logprobs" needs "logprobs": true', {
      param: "top_logprobs",
    });
  return body.logprobs === true ? (body.top_logprobs ?? 0) : undefined;
}

/** The prompts of a completion (the schema has checked `n` times them against `MAX_CHOICES`). */
function openAiPrompts(body: OpenAiCompletionBodyWire): string[] {
  return typeof body.prompt === "string" ? [body.prompt] : body.prompt;
}

const openAiChatShape = (includeUsage: boolean): ResponseShape => ({
  idPrefix: "chatcmpl",
  result: (base, result) => ({
    ...base,
    object: "chat.completion",
    choices: result.choices.map((c) => ({
      index: c.index,
      message: c.toolCalls
        ? {
            role: "assistant",
            content: c.text === "" ? null : c.text,
            tool_calls: wireToolCalls(c.toolCalls, false),
          }
        : { role: "assistant", content: c.text },
      logprobs: chatLogprobs(c.logprobs),
      finish_reason: c.finishReason,
    })),
    usage: usageOf(result),
  }),
  chunk: (base, index, text, finishReason, first, logprobs, toolCalls) => ({
    ...base,
    object: "chat.completion.chunk",
    choices: [
      {
        index,
        delta: {
          ...(first ? { role: "assistant" } : {}),
          ...(toolCalls ? { tool_calls: wireToolCalls(toolCalls, true) } : { content: text }),
        },
        logprobs: chatLogprobs(logprobs),
        finish_reason: finishReason,
      },
    ],
  }),
  streamUsage: includeUsage ? "separate" : "none",
});

export default async function openAiRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ["openai"];
  const generationErrors = [400, 401, 404, 409, 413, 415, 429, 503];
  const refused =
    "Every OpenAI parameter is honoured or refused: one Conduit does not implement yet is a `400` naming it " +
    "(`param`), unless it has the value that asks for nothing (`store: false`, `logit_bias: {}`). `null` means " +
    "the default wherever OpenAI accepts it. A field OpenAI does not have is a `400` too.";

  r.post(
    "/v1/chat/completions",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible chat completions",
        description:
          "The messages, formatted with the model's chat template. `response_format` `json_object` or `json_schema` " +
          `constrains the answer with a grammar while sampling. ${refused}`,
        body: OpenAiChatBody,
        response: responses({ 200: jsonOrEvents(OpenAiChatResult, chatEvents) }, generationErrors),
      },
      preValidation: dropNulls(OpenAiChatBody),
    },
    async (request, reply) => {
      const body = request.body;
      logEndUser(request, body);
      return respondWithGeneration(
        core,
        request,
        reply,
        {
          model: body.model,
          messages: openAiMessages(body.messages),
          sampling: openAiSampling(body),
          responseFormat: responseFormat(body.response_format),
          logprobs: chatLogprobCount(body),
          ...openAiTools(body),
          n: body.n,
        },
        { stream: body.stream, shape: openAiChatShape(body.stream_options?.include_usage === true) },
      );
    },
  );

  r.post(
    "/v1/completions",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible text completions (raw prompt, no chat template)",
        description: `One choice per prompt (\`n\` per prompt), \`index\` in order. ${refused}`,
        body: OpenAiCompletionBody,
        response: responses(
          {
            200: jsonOrEvents(
              CompletionResult,
              "Server-Sent Events: `data: {text_completion chunk}` lines, then `data: [DONE]`.",
            ),
          },
          generationErrors,
        ),
      },
      preValidation: dropNulls(OpenAiCompletionBody),
    },
    async (request, reply) => {
      const body = request.body;
      logEndUser(request, body);
      return respondWithGeneration(
        core,
        request,
        reply,
        {
          model: body.model,
          prompt: openAiPrompts(body),
          sampling: openAiSampling(body),
          logprobs: body.logprobs,
          n: body.n,
        },
        {
          stream: body.stream,
          shape: {
            ...completionShape(),
            streamUsage: body.stream_options?.include_usage === true ? "separate" : "none",
          },
        },
      );
    },
  );

  r.get(
    "/v1/models",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible model list: the models directory and your READY runs",
        response: responses({ 200: ModelList }, [401]),
      },
    },
    async (request) => ({ object: "list" as const, data: await core.inference.list(request.userId) }),
  );

  r.get(
    "/v1/models/:model",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible model: a base model, or one of your READY runs",
        description: "Another user's run answers `404`, like a model that does not exist.",
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
