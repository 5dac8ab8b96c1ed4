import { randomBytes } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { TokenLogprob, ToolCall } from "../engine/types.ts";
import type { InferenceChoice, InferenceRequest, InferenceResult } from "../inference/InferenceService.ts";
import type { ModelRef } from "../engine/types.ts";
import type { Core } from "../core.ts";
import { disconnectSignal, openSse, type SseStream } from "./sse.ts";

/** How one endpoint shapes results and stream chunks; the generation itself is shared. */
export interface ResponseShape {
  idPrefix: string;
  result(base: { id: string; created: number; model: string }, result: InferenceResult): unknown;
  chunk(
    base: { id: string; created: number; model: string },
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

type FinishReason = InferenceChoice["finishReason"];

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

/**
 * Runs a generation for any endpoint: JSON, or Server-Sent Events when `stream` is set. The
 * stream opens with the first text, so errors before it (unknown model, full queue) keep their
 * HTTP status; after it, an error is a final `data: {"error":...}` event. A client that goes
 * away aborts the generation at once.
 */
export async function respondWithGeneration(
  core: Core,
  request: FastifyRequest,
  reply: FastifyReply,
  input: Omit<InferenceRequest, "signal" | "onText">,
  options: { stream: boolean; shape: ResponseShape; model?: ModelRef },
): Promise<unknown> {
  const controller = disconnectSignal(reply);
  const model = options.model ?? (await core.inference.resolve(request.userId, input.model));
  const base = {
    id: `${options.shape.idPrefix}-${randomBytes(12).toString("base64url")}`,
    created: Math.floor(Date.now() / 1000),
    // The name asked for (an `ft:` name stays one), else what served it.
    model: options.model ? model.id : (input.model ?? model.id),
  };
  if (!options.stream)
    return options.shape.result(
      base,
      await core.inference.generate(request.userId, { ...input, signal: controller.signal }, model),
    );

  let sse: SseStream | undefined;
  const started = new Set<number>();
  const emit = (
    index: number,
    text: string,
    finishReason: FinishReason | null,
    logprobs?: TokenLogprob[],
  ) => {
    sse ??= openSse(request, reply, controller);
    const first = !started.has(index);
    started.add(index);
    sse.send(options.shape.chunk(base, index, text, finishReason, first, logprobs));
  };
  // With tools, an answer is only known to be a call (or text) once it is complete: each choice is then
  // streamed in one piece, its text and its calls.
  const whole = (input.tools?.length ?? 0) > 0 && input.toolChoice !== "none";
  try {
    const result = await core.inference.generate(
      request.userId,
      {
        ...input,
        signal: controller.signal,
        ...(whole ? {} : { onText: (index, text, logprobs) => emit(index, text, null, logprobs) }),
      },
      model,
    );
    if (whole)
      for (const choice of result.choices) {
        if (choice.text !== "" || choice.logprobs) emit(choice.index, choice.text, null, choice.logprobs);
        if (choice.toolCalls) {
          sse ??= openSse(request, reply, controller);
          const first = !started.has(choice.index);
          started.add(choice.index);
          sse.send(options.shape.chunk(base, choice.index, "", null, first, undefined, choice.toolCalls));
        }
      }
    const last = result.choices.length - 1;
    for (const choice of result.choices) {
      sse ??= openSse(request, reply, controller);
      const chunk = options.shape.chunk(
        base,
        choice.index,
        "",
        choice.finishReason,
        !started.has(choice.index),
      );
      if (options.shape.streamUsage === "last-chunk" && choice.index === last) chunk.usage = usageOf(result);
      sse.send(chunk);
    }
    if (options.shape.streamUsage === "separate")
      sse?.send({ ...options.shape.chunk(base, 0, "", null, false), choices: [], usage: usageOf(result) });
    sse?.done();
  } catch (error) {
    if (!sse) throw error;
    if (controller.signal.aborted) sse.close();
    else sse.fail(error);
  }
  return reply;
}
