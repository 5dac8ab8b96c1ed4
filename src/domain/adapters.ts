/** A LoRA adapter imported for a base model (see `AdapterService`). */
export interface Adapter {
  id: string;
  userId: string;
  name: string;
  baseModel: string;
  format: "gguf" | "peft";
  rank: number;
  alpha: number;
  /** Base weights it adapts. */
  weights: number;
  sizeBytes: number;
  /** The stored GGUF adapter. */
  path: string;
  createdAt: string;
}
