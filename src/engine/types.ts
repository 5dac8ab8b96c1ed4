/** Wire-independent generation types shared by the API and the engine. */
import type { ChatMessage, ModelRef, ToolDefinition } from "../model/types.ts";

export type { ChatMessage, ChatRole, ModelRef, ToolCall, ToolDefinition } from "../model/types.ts";

/** Sampling options after defaults are applied (the Conduit API's defaults live in the API schemas). */
export interface SamplingOptions {
  /** Most tokens to generate, a cap. Absent: until the context is full (or the model stops). */
  maxTokens?: number;
  /**
   * `maxTokens` must fit in the context after the prompt, or the request is an `invalid_request` naming
   * `max_tokens` with the token counts (OpenAI's rule for an explicit `max_tokens`). Defaults to `false`: it is
   * a cap, and the answer ends (`length`) when the context is full, as in llama-server.
   */
  maxTokensMustFit?: boolean;
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
export type ResponseFormat =
  | { kind: "json" }
  | { kind: "json_schema"; schema: unknown }
  /** A value matching `schema` (checked like `json_schema`), written between `prefix` and `suffix` (a tool call). */
  | { kind: "wrapped_json_schema"; schema: unknown; prefix: string; suffix: string };

export interface GenerationRequest {
  model: ModelRef;
  /** Chat messages, formatted with the model's own chat template. Exactly one of `messages` and `prompt`. */
  messages?: ChatMessage[];
  /** A raw prompt, completed as is (OpenAI `/v1/completions`). */
  prompt?: string;
  /** Functions the chat template renders for the model (with `messages`, on a template that supports tools). */
  tools?: ToolDefinition[];
  sampling: SamplingOptions;
  /** Constrains the output to JSON. Defaults to free text. */
  responseFormat?: ResponseFormat;
  /**
   * Returns each generated token's log probability and this many most likely alternatives (0–20), from the
   * model's own distribution (see {@link TokenLogprob}). Absent: none (and no cost).
   */
  logprobs?: number;
  /** Aborting stops generation at once and frees the sequence slot. */
  signal?: AbortSignal;
  /**
   * Called with each new piece of text as it is generated (streaming), with the log probabilities of the
   * tokens whose text starts in it when `logprobs` is set (a piece may be empty when only those are new).
   */
  onText?: (text: string, logprobs?: TokenLogprob[]) => void;
}

/**
 * A generated token and its log probability under the model's distribution at that position: the log-softmax
 * of the raw logits, before repetition penalties, temperature, top-k/top-p and any grammar (so with sampling
 * on, a token can be chosen that is not the most likely one, and at temperature 0 without penalties the chosen
 * token is always the first of `top`).
 */
export interface TokenLogprob {
  /** The token's text, control tokens included as their text (a token that ends inside a character: U+FFFD). */
  token: string;
  logprob: number;
  /** The most likely tokens at this position, most likely first (as many as the request asked). */
  top: { token: string; logprob: number }[];
}

export type FinishReason = "stop" | "length";

export interface GenerationResult {
  text: string;
  finishReason: FinishReason;
  promptTokens: number;
  /** Prompt tokens that were already in the KV cache (a prefix shared with an earlier request) and not evaluated again. */
  cachedTokens: number;
  completionTokens: number;
  /**
   * With `logprobs`: one entry per generated token whose text is in `text` (tokens of a stop sequence, an
   * end-of-turn token and trimmed trailing whitespace have none).
   */
  logprobs?: TokenLogprob[];
}

/** Embeds texts (or token ids) with a model: one vector per input, in order. */
export interface EmbeddingRequest {
  model: ModelRef;
  /**
   * Texts (tokenized without parsing special tokens) or token ids; the model's BOS token is added in front of
   * each, and the end token its vocabulary wants (a BERT-style SEP) after it. At least one; none empty.
   */
  inputs: (string | number[])[];
  /** The vectors' length the caller expects: another than the model's is an `invalid_request`. Defaults to any. */
  dimensions?: number;
  /** Aborting stops between two inputs. */
  signal?: AbortSignal;
}

export interface EmbeddingResult {
  /** One vector per input, in order, each {@link dimensions} long. */
  vectors: number[][];
  dimensions: number;
  /** Tokens evaluated, BOS and end tokens included. */
  promptTokens: number;
}
