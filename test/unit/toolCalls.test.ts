import assert from "node:assert/strict";
import { test } from "node:test";
import { parseToolCalls } from "../../src/inference/toolCalls.ts";

/** Tool calls in a model's answer, parsed into OpenAI's shape (through the API: http/openai.test.ts). */

test("tool calls parse from Hermes/Qwen tags, lists, a Llama-style JSON answer; unknown names stay text", () => {
  const tools = [{ name: "get_weather" }, { name: "get_time" }];
  const hermes = parseToolCalls(
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    tools,
  );
  assert.equal(hermes.content, "Let me look.");
  assert.deepEqual(
    hermes.calls.map((c) => [c.name, JSON.parse(c.arguments)]),
    [["get_weather", { city: "Paris" }]],
  );
  assert.match(hermes.calls[0]!.id, /^call_/);
  const list = parseToolCalls(
    '<tool_call>[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": {"city": "Oslo"}}]</tool_call>',
    tools,
  );
  assert.deepEqual(
    list.calls.map((c) => c.name),
    ["get_time", "get_weather"],
  );
  assert.equal(list.content, "");
  const llama = parseToolCalls('{"name": "get_weather", "parameters": {"city": "Rome"}}', tools);
  assert.deepEqual(JSON.parse(llama.calls[0]!.arguments), { city: "Rome" });
  const unknown = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>';
  assert.deepEqual(parseToolCalls(unknown, tools), { content: unknown, calls: [] });
  assert.deepEqual(parseToolCalls("Just text.", tools), { content: "Just text.", calls: [] });
});
