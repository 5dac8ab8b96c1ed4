import { randomBytes } from "node:crypto";
import type { FastifyReply, FastifyRequest } from "fastify";
import type { ModelRef, TokenLogprob } from "../../engine/types.ts";
import type { Core } from "../../core.ts";
import { disconnectSignal, openSse, type SseStream } from "../sse.ts";
import { usageOf, type FinishReason, type GenerationInput, type ResponseShape } from "./common.ts";

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
  input: GenerationInput,
  options: { stream: boolean; shape: ResponseShape; model?: ModelRef },
): Promise<unknown> {
  const controller = disconnectSignal(reply);
  const model = options.model ?? (await core.inference.resolve(request.userId, input.model, "model"));
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
