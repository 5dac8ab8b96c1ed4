import assert from "node:assert/strict";
import { before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import OpenAI from "openai";
import { build, buildTestApp, KEY_A, testEnv, as, KEY_B } from "../lib/helper.ts";
import { suiteCleanup } from "../lib/helper.ts";
import { runScenarios, type ApiScenario } from "../lib/scenario.ts";

/** Parses an SSE body into its `data:` payloads. */
function sseData(body: string): string[] {
  return body
    .split("\n\n")
    .filter((block) => block.trim() !== "")
    .map(
      (block) =>
        block
          .split("\n")
          .find((line) => line.startsWith("data: "))
          ?.slice(6) ?? "",
    );
}

const chat = (payload: Record<string, unknown>) => ({
  method: "POST" as const,
  url: "/conduit/v1/chat",
  headers: { authorization: `Token ${KEY_A}` },
  payload: { model: "tiny", ...payload },
});

describe("generation on the tiny model", () => {
  let app: FastifyInstance;
  const suite = suiteCleanup();
  before(async () => {
    ({ app } = await build(suite));
  });

  test("chat: the Conduit API's result shape, greedy output is deterministic", async () => {
    const request = chat({
      prompt: "Hello there",
      system_prompt: "Be brief.",
      history: ["Hi", "Hey."],
      max_tokens: 12,
      temperature: 0,
    });
    const res = await app.inject(request);
    assert.equal(res.statusCode, 200, res.body);
    const body = res.json();
    assert.match(body.id, /^chatcmpl-/);
    assert.equal(body.object, "chat.completion");
    assert.equal(typeof body.created, "number");
    assert.equal(body.model, "tiny");
    assert.equal(body.choices.length, 1);
    const [choice] = body.choices;
    assert.equal(choice.role, "assistant");
    assert.equal(choice.content, choice.text);
    assert.ok(["stop", "length"].includes(choice.finish_reason));
    assert.ok(body.usage.prompt_tokens > 0);
    assert.ok(body.usage.completion_tokens > 0 && body.usage.completion_tokens <= 12);
    assert.equal(body.usage.total_tokens, body.usage.prompt_tokens + body.usage.completion_tokens);
    const again = await app.inject(request);
    assert.equal(again.json().choices[0].text, choice.text);
    // The same prompt again: all of it but the last token comes from the KV cache (prefix reuse).
    const usage = again.json().usage;
    assert.equal(usage.prompt_tokens, body.usage.prompt_tokens);
    assert.equal(usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens - 1);
  });

  test("max_tokens ends with finish_reason length", async () => {
    const res = await app.inject(chat({ prompt: "Count", max_tokens: 3, temperature: 0, stop: undefined }));
    const body = res.json();
    if (body.choices[0].finish_reason === "length") assert.equal(body.usage.completion_tokens, 3);
    else assert.ok(body.usage.completion_tokens <= 3);
  });

  test("a max_tokens beyond the model's context is a cap, not an error", async () => {
    const res = await app.inject(chat({ prompt: "x", max_tokens: 1_000_000, temperature: 0 }));
    assert.equal(res.statusCode, 200, res.body);
    const body = res.json();
    assert.ok(["stop", "length"].includes(body.choices[0].finish_reason), res.body);
    // The tiny model's context is 1,024 tokens (its training context, under the engine's 2,048).
    assert.ok(body.usage.total_tokens <= 1024, res.body);
  });

  test("completions: messages in, text_completion out", async () => {
    const res = await as(app, KEY_A).post("/conduit/v1/completions", {
      model: "tiny",
      messages: [
        { role: "user", content: "Hi" },
        { role: "assistant", content: "Hello" },
        { role: "user", content: "More" },
      ],
      max_tokens: 8,
      temperature: 0,
    });
    assert.equal(res.statusCode, 200, res.body);
    const body = res.json();
    assert.equal(body.object, "text_completion");
    assert.deepEqual(Object.keys(body.choices[0]).sort(), ["finish_reason", "index", "logprobs", "text"]);
    assert.equal(body.choices[0].logprobs, null);
    assert.equal(body.choices[0].index, 0);

    const withLogprobs = await as(app, KEY_A).post("/conduit/v1/completions", {
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 6,
      logprobs: 3,
    });
    assert.equal(withLogprobs.statusCode, 200, withLogprobs.body);
    const logprobs = withLogprobs.json().choices[0].logprobs;
    assert.ok(logprobs.tokens.length > 0);
    assert.equal(logprobs.token_logprobs.length, logprobs.tokens.length);
    // The Conduit API's sampling (temperature 1, penalties 1): the logprobs are still the model's own distribution.
    for (const [i, top] of logprobs.top_logprobs.entries()) {
      const values = Object.values(top) as number[];
      assert.ok(values.length > 0 && values.length <= 3);
      assert.ok(logprobs.token_logprobs[i] <= Math.max(...values) + 1e-6);
    }
  });

  test("streaming chat, frame by frame, equals the non-streamed text", async () => {
    const payload = { prompt: "Tell me a story", max_tokens: 16, temperature: 0 };
    const plain = (await app.inject(chat(payload))).json();
    const res = await app.inject(chat({ ...payload, stream: true }));
    assert.equal(res.statusCode, 200);
    assert.match(String(res.headers["content-type"]), /^text\/event-stream/);
    const frames = sseData(res.body);
    assert.equal(frames.at(-1), "[DONE]");
    const chunks = frames.slice(0, -1).map((f) => JSON.parse(f));
    for (const c of chunks) {
      assert.equal(c.object, "chat.completion.chunk");
      assert.equal(c.id, chunks[0].id);
    }
    assert.equal(chunks[0].choices[0].delta.role, "assistant");
    const last = chunks.at(-1);
    assert.equal(last.choices[0].finish_reason, plain.choices[0].finish_reason);
    // The same counts; the streamed request found the prompt in the KV cache, all but its last token.
    assert.deepEqual(
      { ...last.usage, prompt_tokens_details: undefined },
      { ...plain.usage, prompt_tokens_details: undefined },
    );
    assert.equal(last.usage.prompt_tokens_details.cached_tokens, plain.usage.prompt_tokens - 1);
    for (const c of chunks.slice(0, -1)) assert.equal(c.choices[0].finish_reason, null);
    assert.equal(chunks.map((c) => c.choices[0].delta.content ?? "").join(""), plain.choices[0].text);
  });

  test("chat: response_format constrains the answer to the schema, streamed the same", async () => {
    const schema = {
      type: "object",
      properties: { answer: { enum: ["yes", "no"] }, sure: { type: "boolean" } },
      additionalProperties: false,
    };
    const payload = {
      prompt: "Is it raining?",
      max_tokens: 64,
      seed: 5,
      response_format: { type: "json_schema", json_schema: { name: "reply", schema } },
    };
    const res = await app.inject(chat(payload));
    assert.equal(res.statusCode, 200, res.body);
    const choice = res.json().choices[0];
    assert.equal(choice.finish_reason, "stop", choice.text);
    const value = JSON.parse(choice.text);
    assert.deepEqual(Object.keys(value), ["answer", "sure"]);
    assert.ok(["yes", "no"].includes(value.answer));
    assert.equal(typeof value.sure, "boolean");

    const streamed = await app.inject(chat({ ...payload, stream: true }));
    const chunks = sseData(streamed.body)
      .slice(0, -1)
      .map((f) => JSON.parse(f));
    assert.equal(chunks.map((c) => c.choices[0].delta.content ?? "").join(""), choice.text);

    const json = await app.inject(
      chat({ prompt: "Hi", max_tokens: 4, response_format: { type: "json_object" } }),
    );
    assert.equal(json.statusCode, 200, json.body);
    assert.match(json.json().choices[0].text, /^\{/);

    const bad = await app.inject(
      chat({
        prompt: "Hi",
        response_format: {
          type: "json_schema",
          json_schema: { name: "x", schema: { type: "number", multipleOf: 2 } },
        },
      }),
    );
    assert.equal(bad.statusCode, 400, bad.body);
    assert.equal(bad.json().error.param, "response_format");
    assert.match(bad.json().error.message, /schema\.multipleOf is not supported/);
  });

  test("streaming completions", async () => {
    const res = await as(app, KEY_A).post("/conduit/v1/completions", {
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 6,
      temperature: 0,
      stream: true,
    });
    const frames = sseData(res.body);
    assert.equal(frames.at(-1), "[DONE]");
    const chunks = frames.slice(0, -1).map((f) => JSON.parse(f));
    assert.ok(chunks.every((c) => c.object === "text_completion" && "text" in c.choices[0]));
    assert.ok(["stop", "length"].includes(chunks.at(-1).choices[0].finish_reason));
  });

  test("parallel requests all complete", async () => {
    const results = await Promise.all(
      Array.from({ length: 6 }, (_, i) =>
        app.inject(chat({ prompt: `Request ${i}`, max_tokens: 8, temperature: 0 })),
      ),
    );
    for (const res of results) assert.equal(res.statusCode, 200, res.body);
    const again = await app.inject(chat({ prompt: "Request 3", max_tokens: 8, temperature: 0 }));
    assert.equal(
      again.json().choices[0].text,
      results[3]?.json().choices[0].text,
      "batching does not change greedy output",
    );
  });

  test("bad input is 400 naming the field; unknown model is 404", async (t) => {
    const chat = (body: Record<string, unknown>, status: number, param: string): ApiScenario => ({
      method: "POST",
      url: "/conduit/v1/chat",
      body: { model: "tiny", ...body },
      status,
      error: { param },
    });
    const completions = (body: Record<string, unknown>, param: string): ApiScenario => ({
      method: "POST",
      url: "/conduit/v1/completions",
      body: { model: "tiny", ...body },
      status: 400,
      error: { code: "invalid_request", param },
    });
    await runScenarios(t, app, [
      chat({ prompt: "x", max_tokens: 0 }, 400, "max_tokens"),
      chat({ prompt: "x", max_tokens: -5 }, 400, "max_tokens"),
      chat({ prompt: "x", temperature: -0.1 }, 400, "temperature"),
      chat({ prompt: "x", top_k: -1 }, 400, "top_k"),
      chat({ prompt: "x", top_p: 0 }, 400, "top_p"),
      chat({ prompt: "x", top_p: 1.5 }, 400, "top_p"),
      chat({ prompt: "" }, 400, "prompt"),
      chat({}, 400, "prompt"),
      chat({ prompt: "x", stream: "yes" }, 400, "stream"),
      chat({ prompt: "x", model: "missing-model" }, 404, "model"),
      // NUL is refused in every text field, as in IO pairs.
      chat({ prompt: "a\u0000b" }, 400, "prompt"),
      chat({ prompt: "x", system_prompt: "\u0000" }, 400, "system_prompt"),
      chat({ prompt: "x", history: ["a\u0000", "b"] }, 400, "history.0"),
      chat({ prompt: "x", stop: ["\u0000"] }, 400, "stop.0"),
      // A list of five stop sequences fails on its length, not on the other branch of the union (a string).
      {
        ...chat({ prompt: "x", stop: ["a", "b", "c", "d", "e"] }, 400, "stop"),
        contains: ['\\"stop\\" must NOT have more than 4 items'],
      },
      completions({}, "messages"),
      completions({ messages: [] }, "messages"),
      completions({ messages: [{ role: "robot", content: "x" }] }, "messages.0.role"),
      completions({ messages: [{ role: "user" }] }, "messages.0.content"),
      completions({ messages: [{ role: "user", content: "a\u0000b" }] }, "messages.0.content"),
    ]);
  });

  test("models are listed natively and OpenAI-style", async () => {
    const native = (await as(app, KEY_A).get("/conduit/v1/models")).json();
    assert.deepEqual(
      native.data.map((m: { id: string }) => m.id),
      ["tiny"],
    );
    const openai = (
      await app.inject({ url: "/v1/models", headers: { authorization: `Bearer ${KEY_A}` } })
    ).json();
    assert.deepEqual(openai, {
      object: "list",
      data: [
        {
          id: "tiny",
          object: "model",
          created: native.data[0].created,
          owned_by: "conduit",
          kind: "base",
          context_length: 1024,
          size_bytes: native.data[0].size_bytes,
          quantization: "F32",
          base_model: null,
          chat_template: { source: "embedded", name: "chatml" },
        },
      ],
    });
    assert.ok(native.data[0].size_bytes > 0);
    assert.deepEqual(openai.data, native.data);
    // One model, natively: what the list shows for it; an unknown one is a 404.
    const one = await as(app, KEY_A).get("/conduit/v1/models/tiny");
    assert.equal(one.statusCode, 200, one.body);
    assert.deepEqual(one.json(), native.data[0]);
    const missing = await as(app, KEY_A).get("/conduit/v1/models/nope");
    assert.equal(missing.statusCode, 404, missing.body);
    assert.equal(missing.json().error.param, "model");
  });

  test("/metrics counts generated tokens", async () => {
    const res = await as(app, KEY_A).get("/metrics");
    assert.equal(res.statusCode, 200);
    const generated = Number(res.body.match(/^conduit_generated_tokens_total (\d+)/m)?.[1]);
    assert.ok(generated > 0, res.body.slice(0, 500));
    assert.match(res.body, /^conduit_queue_depth 0$/m);
    assert.match(res.body, /^conduit_loaded_models 1$/m);
    assert.equal((await app.inject({ url: "/metrics" })).statusCode, 401);
    // The counters cover every tenant: a user not in CONDUIT_METRICS_USERS is refused.
    const bob = await as(app, KEY_B).get("/metrics");
    assert.equal(bob.statusCode, 403);
    assert.equal(bob.json().error.code, "forbidden");
    assert.match(bob.json().error.message, /CONDUIT_METRICS_USERS/);
  });
});

describe("over a real socket", () => {
  test("the official openai client: chat, streaming, completions, n and usage", async (t) => {
    const { app } = await build(t);
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_A, maxRetries: 0 });
    const models = await client.models.list();
    assert.deepEqual(
      models.data.map((m) => m.id),
      ["tiny"],
    );
    const answer = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 8,
      temperature: 0,
      n: 2,
      seed: 7,
    });
    assert.equal(answer.object, "chat.completion");
    assert.equal(answer.choices.length, 2);
    assert.equal(answer.choices[0]?.message.role, "assistant");
    assert.equal(
      answer.choices[0]?.message.content,
      answer.choices[1]?.message.content,
      "greedy: both choices agree",
    );
    assert.ok((answer.usage?.completion_tokens ?? 0) > 0);

    const stream = await client.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Hi" }],
      max_tokens: 8,
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = "";
    let usage: OpenAI.CompletionUsage | undefined;
    let finish: string | null = null;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? "";
      finish = chunk.choices[0]?.finish_reason ?? finish;
      usage = chunk.usage ?? usage;
    }
    assert.equal(text, answer.choices[0]?.message.content);
    assert.ok(finish === "stop" || finish === "length");
    assert.equal(usage?.completion_tokens, answer.usage!.completion_tokens / 2);

    const completion = await client.completions.create({
      model: "tiny",
      prompt: "Once upon a time",
      max_tokens: 5,
      temperature: 0,
      stop: ["\n\n"],
    });
    assert.equal(completion.object, "text_completion");
    assert.equal(typeof completion.choices[0]?.text, "string");
    await assert.rejects(
      client.chat.completions.create({ model: "nope", messages: [{ role: "user", content: "x" }] }),
      (e: Error & { status?: number }) => e.status === 404,
    );
  });

  test("a client that disconnects stops its generation and frees the slot", async (t) => {
    const env = await testEnv(t, "sqlite", { CONDUIT_PARALLEL: "1" });
    const { app } = await buildTestApp(t, env);
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const controller = new AbortController();
    const response = await fetch(`${address}/conduit/v1/chat`, {
      method: "POST",
      headers: { "x-api-key": KEY_A, "content-type": "application/json" },
      // A long generation: stop tokens are banned by the length, not by luck.
      body: JSON.stringify({
        model: "tiny",
        prompt: "Go on forever",
        max_tokens: 400,
        temperature: 1,
        stream: true,
      }),
      signal: controller.signal,
    });
    const reader = response.body!.getReader();
    await reader.read();
    controller.abort();
    // With one sequence, the next request can only run once the aborted one has let go.
    const next = await fetch(`${address}/conduit/v1/chat`, {
      method: "POST",
      headers: { "x-api-key": KEY_A, "content-type": "application/json" },
      body: JSON.stringify({ model: "tiny", prompt: "Next", max_tokens: 4, temperature: 0 }),
    });
    assert.equal(next.status, 200);
    const metrics = await (await fetch(`${address}/metrics`, { headers: { "x-api-key": KEY_A } })).text();
    const generated = Number(metrics.match(/^conduit_generated_tokens_total (\d+)/m)?.[1]);
    assert.ok(generated < 400, `the aborted stream stopped early (${generated} tokens generated in all)`);
  });

  test("a full queue answers 429 with Retry-After", async (t) => {
    const env = await testEnv(t, "sqlite", { CONDUIT_PARALLEL: "1", CONDUIT_MAX_QUEUE: "0" });
    const { app } = await buildTestApp(t, env);
    assert.equal((await app.inject(chat({ prompt: "warm up", max_tokens: 1 }))).statusCode, 200);
    const requests = Array.from({ length: 3 }, () =>
      app.inject(chat({ prompt: "Hi", max_tokens: 64, temperature: 0 })),
    );
    const statuses = (await Promise.all(requests)).map((r) => r);
    const refused = statuses.filter((r) => r.statusCode === 429);
    assert.ok(refused.length >= 1, statuses.map((r) => r.statusCode).join(","));
    assert.ok(Number(refused[0]?.headers["retry-after"]) >= 1);
    assert.equal(refused[0]?.json().error.code, "rate_limited");
    assert.ok(statuses.some((r) => r.statusCode === 200));
  });
});
