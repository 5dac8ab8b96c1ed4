/**
 * The OpenAI-compatible generation face, translated (as Ollama's `openai/openai.go`): its requests
 * (`/v1/chat/completions`, `/v1/completions`) into the same generation request the Conduit API makes, and
 * results and stream chunks back into OpenAI's shapes. Pure functions; the routes only call them and
 * `respondWithGeneration`. Without `max_tokens` a completion may use the room left in the model's context (as
 * OpenAI and vLLM do); the Conduit endpoints keep their default of 256.
 */
import type { ChatMessage, SamplingOptions, ToolCall } from "../../engine/types.ts";
import { ConduitError } from "../../errors.ts";
import type { OpenAiChatBodyWire, OpenAiCompletionBodyWire } from "../../contract/generation.ts";
import {
  chatLogprobs,
  completionShape,
  responseFormat,
  usageOf,
  type FinishReason,
  type GenerationInput,
  type ResponseBase,
  type ResponseShape,
} from "../generation/common.ts";
import type { InferenceResult } from "../../inference/InferenceService.ts";
import type { TokenLogprob } from "../../engine/types.ts";

/** OpenAI's sampling fields → engine options (OpenAI seeds are any integer; the sampler takes 32 bits). */
export function openAiSampling(
  body: Pick<
    OpenAiChatBodyWire,
    | "max_tokens"
    | "max_completion_tokens"
    | "temperature"
    | "top_p"
    | "top_k"
    | "presence_penalty"
    | "frequency_penalty"
    | "stop"
    | "seed"
  >,
): SamplingOptions {
  const maxTokens = body.max_completion_tokens ?? body.max_tokens;
  return {
    // As OpenAI: an explicit max_tokens that cannot fit after the prompt is a 400.
    ...(maxTokens !== undefined ? { maxTokens, maxTokensMustFit: true } : {}),
    temperature: body.temperature,
    topK: body.top_k,
    topP: body.top_p,
    presencePenalty: body.presence_penalty,
    frequencyPenalty: body.frequency_penalty,
    ...(body.stop !== undefined ? { stop: typeof body.stop === "string" ? [body.stop] : body.stop } : {}),
    ...(body.seed !== undefined ? { seed: body.seed >>> 0 } : {}),
  };
}

/** OpenAI's messages → chat messages: `developer` is the system, text parts are joined, tool calls kept. */
export function openAiMessages(messages: OpenAiChatBodyWire["messages"]): ChatMessage[] {
  return messages.map((m) => ({
    role: m.role === "developer" ? "system" : m.role,
    content: typeof m.content === "string" ? m.content : (m.content ?? []).map((part) => part.text).join(""),
    ...(m.tool_calls && m.tool_calls.length > 0
      ? {
          toolCalls: m.tool_calls.map((c) => ({
            id: c.id,
            name: c.function.name,
            arguments: c.function.arguments,
          })),
        }
      : {}),
    ...(m.tool_call_id !== undefined ? { toolCallId: m.tool_call_id } : {}),
  }));
}

/** `tools` and `tool_choice` → the inference request's fields. */
function openAiTools(body: OpenAiChatBodyWire) {
  const choice = body.tool_choice;
  return {
    tools: body.tools?.map((t) => ({
      name: t.function.name,
      ...(t.function.description !== undefined ? { description: t.function.description } : {}),
      ...(t.function.parameters !== undefined ? { parameters: t.function.parameters } : {}),
    })),
    toolChoice: typeof choice === "object" ? { name: choice.function.name } : choice,
    parallelToolCalls: body.parallel_tool_calls,
  };
}

/** `logprobs: true` asks for log probabilities, `top_logprobs` for alternatives (only with `logprobs`). */
function chatLogprobCount(body: OpenAiChatBodyWire): number | undefined {
  if (body.top_logprobs !== undefined && body.top_logprobs > 0 && body.logprobs !== true)
    throw new ConduitError("invalid_request", 'field "top_logprobs" needs "logprobs": true', {
      param: "top_logprobs",
    });
  return body.logprobs === true ? (body.top_logprobs ?? 0) : undefined;
}

/** `POST /v1/chat/completions`'s body → the generation request (a 400 for `top_logprobs` without `logprobs`). */
export function fromChatRequest(body: OpenAiChatBodyWire): GenerationInput {
  return {
    model: body.model,
    messages: openAiMessages(body.messages),
    sampling: openAiSampling(body),
    responseFormat: responseFormat(body.response_format),
    logprobs: chatLogprobCount(body),
    ...openAiTools(body),
    n: body.n,
  };
}

/** `POST /v1/completions`'s body → the generation request: one choice per prompt (`n` per prompt). */
export function fromCompletionRequest(body: OpenAiCompletionBodyWire): GenerationInput {
  return {
    model: body.model,
    // The schema has checked `n` times the prompts against `MAX_CHOICES`.
    prompt: typeof body.prompt === "string" ? [body.prompt] : body.prompt,
    sampling: openAiSampling(body),
    logprobs: body.logprobs,
    n: body.n,
  };
}

/** OpenAI's `tool_calls` of a message (or, with `index`, of a stream's delta). */
function wireToolCalls(calls: ToolCall[], streamed: boolean) {
  return calls.map((c, i) => ({
    ...(streamed ? { index: i } : {}),
    id: c.id,
    type: "function" as const,
    function: { name: c.name, arguments: c.arguments },
  }));
}

/** A finished generation as OpenAI's `chat.completion`. */
export function toChatCompletion(base: ResponseBase, result: InferenceResult) {
  return {
    ...base,
    object: "chat.completion",
    choices: result.choices.map((c) => ({
      index: c.index,
      message: c.toolCalls
        ? {
            role: "assistant",
            content: c.text === "" ? null : c.text,
            tool_calls: wireToolCalls(c.toolCalls, false),
          }
        : { role: "assistant", content: c.text },
      logprobs: chatLogprobs(c.logprobs),
      finish_reason: c.finishReason,
    })),
    usage: usageOf(result),
  };
}

/**
 * One `chat.completion.chunk` of a stream: a choice's next text (the first of a choice says its role), its
 * whole tool calls, or its end.
 */
export function toChatChunk(
  base: ResponseBase,
  index: number,
  text: string,
  finishReason: FinishReason | null,
  first: boolean,
  logprobs?: TokenLogprob[],
  toolCalls?: ToolCall[],
): Record<string, unknown> {
  return {
    ...base,
    object: "chat.completion.chunk",
    choices: [
      {
        index,
        delta: {
          ...(first ? { role: "assistant" } : {}),
          ...(toolCalls ? { tool_calls: wireToolCalls(toolCalls, true) } : { content: text }),
        },
        logprobs: chatLogprobs(logprobs),
        finish_reason: finishReason,
      },
    ],
  };
}

/** OpenAI's chat answers; `usage` streams in a chunk of its own only with `stream_options.include_usage`. */
export function openAiChatShape(includeUsage: boolean): ResponseShape {
  return {
    idPrefix: "chatcmpl",
    result: toChatCompletion,
    chunk: toChatChunk,
    streamUsage: includeUsage ? "separate" : "none",
  };
}

/** OpenAI's text completions, with `usage` as for chat. */
export function openAiCompletionShape(includeUsage: boolean): ResponseShape {
  return completionShape(includeUsage ? "separate" : "none");
}
