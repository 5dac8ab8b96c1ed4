import assert from "node:assert/strict";
import path from "node:path";
import { before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import OpenAI from "openai";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { as, asAlice, build, buildTestApp, KEY_A, suiteCleanup, testEnv } from "../lib/helper.ts";
import { TOOLS_TEMPLATE } from "../lib/toolsTemplate.ts";

/** `POST /v1/responses`, stateless, on the tiny model: the same generation as chat completions, OpenAI's shapes. */

const url = "/v1/responses";

/** The events of a streamed response: each SSE event's name and its data. */
function eventsOf(body: string): { event: string; data: Record<string, unknown> }[] {
  return body
    .split("\n\n")
    .filter((frame) => frame.trim() !== "")
    .map((frame) => {
      const event = /^event: (.*)$/m.exec(frame)?.[1] ?? "";
      const data = /^data: (.*)$/m.exec(frame)?.[1] ?? "{}";
      return { event, data: JSON.parse(data) as Record<string, unknown> };
    });
}

type Item = { type: string; content?: { type: string; text: string }[]; [key: string]: unknown };
const textOf = (output: Item[]) =>
  output
    .filter((i) => i.type === "message")
    .flatMap((i) => i.content ?? [])
    .map((c) => c.text)
    .join("");

describe("responses on the tiny model", () => {
  let app: FastifyInstance;
  const suite = suiteCleanup();
  before(async () => {
    ({ app } = await build(suite));
  });
  const post = (payload: Record<string, unknown>, headers: Record<string, string> = asAlice) =>
    app.inject({ method: "POST", url, headers, payload: { model: "tiny", ...payload } });

  test("text input and instructions answer as chat completions does, with OpenAI's response object", async () => {
    const res = await post({ input: "Hi", instructions: "Be brief.", max_output_tokens: 6, temperature: 0 });
    assert.equal(res.statusCode, 200, res.body);
    const response = res.json();
    assert.match(response.id, /^resp_/);
    assert.equal(response.object, "response");
    assert.equal(response.model, "tiny");
    assert.equal(response.store, false);
    assert.equal(response.instructions, "Be brief.");
    assert.equal(response.max_output_tokens, 6);
    assert.equal(response.previous_response_id, null);
    const [item] = response.output;
    assert.equal(item.type, "message");
    assert.equal(item.role, "assistant");
    assert.match(item.id, /^msg_/);
    assert.equal(item.content[0].type, "output_text");
    const { usage } = response;
    assert.equal(usage.total_tokens, usage.input_tokens + usage.output_tokens);
    assert.ok(usage.output_tokens >= 1 && usage.output_tokens <= 6, res.body);
    if (usage.output_tokens === 6) {
      assert.equal(response.status, "incomplete");
      assert.deepEqual(response.incomplete_details, { reason: "max_output_tokens" });
    } else assert.equal(response.status, "completed");

    const chat = await app.inject({
      method: "POST",
      url: "/v1/chat/completions",
      headers: asAlice,
      payload: {
        model: "tiny",
        messages: [
          { role: "system", content: "Be brief." },
          { role: "user", content: "Hi" },
        ],
        max_tokens: 6,
        temperature: 0,
      },
    });
    assert.equal(item.content[0].text, chat.json().choices[0].message.content);
    assert.equal(usage.input_tokens, chat.json().usage.prompt_tokens);

    // The same conversation as message items (developer = system, text parts joined).
    const items = await post({
      input: [
        { role: "developer", content: "Be brief." },
        { type: "message", role: "user", content: [{ type: "input_text", text: "Hi" }] },
      ],
      max_output_tokens: 6,
      temperature: 0,
    });
    assert.equal(items.statusCode, 200, items.body);
    assert.equal(textOf(items.json().output), item.content[0].text);

    // A conversation carried on the client's side: the response's output items go back as input, as they are.
    const next = await post({
      input: [{ role: "user", content: "Hi" }, ...response.output, { role: "user", content: "And then?" }],
      max_output_tokens: 2,
    });
    assert.equal(next.statusCode, 200, next.body);
    assert.ok(next.json().usage.input_tokens > usage.input_tokens, next.body);
  });

  test("a capped answer is incomplete, naming max_output_tokens", async () => {
    const res = await post({ input: "Once upon a time", max_output_tokens: 2, temperature: 0 });
    assert.equal(res.statusCode, 200, res.body);
    // The tiny model's random weights rarely end a sentence within two tokens; if they do, the answer is complete.
    const response = res.json();
    if (response.usage.output_tokens === 2) {
      assert.equal(response.status, "incomplete");
      assert.deepEqual(response.incomplete_details, { reason: "max_output_tokens" });
      assert.equal(response.output[0].status, "incomplete");
    }
  });

  test("stream: OpenAI's event types in order, named as their type, deltas adding up to the answer", async () => {
    const payload = { input: "Once upon a time", max_output_tokens: 8, temperature: 0 };
    const res = await post({ ...payload, stream: true });
    assert.equal(res.statusCode, 200, res.body);
    assert.match(res.headers["content-type"] as string, /text\/event-stream/);
    const events = eventsOf(res.body);
    for (const e of events) assert.equal(e.event, e.data.type);
    assert.deepEqual(
      events.map((e) => e.data.sequence_number),
      events.map((_, i) => i),
    );
    const types = events.map((e) => e.event).filter((t) => t !== "response.output_text.delta");
    const end = events.at(-1)!.event;
    assert.deepEqual(types, [
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      end,
    ]);
    assert.ok(end === "response.completed" || end === "response.incomplete", end);
    const deltas = events.filter((e) => e.event === "response.output_text.delta").map((e) => e.data.delta);
    assert.ok(deltas.length >= 1);
    const done = events.find((e) => e.event === "response.output_text.done")!.data;
    assert.equal(deltas.join(""), done.text);
    const final = events.at(-1)!.data.response as { output: Item[]; usage: { output_tokens: number } };
    assert.equal(textOf(final.output), done.text);
    assert.ok(final.usage.output_tokens >= 1);
    const created = events[0]!.data.response as { status: string; output: unknown[] };
    assert.equal(created.status, "in_progress");
    assert.deepEqual(created.output, []);

    const plain = await post(payload);
    assert.equal(textOf(plain.json().output), done.text, "streamed and not, the same greedy answer");
  });

  test("text.format json_schema: the answer matches the schema", async () => {
    const schema = {
      type: "object",
      properties: { colour: { enum: ["red", "green"] }, big: { type: "boolean" } },
      required: ["colour", "big"],
      additionalProperties: false,
    };
    const res = await post({
      input: "Pick a colour.",
      text: { format: { type: "json_schema", name: "pick", schema, strict: true } },
      max_output_tokens: 200,
    });
    assert.equal(res.statusCode, 200, res.body);
    const response = res.json();
    assert.equal(response.status, "completed", res.body);
    const value = JSON.parse(textOf(response.output));
    assert.ok(["red", "green"].includes(value.colour));
    assert.equal(typeof value.big, "boolean");
    assert.deepEqual(response.text.format.name, "pick");
  });

  test("refused and invalid fields are a 400 naming them", async () => {
    const cases: [Record<string, unknown>, string, RegExp][] = [
      [{ input: "Hi", previous_response_id: "resp_123" }, "previous_response_id", /does not store responses/],
      [{ input: "Hi", store: true }, "store", /must be false.*does not store/],
      [{ input: "Hi", conversation: "conv_1" }, "conversation", /does not store/],
      [{ input: "Hi", reasoning: { effort: "low" } }, "reasoning", /not supported yet/],
      [{ input: "Hi", background: true }, "background", /not supported yet/],
      [{ input: [{ type: "reasoning", summary: [] }] }, "input.0", /reasoning, item references/],
      [{ input: [] }, "input", /non-empty array/],
      [
        { input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] },
        "input.0.content.0",
        /image, file, audio and refusal parts are not supported yet/,
      ],
      [{ input: "Hi", tools: [{ type: "web_search" }] }, "tools.0", /built-in tools/],
      [{ input: "Hi", temperature: 3 }, "temperature", /2/],
      [{ input: "Hi", max_output_tokens: 0 }, "max_output_tokens", /1/],
      [{ input: "Hi", text: { format: { type: "xml" } } }, "text.format", /json_schema/],
      [
        {
          input: "Hi",
          text: { format: { type: "json_schema", name: "x", schema: { type: "string", pattern: "a+" } } },
        },
        "text.format",
        /pattern/,
      ],
      [{ input: "Hi", tool_choice: "required" }, "tool_choice", /tools/],
      [{ input: "Hi", tools: [{ type: "function", name: "f" }] }, "tools", /tools/],
      [{ input: "Hi", max_tokens: 5 }, "max_tokens", /./],
    ];
    for (const [payload, param, message] of cases) {
      const res = await post(payload);
      assert.equal(res.statusCode, 400, `${JSON.stringify(payload)}: ${res.body}`);
      const error = res.json().error;
      assert.equal(error.param, param, `${JSON.stringify(payload)}: ${res.body}`);
      assert.match(error.message, message, `${JSON.stringify(payload)}: ${res.body}`);
    }
    // `store: false` and nulls ask for nothing.
    const fine = await post({ input: "Hi", store: false, previous_response_id: null, max_output_tokens: 2 });
    assert.equal(fine.statusCode, 200, fine.body);
  });

  test("every request needs a key; another user's model is not found", async () => {
    const anonymous = await app.inject({ method: "POST", url, payload: { model: "tiny", input: "Hi" } });
    assert.equal(anonymous.statusCode, 401);
    const missing = await post({ model: "ft:tiny:alice:nope", input: "Hi" });
    assert.equal(missing.statusCode, 404, missing.body);
    assert.equal(missing.json().error.param, "model");
  });

  test("the official openai client: responses.create, streamed and not", async () => {
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_A, maxRetries: 0 });
    const response = await client.responses.create({
      model: "tiny",
      instructions: "Be brief.",
      input: "Hi",
      max_output_tokens: 8,
      temperature: 0,
    });
    assert.equal(response.object, "response");
    assert.ok(response.output_text.length > 0);
    assert.ok(response.usage!.total_tokens > 0);

    const stream = await client.responses.create({
      model: "tiny",
      instructions: "Be brief.",
      input: "Hi",
      max_output_tokens: 8,
      temperature: 0,
      stream: true,
    });
    let text = "";
    let last: OpenAI.Responses.ResponseStreamEvent | undefined;
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") text += event.delta;
      last = event;
    }
    assert.equal(text, response.output_text);
    assert.ok(last?.type === "response.completed" || last?.type === "response.incomplete");

    await assert.rejects(
      client.responses.create({ model: "tiny", input: "Hi", previous_response_id: "resp_1" }),
      (e: InstanceType<typeof OpenAI.BadRequestError>) => {
        assert.equal(e.status, 400);
        assert.equal(e.param, "previous_response_id");
        return true;
      },
    );
  });
});

const weather = {
  type: "function",
  name: "get_weather",
  description: "The weather in a city.",
  parameters: {
    type: "object",
    properties: { city: { type: "string", maxLength: 8 } },
    required: ["city"],
  },
};

describe("function tools on a tiny model whose template supports tools", () => {
  let app: FastifyInstance;
  const t = suiteCleanup();
  before(async () => {
    const env = await testEnv(t);
    await createTinyModel(path.join(env.dataDir, "models", "tools.gguf"), {
      seed: 1,
      chatTemplate: TOOLS_TEMPLATE,
    });
    ({ app } = await buildTestApp(t, env));
  });
  const post = (payload: Record<string, unknown>) => as(app, KEY_A).post(url, { model: "tools", ...payload });
  const ask = "What is the weather in Paris?";

  test("a forced call is a function_call item; its output goes back as input items", async () => {
    const res = await post({
      input: ask,
      tools: [weather],
      tool_choice: { type: "function", name: "get_weather" },
      max_output_tokens: 200,
      temperature: 0,
    });
    assert.equal(res.statusCode, 200, res.body);
    const response = res.json();
    assert.equal(response.status, "completed", res.body);
    const calls = response.output.filter((i: Item) => i.type === "function_call");
    assert.equal(calls.length, 1, res.body);
    const [call] = calls;
    assert.match(call.id, /^fc_/);
    assert.match(call.call_id, /^call_/);
    assert.equal(call.name, "get_weather");
    assert.equal(call.status, "completed");
    assert.deepEqual(Object.keys(JSON.parse(call.arguments)), ["city"]);
    assert.deepEqual(response.tool_choice, { type: "function", name: "get_weather" });

    const back = await post({
      input: [
        { role: "user", content: ask },
        { type: "function_call", call_id: call.call_id, name: call.name, arguments: call.arguments },
        { type: "function_call_output", call_id: call.call_id, output: "Sunny, 21 C" },
      ],
      tools: [weather],
      max_output_tokens: 4,
      temperature: 0,
    });
    assert.equal(back.statusCode, 200, back.body);
    // The call and its output were rendered into the prompt by the template.
    assert.ok(back.json().usage.input_tokens > response.usage.input_tokens + 10, back.body);
  });

  test("a forced call with text.format is a 400 naming tool_choice, in this face's words", async () => {
    const res = await post({
      input: ask,
      tools: [weather],
      tool_choice: "required",
      text: { format: { type: "json_object" } },
    });
    assert.equal(res.statusCode, 400, res.body);
    assert.equal(res.json().error.param, "tool_choice");
    assert.match(res.json().error.message, /"text\.format"/);
    assert.doesNotMatch(res.json().error.message, /response_format/);
  });

  test("stream: a call's item, its arguments' delta and done events, then completed", async () => {
    const res = await post({
      input: ask,
      tools: [weather],
      tool_choice: "required",
      max_output_tokens: 200,
      temperature: 0,
      stream: true,
    });
    assert.equal(res.statusCode, 200, res.body);
    const events = eventsOf(res.body);
    const types = events.map((e) => e.event);
    assert.deepEqual(types.slice(0, 2), ["response.created", "response.in_progress"]);
    assert.equal(types.at(-1), "response.completed");
    const from = types.indexOf("response.function_call_arguments.delta");
    assert.ok(from > 0, types.join(","));
    assert.equal(types[from - 1], "response.output_item.added");
    assert.equal(types[from + 1], "response.function_call_arguments.done");
    assert.equal(types[from + 2], "response.output_item.done");
    const added = events[from - 1]!.data.item as Item;
    assert.equal(added.type, "function_call");
    assert.equal(added.arguments, "");
    const done = events[from + 1]!.data;
    assert.equal(events[from]!.data.delta, done.arguments);
    assert.equal(done.item_id, added.id);
    const final = events.at(-1)!.data.response as { output: Item[] };
    const call = final.output.find((i) => i.type === "function_call")!;
    assert.equal(call.arguments, done.arguments);
    assert.equal(call.name, done.name);
  });
});
