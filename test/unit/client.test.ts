import assert from "node:assert/strict";
import { test } from "node:test";
import { ApiError } from "../../src/client/ApiError.ts";
import { chatChunkText } from "../../src/client/chatChunk.ts";
import { mergeStats } from "../../src/client/runEvents.ts";
import { readSse, type SseEvent } from "../../src/client/sse.ts";

/** The API client's parsing, without a server (against real servers: http/client.test.ts). */

test("the SSE reader: events split anywhere, any line ending, comments, multi-line data, ids", async () => {
  const wire =
    ': keep-alive\r\n\r\nevent: log\r\ndata: {"line":"café"}\r\n\r\n' +
    'event: stats\ndata: {"step":1}\n\n' +
    "data: first\rdata: second\r\r" +
    "id: 7\nretry: 10\ndata\n\n" +
    "data: [DONE]\n\n";
  const expected: SseEvent[] = [
    { event: "log", data: '{"line":"café"}' },
    { event: "stats", data: '{"step":1}' },
    { event: "message", data: "first\nsecond" },
    { event: "message", data: "", id: "7" },
    { event: "message", data: "[DONE]" },
  ];
  const bytes = new TextEncoder().encode(wire);
  // Every split point, including inside "\r\n" and inside the two bytes of "é".
  for (let cut = 0; cut <= bytes.length; cut++) {
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        controller.enqueue(bytes.slice(0, cut));
        controller.enqueue(bytes.slice(cut));
        controller.close();
      },
    });
    const events: SseEvent[] = [];
    const retries: number[] = [];
    for await (const event of readSse(body, (ms) => retries.push(ms))) events.push(event);
    assert.deepEqual(events, expected, `split at byte ${cut}`);
    assert.deepEqual(retries, [10]);
  }
});

test("a chat chunk's text; [DONE] ends; an error event throws the API's error", () => {
  assert.equal(chatChunkText('{"choices":[{"delta":{"content":"hel"}}]}'), "hel");
  assert.equal(chatChunkText('{"choices":[{"delta":{"role":"assistant"}}]}'), "");
  assert.equal(chatChunkText('{"choices":[],"usage":{"total_tokens":3}}'), "");
  assert.equal(chatChunkText("[DONE]"), null);
  assert.throws(
    () =>
      chatChunkText(
        '{"error":{"message":"the server is shutting down","type":"server_error","param":null,"code":"unavailable"}}',
      ),
    (error: unknown) =>
      error instanceof ApiError &&
      error.code === "unavailable" &&
      error.status === 0 &&
      error.type === "server_error" &&
      error.message === "the server is shutting down",
  );
});

test("a stats event appends its new loss points; one that replays the series, or a reset, replaces them", () => {
  const point = (step: number) => ({ step, trainLoss: 5 - step });
  const shown = mergeStats({}, { step: 2, lossSeries: [point(1), point(2)] });
  const next = mergeStats(shown, { step: 3, trainLoss: 2, lossSeries: [point(3)], evalLossSeries: [] });
  assert.deepEqual(next.lossSeries, [point(1), point(2), point(3)]);
  assert.equal(next.step, 3);
  assert.equal(next.trainLoss, 2);
  // A new connection replays every point in its first event: no duplicates.
  const replayed = mergeStats(next, { lossSeries: [point(1), point(2), point(3)] });
  assert.deepEqual(replayed.lossSeries, [point(1), point(2), point(3)]);
  // A resumed connection sends only what is new.
  assert.deepEqual(mergeStats(next, { lossSeries: [point(4)] }).lossSeries, [1, 2, 3, 4].map(point));
  // A run that started over, replayed on a new connection, or said on the same one.
  assert.deepEqual(mergeStats(next, { lossSeries: [point(1)] }).lossSeries, [point(1)]);
  const reset = mergeStats(next, { step: 4, lossSeries: [point(4)], seriesReset: true });
  assert.deepEqual(reset.lossSeries, [point(4)]);
  assert.equal("seriesReset" in reset, false);
  assert.deepEqual(mergeStats(next, { step: 4 }).lossSeries, next.lossSeries, "no points, no change");
});
