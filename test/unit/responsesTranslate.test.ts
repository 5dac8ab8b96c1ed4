// OpenAI's Responses API ↔ the generation request: pure functions, no server, no model.
import assert from "node:assert/strict";
import { test } from "node:test";
import type { OpenAiResponsesBodyWire } from "../../src/contract/generation.ts";
import { ConduitError } from "../../src/errors.ts";
import {
  fromResponsesRequest,
  ResponseEvents,
  responseSettings,
  toResponse,
  toResponsesError,
} from "../../src/api/openai/responsesWire.ts";
import type { InferenceResult } from "../../src/inference/InferenceService.ts";

/** A body as the schema leaves it: OpenAI's defaults filled in. */
const body = (fields: Partial<OpenAiResponsesBodyWire>) =>
  ({ input: "", temperature: 1, top_p: 1, stream: false, ...fields }) as OpenAiResponsesBodyWire;

const head = { id: "resp_abc", created_at: 1_700_000_000, model: "tiny" };

const result = (fields: Partial<InferenceResult["choices"][number]> = {}): InferenceResult => ({
  model: "tiny",
  choices: [
    { index: 0, text: "Hello", finishReason: "stop", ...fields } as InferenceResult["choices"][number],
  ],
  promptTokens: 7,
  cachedTokens: 2,
  completionTokens: 3,
});

test("input items become chat messages: instructions first, calls join the assistant turn, outputs are tool turns", () => {
  const request = fromResponsesRequest(
    body({
      instructions: "Be brief.",
      input: [
        { role: "developer", content: "Use metric units." },
        {
          type: "message",
          role: "user",
          content: [
            { type: "input_text", text: "Weather " },
            { type: "input_text", text: "in Paris?" },
          ],
        },
        { role: "assistant", content: [{ type: "output_text", text: "Let me check." }] },
        { type: "function_call", call_id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
        { type: "function_call", call_id: "call_2", name: "get_time", arguments: "{}" },
        { type: "function_call_output", call_id: "call_1", output: "Sunny" },
        { type: "function_call_output", call_id: "call_2", output: [{ type: "input_text", text: "noon" }] },
      ],
      max_output_tokens: 50,
      temperature: 0.5,
      tools: [{ type: "function", name: "get_weather", parameters: { type: "object" } }],
      tool_choice: { type: "function", name: "get_weather" },
      parallel_tool_calls: false,
      text: { format: { type: "json_schema", name: "x", schema: { type: "object" } } },
    }),
  );
  assert.deepEqual(request.messages, [
    { role: "system", content: "Be brief." },
    { role: "system", content: "Use metric units." },
    { role: "user", content: "Weather in Paris?" },
    {
      role: "assistant",
      content: "Let me check.",
      toolCalls: [
        { id: "call_1", name: "get_weather", arguments: '{"city":"Paris"}' },
        { id: "call_2", name: "get_time", arguments: "{}" },
      ],
    },
    { role: "tool", content: "Sunny", toolCallId: "call_1" },
    { role: "tool", content: "noon", toolCallId: "call_2" },
  ]);
  assert.equal(request.sampling.maxTokens, 50);
  assert.equal(request.sampling.temperature, 0.5);
  assert.equal(request.sampling.maxTokensMustFit, undefined, "a cap, as OpenAI's max_output_tokens");
  assert.deepEqual(request.tools, [{ name: "get_weather", parameters: { type: "object" } }]);
  assert.deepEqual(request.toolChoice, { name: "get_weather" });
  assert.equal(request.parallelToolCalls, false);
  assert.deepEqual(request.responseFormat, { kind: "json_schema", schema: { type: "object" } });

  // A call with no assistant turn before it starts one; a string input is the user's turn.
  const call = fromResponsesRequest(
    body({ input: [{ type: "function_call", call_id: "c", name: "f", arguments: "{}" }] }),
  );
  assert.deepEqual(call.messages, [
    { role: "assistant", content: "", toolCalls: [{ id: "c", name: "f", arguments: "{}" }] },
  ]);
  assert.deepEqual(fromResponsesRequest(body({ input: "Hi" })).messages, [{ role: "user", content: "Hi" }]);
  assert.equal(fromResponsesRequest(body({ input: "Hi" })).sampling.maxTokens, undefined);
});

test("a result as OpenAI's response: text, calls as items, usage, incomplete at the cap", () => {
  const settings = responseSettings(body({ input: "Hi" }));
  const done = toResponse(head, settings, result());
  assert.equal(done.status, "completed");
  assert.deepEqual(done.output, [
    {
      type: "message",
      id: "msg_abc",
      status: "completed",
      role: "assistant",
      content: [{ type: "output_text", text: "Hello", annotations: [], logprobs: [] }],
    },
  ]);
  assert.deepEqual(done.usage, {
    input_tokens: 7,
    input_tokens_details: { cached_tokens: 2 },
    output_tokens: 3,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: 10,
  });
  assert.equal(done.store, false);
  assert.equal(done.tool_choice, "auto");

  const cut = toResponse(head, settings, result({ finishReason: "length" }));
  assert.equal(cut.status, "incomplete");
  assert.deepEqual(cut.incomplete_details, { reason: "max_output_tokens" });

  const calls = toResponse(
    head,
    settings,
    result({
      text: "",
      finishReason: "tool_calls",
      toolCalls: [{ id: "call_9", name: "f", arguments: "{}" }],
    }),
  );
  assert.deepEqual(calls.output, [
    {
      type: "function_call",
      id: "fc_abc_0",
      call_id: "call_9",
      name: "f",
      arguments: "{}",
      status: "completed",
    },
  ]);
});

test("a stream's events: numbered in order, text deltas then the closing events; a call's events after the text", () => {
  const events = new ResponseEvents(head, responseSettings(body({ input: "Hi" })));
  const all = [
    ...events.start(),
    ...events.text("Hel"),
    ...events.text("lo"),
    ...events.finish(
      result({
        text: "Hello",
        finishReason: "tool_calls",
        toolCalls: [{ id: "call_1", name: "f", arguments: '{"a":1}' }],
      }),
    ),
  ];
  assert.deepEqual(
    all.map((e) => e.type),
    [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ],
  );
  assert.deepEqual(
    all.map((e) => e.data.sequence_number),
    all.map((_, i) => i),
  );
  assert.equal(all[6]!.data.text, "Hello");
  assert.equal(all[9]!.data.output_index, 1);
  assert.equal(all[11]!.data.arguments, '{"a":1}');
  assert.equal(all[11]!.data.item_id, "fc_abc_0");
});

test("errors of the shared generation name this face's fields", () => {
  const renamed = toResponsesError(
    new ConduitError("invalid_request", 'field "response_format": its JSON schema has 2000 enum values', {
      param: "response_format",
    }),
  ) as ConduitError;
  assert.equal(renamed.param, "text.format");
  assert.equal(renamed.message, 'field "text.format": its JSON schema has 2000 enum values');
  const cap = toResponsesError(
    new ConduitError("invalid_request", "max_tokens must be at least 1.", { param: "maxTokens" }),
  ) as ConduitError;
  assert.equal(cap.param, "max_output_tokens");
  assert.equal(cap.message, "max_output_tokens must be at least 1.");
  const other = new ConduitError("model_not_found", 'model "x" not found', { param: "model" });
  assert.equal(toResponsesError(other), other);
});
