/** Wire-independent generation types shared by the API and the engine. */
import type { ChatMessage, ModelRef } from "../model/types.ts";

export type { ChatMessage, ChatRole, ModelRef } from "../model/types.ts";

/** Sampling options after defaults are applied (the seed's defaults live in the API schemas). */
export interface SamplingOptions {
  maxTokens: number;
  /** 0 means greedy. */
  temperature: number;
  topK: number;
  topP: number;
  presencePenalty: number;
  frequencyPenalty: number;
  stop?: string[];
  seed?: number;
}

/**
 * Output constrained by a grammar in the sampler: `json` is any JSON object; `json_schema` is a value that
 * matches `schema` (the subset of JSON Schema that node-llama-cpp's grammar supports; see
 * `unsupportedJsonSchema`). A schema it cannot honour is an `invalid_request` naming `response_format`.
 */
export type ResponseFormat = { kind: "json" } | { kind: "json_schema"; schema: unknown };

export interface GenerationRequest {
  model: ModelRef;
  /** Chat messages, formatted with the model's own chat template. Exactly one of `messages` and `prompt`. */
  messages?: ChatMessage[];
  /** A raw prompt, completed as is (OpenAI `/v1/completions`). */
  prompt?: string;
  sampling: SamplingOptions;
  /** Constrains the output to JSON. Defaults to free text. */
  responseFormat?: ResponseFormat;
  /** Aborting stops generation at once and frees the sequence slot. */
  signal?: AbortSignal;
  /** Called with each new piece of text as it is generated (streaming). */
  onText?: (text: string) => void;
}

export type FinishReason = "stop" | "length";

export interface GenerationResult {
  text: string;
  finishReason: FinishReason;
  promptTokens: number;
  /** Prompt tokens that were already in the KV cache (a prefix shared with an earlier request) and not evaluated again. */
  cachedTokens: number;
  completionTokens: number;
}
