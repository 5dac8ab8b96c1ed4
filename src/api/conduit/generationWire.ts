/**
 * The Conduit API's generation face, translated: its bodies (`/conduit/v1/chat`, `/conduit/v1/completions`,
 * a run's inference) into the engine's generation request, and results back into its shapes. Pure functions;
 * the routes only call them and `respondWithGeneration`.
 */
import type { ChatMessage, SamplingOptions } from "../../engine/types.ts";
import type { ChatBodyWire, CompletionsBodyWire } from "../../contract/generation.ts";
import {
  completionShape,
  responseFormat,
  usageOf,
  type GenerationInput,
  type ResponseShape,
} from "../generation/common.ts";

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

/** `POST /conduit/v1/chat`'s body → the generation request. */
export function fromChatBody(body: ChatBodyWire): GenerationInput {
  return {
    model: body.model,
    messages: chatMessages(body),
    sampling: conduitSampling(body),
    responseFormat: responseFormat(body.response_format),
  };
}

/** `POST /conduit/v1/completions`'s body → the generation request. */
export function fromCompletionsBody(body: CompletionsBodyWire): GenerationInput {
  return {
    model: body.model,
    messages: body.messages.map((m) => ({ role: m.role, content: m.content })),
    sampling: conduitSampling(body),
    logprobs: body.logprobs,
  };
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

/** The text completion of `/conduit/v1/completions` (`usage` on the last chunk). */
export function conduitCompletionShape(): ResponseShape {
  return completionShape("last-chunk");
}
