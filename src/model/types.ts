/** Model-file types shared by the engine, the trainer and the API. */

export type ChatRole = "system" | "user" | "assistant" | "tool";

export interface ChatMessage {
  role: ChatRole;
  content: string;
  /** Functions an assistant turn called (OpenAI `tool_calls`). */
  toolCalls?: ToolCall[];
  /** The call a `tool` message answers. */
  toolCallId?: string;
}

/** A function call: `arguments` is the JSON text of the arguments object, as OpenAI writes it. */
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
}

/** A function the model may call (OpenAI's `tools[].function`). */
export interface ToolDefinition {
  name: string;
  description?: string;
  /** A JSON Schema of the arguments object. */
  parameters?: Record<string, unknown>;
}

/** A LoRA adapter applied on top of a base model. */
export interface LoraRef {
  /** The adapter GGUF (`general.type = adapter`). */
  path: string;
  /** Multiplies the adapter's own `alpha / rank` scale. Defaults to `1`. */
  scale?: number;
}

/**
 * A model the engine can load: an id users name and the GGUF file behind it, plus, for a LoRA
 * fine-tune, the adapter applied on that base (the base weights are loaded once and shared).
 */
export interface ModelRef {
  id: string;
  path: string;
  lora?: LoraRef;
}
