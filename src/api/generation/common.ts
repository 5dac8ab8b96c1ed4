/**
 * What both API faces' generation translators share: the shape of a face's answers (`ResponseShape`), usage,
 * log probabilities in OpenAI's two forms, and the text completion (the same on both faces). Pure functions.
 */
import type { Static } from "@sinclair/typebox";
import type { ResponseFormat, TokenLogprob, ToolCall } from "../../engine/types.ts";
import type { ModelEntry, ResponseFormatWire } from "../../contract/generation/common.ts";
import type { ServableModel } from "../../inference/InferenceService.ts";
import type { InferenceChoice, InferenceRequest, InferenceResult } from "../../inference/InferenceService.ts";

/** A generation as a face asks for it: the inference request less what the HTTP side adds (abort, streaming). */
export type GenerationInput = Omit<InferenceRequest, "signal" | "onText">;

/** What a result or chunk starts with: its id, its creation time (Unix seconds), the model named. */
export interface ResponseBase {
  id: string;
  created: number;
  model: string;
}

/** How one endpoint shapes results and stream chunks; the generation itself is shared. */
export interface ResponseShape {
  idPrefix: string;
  result(base: ResponseBase, result: InferenceResult): unknown;
  chunk(
    base: ResponseBase,
    index: number,
    text: string,
    finishReason: FinishReason | null,
    first: boolean,
    /** The log probabilities of this chunk's tokens, when the request asked for them. */
    logprobs?: TokenLogprob[],
    /** The choice's tool calls (chat with tools: they come whole, in one chunk). */
    toolCalls?: ToolCall[],
  ): Record<string, unknown>;
  /** `usage` goes on the last chunk (native) or in its own chunk (OpenAI `include_usage`), or nowhere. */
  streamUsage: "last-chunk" | "separate" | "none";
}

/** Why a choice ended. */
export type FinishReason = InferenceChoice["finishReason"];

/** UTF-8 bytes of a token's text; `null` when the token ends inside a character (its text shows U+FFFD). */
function bytesOf(token: string): number[] | null {
  return token.includes("\uFFFD") ? null : [...Buffer.from(token, "utf8")];
}

/** OpenAI's chat `logprobs`: `{content: [{token, logprob, bytes, top_logprobs}], refusal: null}`. */
export function chatLogprobs(logprobs: TokenLogprob[] | undefined) {
  if (logprobs === undefined) return null;
  return {
    content: logprobs.map((l) => ({
      token: l.token,
      logprob: l.logprob,
      bytes: bytesOf(l.token),
      top_logprobs: l.top.map((t) => ({ token: t.token, logprob: t.logprob, bytes: bytesOf(t.token) })),
    })),
    refusal: null,
  };
}

/**
 * OpenAI's completions `logprobs`: parallel lists of the tokens, their log probabilities, their top
 * alternatives (text → log probability; the first of two tokens with the same text wins) and each token's
 * offset in the choice's text (the lengths of the tokens before it, from `offset`: those of earlier chunks).
 */
export function completionLogprobs(logprobs: TokenLogprob[] | undefined, offset = 0) {
  if (logprobs === undefined) return null;
  const textOffset: number[] = [];
  let at = offset;
  for (const l of logprobs) {
    textOffset.push(at);
    at += l.token.length;
  }
  return {
    tokens: logprobs.map((l) => l.token),
    token_logprobs: logprobs.map((l) => l.logprob),
    top_logprobs: logprobs.map((l) => {
      const top = new Map<string, number>();
      for (const t of l.top) if (!top.has(t.token)) top.set(t.token, t.logprob);
      return Object.fromEntries(top);
    }),
    text_offset: textOffset,
  };
}

export function usageOf(result: InferenceResult) {
  return {
    prompt_tokens: result.promptTokens,
    completion_tokens: result.completionTokens,
    total_tokens: result.promptTokens + result.completionTokens,
    // As OpenAI reports prompt caching: the prompt tokens that were not evaluated again.
    prompt_tokens_details: { cached_tokens: result.cachedTokens },
  };
}

/** A text completion; one per request, as a stream's chunks count each choice's text offsets. */
export function completionShape(streamUsage: ResponseShape["streamUsage"] = "last-chunk"): ResponseShape {
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
    streamUsage,
  };
}

/** What a streamed chat answers. */
export const chatEvents =
  "Server-Sent Events: `data: {chat.completion.chunk}` lines, then `data: [DONE]`; an error after the first " +
  'chunk is a final `data: {"error":{...}}`.';

/** `response_format` → the engine's grammar request; `text` (or none) is free text. */
export function responseFormat(wire: ResponseFormatWire | undefined): ResponseFormat | undefined {
  if (wire?.type === "json_object") return { kind: "json" };
  if (wire?.type === "json_schema") return { kind: "json_schema", schema: wire.json_schema.schema };
  return undefined;
}

/** A model of the models lists as both faces send it (OpenAI's model object, Conduit's fields beside it). */
export function toModelWire(model: ServableModel): Static<typeof ModelEntry> {
  return {
    id: model.id,
    object: "model",
    created: model.created,
    owned_by: model.owner ?? "conduit",
    kind: model.kind,
    context_length: model.contextLength,
    size_bytes: model.sizeBytes,
    quantization: model.quantization,
    base_model: model.baseModel,
    chat_template: model.chatTemplate,
  };
}
