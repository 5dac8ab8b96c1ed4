import { randomBytes } from "node:crypto";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { Type } from "@sinclair/typebox";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import { respondWithGeneration } from "../generation/respond.ts";
import {
  fromResponsesRequest,
  responseSettings,
  ResponseEvents,
  toResponse,
  toResponsesError,
  type ResponseEvent,
} from "./responsesWire.ts";
import {
  fromChatRequest,
  fromCompletionRequest,
  openAiChatShape,
  openAiCompletionShape,
} from "./generationWire.ts";
import { fromEmbeddingsBody, toEmbeddingList } from "../generation/embeddings.ts";
import { disconnectSignal, openSse, type SseStream } from "../sse.ts";
import { chatEvents, toModelWire, type GenerationInput } from "../generation/common.ts";
import {
  CompletionResult,
  EmbeddingList,
  ModelEntry,
  ModelList,
  OpenAiChatBody,
  OpenAiChatResult,
  OpenAiCompletionBody,
  OpenAiResponse,
  OpenAiResponsesBody,
  responsesEvents,
  type OpenAiResponsesBodyWire,
  OpenAiEmbeddingsBody,
} from "../../contract/generation.ts";
import { dropNulls } from "../nullable.ts";
import { noControlCharacters } from "../../contract/patterns.ts";
import { jsonOrEvents, responses } from "../../contract/schemas.ts";

/** OpenAI's end-user ids go to the request's log line, which is what they are for: tracing abuse. */
function logEndUser(request: FastifyRequest, body: { user?: string; safety_identifier?: string }): void {
  if (body.user !== undefined || body.safety_identifier !== undefined)
    request.log.info({ endUser: body.user, safetyIdentifier: body.safety_identifier }, "openai end user");
}

/**
 * OpenAI-compatible routes. They translate OpenAI requests into the same generation call as the Conduit
 * endpoints (`generationWire.ts`); only the shapes differ. Every OpenAI parameter is honoured or refused
 * by the body schemas (see `OpenAiChatBody`); `null` fields are dropped before validation, so the handlers see
 * them as absent.
 */
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
      return respondWithGeneration(core, request, reply, fromChatRequest(body), {
        stream: body.stream,
        shape: openAiChatShape(body.stream_options?.include_usage === true),
      });
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
      return respondWithGeneration(core, request, reply, fromCompletionRequest(body), {
        stream: body.stream,
        shape: openAiCompletionShape(body.stream_options?.include_usage === true),
      });
    },
  );

  r.post(
    "/v1/responses",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible responses (stateless)",
        description:
          "The Responses API without stored state: `input` is the whole conversation (text, messages, function " +
          "calls and their outputs), formatted with the model's chat template after `instructions`. " +
          "`previous_response_id`, `conversation` and `store: true` are a `400` naming the field. `text.format` " +
          `constrains the answer with a grammar; function \`tools\` come back as \`function_call\` items. ${refused}`,
        body: OpenAiResponsesBody,
        response: responses({ 200: jsonOrEvents(OpenAiResponse, responsesEvents) }, generationErrors),
      },
      preValidation: dropNulls(OpenAiResponsesBody),
    },
    async (request, reply) => {
      // The type provider reads `tools`' one-branch union (kept for its error message) as `unknown[]`.
      const body = request.body as OpenAiResponsesBodyWire;
      logEndUser(request, body);
      return respondWithResponseEvents(core, request, reply, fromResponsesRequest(body), {
        stream: body.stream,
        settings: responseSettings(body),
      });
    },
  );

  r.post(
    "/v1/embeddings",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible embeddings",
        description:
          "One vector per input, from any model you can chat with: a base model, or one of your READY runs (a " +
          "LoRA fine-tune with its adapter applied). A model without pooling (a chat model) gives its last token's " +
          `hidden state. Inputs are evaluated one after another on the model's embedding context. ${refused}`,
        body: OpenAiEmbeddingsBody,
        response: responses({ 200: EmbeddingList }, generationErrors),
      },
      preValidation: dropNulls(OpenAiEmbeddingsBody),
    },
    async (request, reply) => {
      const body = request.body;
      logEndUser(request, body);
      const { signal } = disconnectSignal(reply);
      const result = await core.inference.embed(request.userId, { ...fromEmbeddingsBody(body), signal });
      return toEmbeddingList(body.model ?? result.model, result, body.encoding_format);
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
    async (request) => ({
      object: "list" as const,
      data: (await core.inference.list(request.userId)).map(toModelWire),
    }),
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
    async (request) => toModelWire(await core.inference.get(request.userId, request.params.model)),
  );
}

/**
 * Runs a generation for `POST /v1/responses`: the response object, or its typed events when `stream` is set.
 * As `respondWithGeneration`, the stream opens with the first text (or the end), so errors before it keep their
 * HTTP status; with tools the answer comes whole at its end.
 */
async function respondWithResponseEvents(
  core: Core,
  request: FastifyRequest,
  reply: FastifyReply,
  input: GenerationInput,
  options: { stream: boolean; settings: ReturnType<typeof responseSettings> },
): Promise<unknown> {
  const controller = disconnectSignal(reply);
  try {
    const model = await core.inference.resolve(request.userId, input.model, "model");
    const head = {
      id: `resp_${randomBytes(12).toString("hex")}`,
      created_at: Math.floor(Date.now() / 1000),
      model: input.model ?? model.id,
    };
    if (!options.stream) {
      const result = await core.inference.generate(
        request.userId,
        { ...input, signal: controller.signal },
        model,
      );
      return toResponse(head, options.settings, result);
    }
    const events = new ResponseEvents(head, options.settings);
    let sse: SseStream | undefined;
    // The stream opens with `response.created`, before the events of what opened it.
    const send = (make: () => ResponseEvent[]) => {
      if (!sse) {
        sse = openSse(request, reply, controller);
        for (const event of events.start()) sse.send(event.data, event.type);
      }
      for (const event of make()) sse.send(event.data, event.type);
    };
    const whole = (input.tools?.length ?? 0) > 0 && input.toolChoice !== "none";
    try {
      const result = await core.inference.generate(
        request.userId,
        {
          ...input,
          signal: controller.signal,
          ...(whole ? {} : { onText: (_index: number, text: string) => send(() => events.text(text)) }),
        },
        model,
      );
      send(() => events.finish(result));
      sse?.close();
    } catch (error) {
      if (!sse) throw error;
      if (controller.signal.aborted) sse.close();
      else sse.fail(toResponsesError(error));
    }
    return reply;
  } catch (error) {
    throw toResponsesError(error);
  }
}
