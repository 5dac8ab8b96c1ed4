/** Wire-independent types shared by the API, the engine and the trainer. */

export type ChatRole = "system" | "user" | "assistant";

export interface ChatMessage {
  role: ChatRole;
  content: string;
}

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

/** A model the engine can load: an id users name and the GGUF file behind it. */
export interface ModelRef {
  id: string;
  path: string;
}

export interface GenerationRequest {
  model: ModelRef;
  /** Chat messages, formatted with the model's own chat template. Exactly one of `messages` and `prompt`. */
  messages?: ChatMessage[];
  /** A raw prompt, completed as is (OpenAI `/v1/completions`). */
  prompt?: string;
  sampling: SamplingOptions;
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
  completionTokens: number;
}
