import type { FastifyReply, FastifyRequest } from "fastify";
import { ConduitError } from "../errors.ts";
import { errorBody, toConduitError } from "./errorHandler.ts";

/** An open Server-Sent Events response. */
export interface SseStream {
  /** Aborts when the client goes away; pass it to the work that feeds the stream. */
  signal: AbortSignal;
  /** Writes one `data:` event (JSON), optionally named. */
  send(data: unknown, event?: string): void;
  /** Writes `data: [DONE]` (OpenAI's end marker) and closes. */
  done(): void;
  /** Writes a final `data: {"error":{...}}` event and closes; internal errors stay in the log. */
  fail(error: unknown): void;
  close(): void;
}

/**
 * An AbortSignal that fires when the client goes away before the response is complete, so
 * generation stops at once and frees its slot.
 */
export function disconnectSignal(reply: FastifyReply): AbortController {
  const controller = new AbortController();
  const raw = reply.raw;
  const onClose = () => {
    if (!raw.writableFinished) controller.abort(new ConduitError("invalid_request", "client disconnected"));
  };
  raw.on("close", onClose);
  return controller;
}

/**
 * The one streaming helper. Takes over the raw response, so headers set here are final. Pass
 * the controller of `disconnectSignal` when work started before the stream was opened.
 */
export function openSse(
  request: FastifyRequest,
  reply: FastifyReply,
  controller: AbortController = disconnectSignal(reply),
): SseStream {
  reply.hijack();
  const raw = reply.raw;
  raw.writeHead(200, {
    "content-type": "text/event-stream; charset=utf-8",
    "cache-control": "no-cache, no-transform",
    connection: "keep-alive",
    "x-accel-buffering": "no",
    "x-request-id": request.id,
  });
  raw.flushHeaders();
  let ended = false;
  const write = (text: string) => {
    if (!ended && !raw.destroyed) raw.write(text);
  };
  const close = () => {
    if (ended) return;
    ended = true;
    raw.end();
  };
  return {
    signal: controller.signal,
    send(data, event) {
      write(`${event ? `event: ${event}\n` : ""}data: ${JSON.stringify(data)}\n\n`);
    },
    done() {
      write("data: [DONE]\n\n");
      close();
    },
    fail(error) {
      let conduitError = toConduitError(error);
      if (!conduitError || conduitError.status >= 500) {
        request.log.error({ err: error }, "stream failed");
        conduitError ??= new ConduitError("internal_error", "internal server error");
      }
      write(`data: ${JSON.stringify(errorBody(conduitError))}\n\n`);
      close();
    },
    close,
  };
}
