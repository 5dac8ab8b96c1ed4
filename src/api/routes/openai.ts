import type { FastifyInstance } from "fastify";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import type { ChatMessage, SamplingOptions } from "../../engine/types.ts";
import { respondWithGeneration, usageOf, type ResponseShape } from "../generate.ts";
import { OpenAiChatBody, OpenAiCompletionBody, type OpenAiChatBodyWire } from "../generationSchemas.ts";
import { completionShape, seedSampling } from "./generation.ts";

/**
 * OpenAI-compatible routes. They translate OpenAI requests into the same generation call as
 * the seed's endpoints; only the shapes differ. Without `max_tokens` a completion stops at 256
 * tokens, like the seed's default.
 */
function openAiSampling(
  body: Omit<Parameters<typeof seedSampling>[0], "max_tokens"> & {
    max_tokens?: number | undefined;
    max_completion_tokens?: number | undefined;
  },
): SamplingOptions {
  return seedSampling({
    ...body,
    max_tokens: body.max_completion_tokens ?? body.max_tokens ?? 256,
    // OpenAI seeds are any integer; the sampler takes 32 bits.
    seed: body.seed === undefined ? undefined : body.seed >>> 0,
  });
}

function openAiMessages(messages: OpenAiChatBodyWire["messages"]): ChatMessage[] {
  return messages.map((m) => ({
    role: m.role === "developer" ? "system" : m.role,
    content: typeof m.content === "string" ? m.content : (m.content ?? []).map((part) => part.text).join(""),
  }));
}

const openAiChatShape = (includeUsage: boolean): ResponseShape => ({
  idPrefix: "chatcmpl",
  result: (base, result) => ({
    ...base,
    object: "chat.completion",
    choices: result.choices.map((c) => ({
      index: c.index,
      message: { role: "assistant", content: c.text },
      logprobs: null,
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
        logprobs: null,
        finish_reason: finishReason,
      },
    ],
  }),
  streamUsage: includeUsage ? "separate" : "none",
});

export default async function openAiRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const tags = ["openai"];

  r.post(
    "/v1/chat/completions",
    { schema: { tags, summary: "OpenAI-compatible chat completions", body: OpenAiChatBody } },
    async (request, reply) => {
      const body = request.body;
      return respondWithGeneration(
        core,
        request,
        reply,
        {
          model: body.model,
          messages: openAiMessages(body.messages),
          sampling: openAiSampling(body),
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
        body: OpenAiCompletionBody,
      },
    },
    async (request, reply) => {
      const body = request.body;
      const prompt = typeof body.prompt === "string" ? body.prompt : (body.prompt[0] ?? "");
      return respondWithGeneration(
        core,
        request,
        reply,
        { model: body.model, prompt, sampling: openAiSampling(body), n: body.n },
        {
          stream: body.stream,
          shape: {
            ...completionShape,
            streamUsage: body.stream_options?.include_usage === true ? "separate" : "none",
          },
        },
      );
    },
  );

  r.get("/v1/models", { schema: { tags, summary: "OpenAI-compatible model list" } }, async (request) => ({
    object: "list" as const,
    data: (await core.inference.list(request.userId)).map(({ id, object, created, owned_by }) => ({
      id,
      object,
      created,
      owned_by,
    })),
  }));
}
