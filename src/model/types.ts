/** Model-file types shared by the engine, the trainer and the API. */

export type ChatRole = "system" | "user" | "assistant";

export interface ChatMessage {
  role: ChatRole;
  content: string;
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
