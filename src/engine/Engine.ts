import type { AcceleratorInfo } from "./accelerator.ts";
import type {
  EmbeddingRequest,
  EmbeddingResult,
  GenerationRequest,
  GenerationResult,
  ModelRef,
} from "./types.ts";

/** A model the engine holds in memory. */
export interface LoadedModelInfo {
  id: string;
  /** The weights' file (the shared base, for a LoRA model). */
  path: string;
  /** The LoRA adapter applied on `path`, if any. */
  lora?: string;
  sizeBytes: number;
  /** Generations running on this model now (a base and its adapters share `parallelSequences`). */
  activeSequences: number;
  /** Generations waiting for one of this model's sequences. */
  queuedRequests: number;
  /** Tokens each sequence holds (prompt + completion), after capping at the model's training context. */
  contextSize: number;
  lastUsedAt: Date;
}

export interface EngineStats {
  /** Requests waiting for a sequence or for their model to load, across all models. */
  queueDepth: number;
  /** Generations running now, across all models. */
  activeGenerations: number;
  /** Servable models loaded (a base and each of its adapters count one each). */
  loadedModels: number;
  /** Distinct weight files in memory: LoRA adapters of one base share it. */
  loadedBases: number;
  /** Models being loaded now. */
  loadingModels: number;
  /** Generations finished since start (any finish reason; aborted and failed ones not counted). */
  completedGenerations: number;
  /** Requests refused with `rate_limited` since start. */
  rejectedRequests: number;
  promptTokens: number;
  /** Of `promptTokens`, those found in a sequence's KV cache (prefix reuse) rather than evaluated. */
  cachedPromptTokens: number;
  completionTokens: number;
  /** Tokens evaluated by finished embedding requests (BOS and end tokens included). */
  embeddingTokens: number;
}

/**
 * The narrow seam between the HTTP API and inference. `createLlamaEngine` is the real one; tests of the
 * HTTP shape can pass a fake.
 */
export interface Engine {
  /**
   * Runs one generation. Waits in a bounded queue when all sequences of the model are busy. Throws
   * `ConduitError` `rate_limited` (queue full, with `retryAfter`), `invalid_request` (e.g. `max_tokens` beyond
   * the context), `unavailable` (the model failed to load, or the engine is shutting down); rejects with the
   * signal's reason when `request.signal` aborts.
   */
  generate(request: GenerationRequest): Promise<GenerationResult>;
  /**
   * Embeds each input with the model's embedding context (one per loaded base, shared by its adapters, created
   * on first use and counted against the memory budgets). Requests take turns on it, waiting in the same bounded
   * queue as generations. Throws `ConduitError` `invalid_request` naming `input` (an empty input, one past the
   * context, more than `MAX_EMBEDDING_TOKENS` tokens in all, a token id outside the vocabulary),
   * `rate_limited` and `unavailable` as `generate` does.
   */
  embed(request: EmbeddingRequest): Promise<EmbeddingResult>;
  /** Loads a model (if it is not loaded) and keeps it warm; `generate` does this on first use. */
  load(model: ModelRef): Promise<void>;
  /**
   * Unloads every model served from `file` (a model file or a LoRA adapter): it is taken out of service at once
   * and freed when its running generations end. Called when a run's files are deleted.
   */
  unload(file: string): void;
  /** The models held in memory. */
  loaded(): LoadedModelInfo[];
  stats(): EngineStats;
  /** The compute backend generation runs on (starting it if needed); rejects when `CONDUIT_GPU` cannot be met. */
  accelerator(): Promise<AcceleratorInfo>;
  /** Stops everything: queued and running generations fail with `unavailable`, models are released. */
  dispose(): Promise<void>;
}
