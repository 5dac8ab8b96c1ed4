// Translation between the API faces' generation shapes and the engine's request: pure functions, no server,
// no model.
import assert from "node:assert/strict";
import { test } from "node:test";
import { samplingDefaults } from "../../src/contract/sampling.ts";
import type {
  ChatBodyWire,
  CompletionsBodyWire,
  OpenAiChatBodyWire,
  OpenAiCompletionBodyWire,
} from "../../src/contract/generation.ts";
import { ConduitError } from "../../src/errors.ts";
import { completionShape } from "../../src/api/generation/common.ts";
import { conduitChatShape, fromChatBody, fromCompletionsBody } from "../../src/api/conduit/generationWire.ts";
import {
  fromChatRequest,
  fromCompletionRequest,
  openAiChatShape,
  toChatChunk,
  toChatCompletion,
} from "../../src/api/openai/generationWire.ts";
import type { InferenceResult } from "../../src/inference/InferenceService.ts";

const base = { id: "chatcmpl-x", created: 1_700_000_000, model: "tiny" };

/** A Conduit chat body as the schema leaves it: the defaults filled in. */
function conduitChat(fields: Partial<ChatBodyWire>): ChatBodyWire {
  return { prompt: "", stream: false, ...samplingDefaults, ...fields } as ChatBodyWire;
}

/** An OpenAI chat body as the schema leaves it (OpenAI's defaults, `null`s dropped). */
function openAiChat(fields: Partial<OpenAiChatBodyWire>): OpenAiChatBodyWire {
  return {
    messages: [],
    stream: false,
    temperature: 1,
    top_p: 1,
    top_k: 0,
    presence_penalty: 0,
    frequency_penalty: 0,
    n: 1,
    ...fields,
  } as OpenAiChatBodyWire;
}

function result(choices: Partial<InferenceResult["choices"][number]>[]): InferenceResult {
  return {
    model: "tiny",
    choices: choices.map((c, index) => ({
      index,
      text: "",
      finishReason: "stop",
      promptTokens: 7,
      cachedTokens: 3,
      completionTokens: 2,
      ...c,
    })),
    promptTokens: 7,
    cachedTokens: 3,
    completionTokens: 2,
  };
}

test("a Conduit chat body: system prompt, history as alternating turns, then the prompt; sampling by name", () => {
  const input = fromChatBody(
    conduitChat({
      model: "tiny",
      system_prompt: "be brief",
      history: ["hi", "hello", "and then?"],
      prompt: "go on",
      max_tokens: 16,
      top_k: 5,
      stop: "END",
      seed: 7,
      response_format: { type: "json_object" },
    }),
  );
  assert.deepEqual(input.messages, [
    { role: "system", content: "be brief" },
    { role: "user", content: "hi" },
    { role: "assistant", content: "hello" },
    { role: "user", content: "and then?" },
    { role: "user", content: "go on" },
  ]);
  assert.deepEqual(input.sampling, {
    maxTokens: 16,
    temperature: samplingDefaults.temperature,
    topK: 5,
    topP: samplingDefaults.top_p,
    presencePenalty: samplingDefaults.presence_penalty,
    frequencyPenalty: samplingDefaults.frequency_penalty,
    stop: ["END"],
    seed: 7,
  });
  assert.deepEqual(input.responseFormat, { kind: "json" });
  assert.equal(input.model, "tiny");
});

test("a Conduit completions body keeps its messages and asks for log probabilities", () => {
  const input = fromCompletionsBody({
    messages: [
      { role: "user", content: "2+2?" },
      { role: "assistant", content: "4" },
    ],
    stream: false,
    logprobs: 2,
    ...samplingDefaults,
  } as CompletionsBodyWire);
  assert.deepEqual(input.messages, [
    { role: "user", content: "2+2?" },
    { role: "assistant", content: "4" },
  ]);
  assert.equal(input.logprobs, 2);
  assert.equal(input.sampling.maxTokens, samplingDefaults.max_tokens);
});

test("the same conversation through both faces is the same generation request", () => {
  const conduit = fromChatBody(
    conduitChat({ system_prompt: "sys", history: ["q1", "a1"], prompt: "q2", temperature: 0, max_tokens: 9 }),
  );
  const openai = fromChatRequest(
    openAiChat({
      messages: [
        { role: "developer", content: "sys" },
        {
          role: "user",
          content: [
            { type: "text", text: "q" },
            { type: "text", text: "1" },
          ],
        },
        { role: "assistant", content: "a1" },
        { role: "user", content: "q2" },
      ],
      temperature: 0,
      top_k: samplingDefaults.top_k,
      top_p: samplingDefaults.top_p,
      presence_penalty: samplingDefaults.presence_penalty,
      frequency_penalty: samplingDefaults.frequency_penalty,
      max_tokens: 9,
    } as Partial<OpenAiChatBodyWire>),
  );
  assert.deepEqual(openai.messages, conduit.messages);
  // OpenAI's explicit max_tokens must fit after the prompt (a 400 otherwise); the Conduit default may shrink.
  assert.deepEqual(openai.sampling, { ...conduit.sampling, maxTokensMustFit: true });
});

test("an OpenAI chat request: max_completion_tokens wins, seeds wrap to 32 bits, tools and their calls carry over", () => {
  const input = fromChatRequest(
    openAiChat({
      model: "ft:tiny:x:ft_1",
      messages: [
        { role: "user", content: "weather?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: "call_1", type: "function", function: { name: "weather", arguments: '{"city":"Oslo"}' } },
          ],
        },
        { role: "tool", content: "rain", tool_call_id: "call_1" },
      ],
      max_tokens: 100,
      max_completion_tokens: 20,
      seed: -1,
      tools: [{ type: "function", function: { name: "weather", parameters: { type: "object" } } }],
      tool_choice: { type: "function", function: { name: "weather" } },
      n: 2,
    } as Partial<OpenAiChatBodyWire>),
  );
  assert.equal(input.sampling.maxTokens, 20);
  assert.equal(input.sampling.maxTokensMustFit, true);
  assert.equal(input.sampling.seed, 2 ** 32 - 1);
  assert.deepEqual(input.messages, [
    { role: "user", content: "weather?" },
    {
      role: "assistant",
      content: "",
      toolCalls: [{ id: "call_1", name: "weather", arguments: '{"city":"Oslo"}' }],
    },
    { role: "tool", content: "rain", toolCallId: "call_1" },
  ]);
  assert.deepEqual(input.tools, [{ name: "weather", parameters: { type: "object" } }]);
  assert.deepEqual(input.toolChoice, { name: "weather" });
  assert.equal(input.n, 2);
  assert.equal(input.logprobs, undefined);
});

test("OpenAI log probabilities: top_logprobs needs logprobs (a 400 naming it), and counts the alternatives", () => {
  assert.throws(
    () => fromChatRequest(openAiChat({ top_logprobs: 2 })),
    (error: unknown) =>
      error instanceof ConduitError && error.code === "invalid_request" && error.param === "top_logprobs",
  );
  assert.equal(fromChatRequest(openAiChat({ logprobs: true })).logprobs, 0);
  assert.equal(fromChatRequest(openAiChat({ logprobs: true, top_logprobs: 3 })).logprobs, 3);
});

test("an OpenAI completion request: one prompt or several", () => {
  const body = (prompt: string | string[]) =>
    ({
      prompt,
      stream: false,
      temperature: 1,
      top_p: 1,
      top_k: 0,
      n: 1,
    }) as unknown as OpenAiCompletionBodyWire;
  assert.deepEqual(fromCompletionRequest(body("once")).prompt, ["once"]);
  assert.deepEqual(fromCompletionRequest(body(["a", "b"])).prompt, ["a", "b"]);
  assert.equal(fromCompletionRequest(body("x")).sampling.maxTokens, undefined);
});

test("a chat completion in OpenAI's shape: text, or tool calls with null content; usage with cached tokens", () => {
  const completion = toChatCompletion(
    base,
    result([
      {
        text: "hé",
        logprobs: [{ token: "h\uFFFD", logprob: -0.5, top: [{ token: "x", logprob: -1 }] }],
      },
      { text: "", finishReason: "tool_calls", toolCalls: [{ id: "call_9", name: "f", arguments: "{}" }] },
    ]),
  );
  assert.equal(completion.object, "chat.completion");
  assert.deepEqual(completion.choices[0]?.message, { role: "assistant", content: "hé" });
  assert.deepEqual(completion.choices[0]?.logprobs, {
    content: [
      {
        token: "h\uFFFD",
        logprob: -0.5,
        bytes: null,
        top_logprobs: [{ token: "x", logprob: -1, bytes: [120] }],
      },
    ],
    refusal: null,
  });
  assert.deepEqual(completion.choices[1]?.message, {
    role: "assistant",
    content: null,
    tool_calls: [{ id: "call_9", type: "function", function: { name: "f", arguments: "{}" } }],
  });
  assert.equal(completion.choices[1]?.finish_reason, "tool_calls");
  assert.deepEqual(completion.usage, {
    prompt_tokens: 7,
    completion_tokens: 2,
    total_tokens: 9,
    prompt_tokens_details: { cached_tokens: 3 },
  });
});

test("OpenAI stream chunks: the first says the role, tool calls are indexed, usage only when asked", () => {
  const first = toChatChunk(base, 0, "He", null, true);
  assert.deepEqual(first.choices, [
    { index: 0, delta: { role: "assistant", content: "He" }, logprobs: null, finish_reason: null },
  ]);
  const calls = toChatChunk(base, 1, "", null, false, undefined, [{ id: "c", name: "f", arguments: "{}" }]);
  assert.deepEqual(calls.choices, [
    {
      index: 1,
      delta: {
        tool_calls: [{ index: 0, id: "c", type: "function", function: { name: "f", arguments: "{}" } }],
      },
      logprobs: null,
      finish_reason: null,
    },
  ]);
  assert.equal(openAiChatShape(true).streamUsage, "separate");
  assert.equal(openAiChatShape(false).streamUsage, "none");
});

test("the Conduit chat shape has the text as both content and text, and a role on the first chunk only", () => {
  const answer = conduitChatShape.result(base, result([{ text: "ok", finishReason: "length" }])) as {
    choices: unknown[];
  };
  assert.deepEqual(answer.choices, [
    { index: 0, role: "assistant", content: "ok", text: "ok", finish_reason: "length" },
  ]);
  assert.deepEqual(conduitChatShape.chunk(base, 0, "a", null, true).choices, [
    { index: 0, delta: { role: "assistant", content: "a" }, finish_reason: null },
  ]);
  assert.deepEqual(conduitChatShape.chunk(base, 0, "b", null, false).choices, [
    { index: 0, delta: { content: "b" }, finish_reason: null },
  ]);
});

test("a streamed text completion counts each choice's text offsets across its chunks", () => {
  const shape = completionShape();
  const offsets = (chunk: Record<string, unknown>) =>
    (chunk.choices as { logprobs: { text_offset: number[] } | null }[])[0]?.logprobs?.text_offset;
  const lp = (...tokens: string[]) => tokens.map((token) => ({ token, logprob: -1, top: [] }));
  assert.deepEqual(offsets(shape.chunk(base, 0, "ab", null, true, lp("a", "b"))), [0, 1]);
  assert.deepEqual(offsets(shape.chunk(base, 1, "xyz", null, true, lp("xyz"))), [0]);
  assert.deepEqual(offsets(shape.chunk(base, 0, "cd", null, false, lp("cd"))), [2]);
  // A new shape (a new request) starts again from 0.
  assert.deepEqual(offsets(completionShape().chunk(base, 0, "cd", null, false, lp("cd"))), [0]);
});
