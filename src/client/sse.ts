import { createParser } from "eventsource-parser";
import { ApiError, clientErrorCodes } from "./ApiError.ts";

/** One Server-Sent Event. */
export interface SseEvent {
  /** Its `event:` name; `message` when it has none. */
  event: string;
  /** Its `data:` lines, joined by line breaks. */
  data: string;
  /** Its `id:`, when it has one. */
  id?: string;
}

/**
 * Reads Server-Sent Events from a fetch() body, in Node and in browsers. EventSource cannot send the
 * API key header, so streams are fetched and parsed with eventsource-parser. `onRetry` gets the
 * server's `retry:` (ms). A connection that breaks is an ApiError (`connection_lost`); an abort stays
 * the abort. Stopping early (`[DONE]`, a page left) cancels the body.
 */
export async function* readSse(
  body: ReadableStream<Uint8Array>,
  onRetry?: (ms: number) => void,
): AsyncGenerator<SseEvent> {
  const events: SseEvent[] = [];
  const parser = createParser({
    onEvent: ({ event, data, id }) =>
      events.push({ event: event ?? "message", data, ...(id === undefined ? {} : { id }) }),
    ...(onRetry ? { onRetry } : {}),
  });
  const decoder = new TextDecoder();
  const reader = body.getReader();
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (error) {
        if ((error as Error | undefined)?.name === "AbortError") throw error;
        throw new ApiError("The connection to the server was lost.", 0, clientErrorCodes.connectionLost);
      }
      const { value, done } = chunk;
      if (done) break;
      parser.feed(decoder.decode(value, { stream: true }));
      while (events.length > 0) yield events.shift() as SseEvent;
    }
    // An event not ended by a blank line is incomplete: the spec drops it, and so does this reader.
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}
