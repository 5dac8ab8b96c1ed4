import type { FastifyInstance } from "fastify";
import { Type, type TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import { respondWithGeneration } from "../generation/respond.ts";
import {
  conduitChatShape,
  conduitCompletionShape,
  fromChatBody,
  fromCompletionsBody,
} from "./generationWire.ts";
import {
  ChatBody,
  ChatResult,
  CompletionResult,
  CompletionsBody,
  EmbeddingList,
  EmbeddingsBody,
  LoadedModelList,
  ModelEntry,
  ModelList,
} from "../../contract/generation.ts";
import { noControlCharacters } from "../../contract/patterns.ts";
import { jsonOrEvents, responses } from "../../contract/schemas.ts";
import { fromEmbeddingsBody, toEmbeddingList } from "../generation/embeddings.ts";
import { disconnectSignal } from "../sse.ts";
import { chatEvents, toModelWire } from "../generation/common.ts";

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
      respondWithGeneration(core, request, reply, fromChatBody(request.body), {
        stream: request.body.stream,
        shape: conduitChatShape,
      }),
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
      respondWithGeneration(core, request, reply, fromCompletionsBody(request.body), {
        stream: request.body.stream,
        shape: conduitCompletionShape(),
      }),
  );

  r.post(
    "/conduit/v1/embeddings",
    {
      schema: {
        tags,
        summary: "Embed texts with a model",
        description:
          "`POST /v1/embeddings` with the Conduit API's conventions, as `/conduit/v1/chat` is to chat completions: " +
          "`model` defaults to `CONDUIT_DEFAULT_MODEL` and other fields are ignored. One vector per input, from a " +
          "base model or one of your READY runs (a LoRA fine-tune with its adapter applied).",
        body: EmbeddingsBody,
        response: responses({ 200: EmbeddingList }, errors),
      },
    },
    async (request, reply) => {
      const { signal } = disconnectSignal(reply);
      const body = request.body;
      const result = await core.inference.embed(request.userId, { ...fromEmbeddingsBody(body), signal });
      return toEmbeddingList(body.model ?? result.model, result, body.encoding_format);
    },
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
    async (request) => ({
      object: "list" as const,
      data: (await core.inference.list(request.userId)).map(toModelWire),
    }),
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
    async (request) => toModelWire(await core.inference.get(request.userId, request.params.model)),
  );
}
