import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";
import { openAiPython, runPython, skipWithoutOpenAiPython } from "../lib/openAiPython.ts";
import { TOOLS_TEMPLATE } from "../lib/toolsTemplate.ts";

/** `responses.create` driven by the official Python client, as OpenAI's guides write it. */

const python = openAiPython();

const script = `
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)

plain = client.responses.create(model="tiny", instructions="Be brief.", input="Tell me a story.",
                                max_output_tokens=8, temperature=0)

streamed_text = ""
types = []
final = None
for event in client.responses.create(model="tiny", instructions="Be brief.", input="Tell me a story.",
                                     max_output_tokens=8, temperature=0, stream=True):
    types.append(event.type)
    if event.type == "response.output_text.delta":
        streamed_text += event.delta
    if event.type in ("response.completed", "response.incomplete"):
        final = event.response

tools = [{"type": "function", "name": "get_weather", "description": "The weather in a city.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
                         "required": ["city"], "additionalProperties": False}, "strict": True}]
ask = [{"role": "user", "content": "What is the weather in Paris?"}]
called = client.responses.create(model="tools", input=ask, tools=tools, tool_choice="required",
                                 max_output_tokens=200, temperature=0)
call = next(item for item in called.output if item.type == "function_call")
answer = client.responses.create(model="tools", tools=tools, max_output_tokens=4, temperature=0,
                                 input=ask + [call.model_dump(exclude_none=True),
                                              {"type": "function_call_output", "call_id": call.call_id,
                                               "output": "Sunny, 21 C"}])

try:
    client.responses.create(model="tiny", input="Hi", previous_response_id=plain.id)
    refused = None
except Exception as e:
    refused = {"status": e.status_code, "param": e.body.get("param")}

print(json.dumps({
    "plain": {"status": plain.status, "text": plain.output_text, "usage": plain.usage.model_dump()},
    "streamed": {"text": streamed_text, "final": final.output_text, "types": types},
    "call": {"name": call.name, "arguments": json.loads(call.arguments), "call_id": call.call_id},
    "answer": {"status": answer.status, "input_tokens": answer.usage.input_tokens,
               "asked_tokens": called.usage.input_tokens},
    "refused": refused,
}))
`;

test(
  "the official Python client: responses.create, streamed and not, and with a function tool",
  { skip: skipWithoutOpenAiPython(python) },
  async (t) => {
    const env = await testEnv(t);
    await createTinyModel(path.join(env.dataDir, "models", "tools.gguf"), {
      seed: 1,
      chatTemplate: TOOLS_TEMPLATE,
    });
    const { app } = await buildTestApp(t, env);
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const result = await runPython(python!, script, [address, KEY_A]);
    assert.equal(result.status, 0, result.stderr);
    const out = JSON.parse(result.stdout);

    assert.ok(["completed", "incomplete"].includes(out.plain.status));
    assert.ok(out.plain.text.length > 0);
    const usage = out.plain.usage;
    assert.equal(usage.total_tokens, usage.input_tokens + usage.output_tokens);
    assert.equal(out.streamed.text, out.plain.text, "streamed, the same greedy answer");
    assert.equal(out.streamed.final, out.plain.text);
    const types: string[] = out.streamed.types;
    assert.deepEqual(types.slice(0, 4), [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
    ]);
    assert.ok(["response.completed", "response.incomplete"].includes(types.at(-1)!), types.join(","));

    assert.equal(out.call.name, "get_weather");
    assert.deepEqual(Object.keys(out.call.arguments), ["city"]);
    assert.match(out.call.call_id, /^call_/);
    assert.ok(["completed", "incomplete"].includes(out.answer.status));
    assert.ok(out.answer.input_tokens > out.answer.asked_tokens + 10, JSON.stringify(out.answer));

    assert.deepEqual(out.refused, { status: 400, param: "previous_response_id" });
  },
);
