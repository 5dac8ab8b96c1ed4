import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { ConduitError } from "../errors.ts";
import { errorBody, toConduitError } from "./errorHandler.ts";

declare module "fastify" {
  interface FastifyInstance {
    /** Ends each open Server-Sent Events stream; `registerSse` calls them when the app closes. */
    sseStreams: Set<() => void>;
    /**
     * How long a stream opened with `heartbeat` may stay silent before it gets a `: keep-alive`
     * comment, so that proxies do not cut it as idle (tests set it lower). Defaults to `15000`.
     */
    sseHeartbeatMs: number;
  }
}

/**
 * Open streams would hold shutdown up (the server waits for its connections), so when the app
 * starts closing each one gets a final `unavailable` error event and ends, and its work is aborted.
 */
export function registerSse(app: FastifyInstance): void {
  const streams = new Set<() => void>();
  app.decorate("sseStreams", streams);
  app.decorate("sseHeartbeatMs", 15_000);
  app.addHook("preClose", async () => {
    for (const end of [...streams]) end();
  });
}

/** An open Server-Sent Events response. */
export interface SseStream {
  /** Aborts when the client goes away; pass it to the work that feeds the stream. */
  signal: AbortSignal;
  /**
   * Writes one `data:` event (JSON), optionally named and with an `id:` (what the client sends back
   * as `Last-Event-ID` to resume). False when the client has not taken what was written before: wait
   * for `drained()` before sending more.
   */
  send(data: unknown, event?: string, id?: string): boolean;
  /** Writes an event made by `encodeSseEvent` (one made once for many streams); returns as `send`. */
  sendEncoded(encoded: Buffer): boolean;
  /** Resolves once the client has taken what was written, or has gone (at once if nothing waits). */
  drained(): Promise<void>;
  /** Writes `data: [DONE]` (OpenAI's end marker) and closes. */
  done(): void;
  /** Writes a final `data: {"error":{...}}` event and closes; internal errors stay in the log. */
  fail(error: unknown): void;
  close(): void;
}

/** One Server-Sent Events event as written on the wire: `data:` (JSON), optionally named and with an `id:`. */
export function encodeSseEvent(data: unknown, event?: string, id?: string): Buffer {
  return Buffer.from(
    `${event ? `event: ${event}\n` : ""}${id ? `id: ${id}\n` : ""}data: ${JSON.stringify(data)}\n\n`,
  );
}

const shared = new WeakMap<object, Buffer>();

/**
 * An event that many streams send (the followers of a run or eval run get the same event objects from one feed),
 * encoded once: the first stream's `encode` is kept for the object.
 */
export function encodeShared(event: object, encode: () => Buffer): Buffer {
  let bytes = shared.get(event);
  if (!bytes) shared.set(event, (bytes = encode()));
  return bytes;
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
  options: {
    /** Sends a `: keep-alive` comment after `sseHeartbeatMs` without any write. Defaults to `false`. */
    heartbeat?: boolean;
  } = {},
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
  let heartbeat: NodeJS.Timeout | undefined;
  const write = (text: string | Buffer): boolean => {
    if (ended || raw.destroyed) return true;
    heartbeat?.refresh();
    return raw.write(text);
  };
  if (options.heartbeat) {
    heartbeat = setInterval(() => {
      // A client that has not taken the last event is not idle; the comment would only queue up.
      if (!raw.writableNeedDrain) write(": keep-alive\n\n");
    }, request.server.sseHeartbeatMs);
    raw.once("close", () => clearInterval(heartbeat));
  }
  const streams = request.server.sseStreams;
  const close = () => {
    if (ended) return;
    ended = true;
    clearInterval(heartbeat);
    streams.delete(shutdown);
    raw.end();
  };
  function shutdown() {
    const error = new ConduitError("unavailable", "the server is shutting down");
    write(`data: ${JSON.stringify(errorBody(error))}\n\n`);
    close();
    controller.abort(error);
  }
  streams.add(shutdown);
  raw.once("close", () => streams.delete(shutdown));
  return {
    signal: controller.signal,
    send(data, event, id) {
      return write(encodeSseEvent(data, event, id));
    },
    sendEncoded(encoded) {
      return write(encoded);
    },
    drained() {
      if (ended || raw.destroyed || !raw.writableNeedDrain) return Promise.resolve();
      return new Promise((resolve) => {
        const done = () => {
          raw.off("drain", done);
          raw.off("close", done);
          resolve();
        };
        raw.once("drain", done);
        raw.once("close", done);
      });
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
      write(`data: ${JSON.stringify(errorBody(conduitError, request.url))}\n\n`);
      close();
    },
    close,
  };
}
