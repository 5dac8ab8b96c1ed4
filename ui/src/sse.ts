import { createParser } from "eventsource-parser";

/** One Server-Sent Event: its `event:` name ("message" when none) and its `data:` lines joined. */
export interface SseEvent {
  event: string;
  data: string;
}

/**
 * Reads Server-Sent Events from a fetch() body. EventSource cannot send the API key header, so
 * the dashboard streams with fetch and parses with eventsource-parser, as the CLI's client does
 * (`id:`, `retry:` and comments are read and ignored).
 */
export async function* readSse(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const events: SseEvent[] = [];
  const parser = createParser({
    onEvent: (event) => events.push({ event: event.event ?? "message", data: event.data }),
  });
  const decoder = new TextDecoder();
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      parser.feed(decoder.decode(value, { stream: true }));
      while (events.length > 0) yield events.shift() as SseEvent;
    }
  } finally {
    // A caller that stops early (`[DONE]`, leaving the page) closes the response too; after the
    // end of the stream this does nothing.
    await reader.cancel().catch(() => undefined);
  }
}
