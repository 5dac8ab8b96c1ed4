import type { Llama, LlamaGrammar } from "node-llama-cpp";
import { ConduitError, type DomainField } from "../errors.ts";
import { Admission, abortable } from "./Admission.ts";
import type { AcceleratorInfo } from "./accelerator.ts";
import type { AdapterBatchingSetting, GpuLayers, GpuSetting } from "../contract/accelerator.ts";
import type { Engine, EngineStats, LoadedModelInfo } from "./Engine.ts";
import { MAX_EMBEDDING_TOKENS } from "../contract/generation/embeddings.ts";
import type { Embedder } from "./Embedder.ts";
import { INLINE_PROMPT_BYTES } from "./promptTokens.ts";
import { GrammarCache } from "./grammars.ts";
import { ModelPool, type LoadedModel } from "./ModelPool.ts";
import { TokenizerThread } from "./TokenizerThread.ts";
import type { SequenceTicket } from "./BatcherGroup.ts";
import { SequenceBatcher } from "./SequenceBatcher.ts";
import type {
  EmbeddingRequest,
  EmbeddingResult,
  GenerationRequest,
  GenerationResult,
  ModelRef,
  SamplingOptions,
} from "./types.ts";

export { chatTokens } from "./promptTokens.ts";
export { PROMPT_BATCH_TOKENS } from "./SequenceBatcher.ts";

export interface LlamaEngineOptions {
  /**
   * llama.cpp compute threads per model, for prompts and generation. Measured on the 2-core machines here
   * (bench/engineThreads.ts, stories260K): 1 thread generates 1,750–2,600 tok/s, 2 threads 11–99 tok/s, and
   * 2 threads also lose on prompt batches (SmolLM2-135M pp128: 81 vs 22 tok/s in llama-bench). node-llama-cpp
   * attaches no persistent threadpool, so each decode creates its worker threads, which then busy-wait at
   * every barrier for a partner the shared cores have descheduled. Raise it only on dedicated cores.
   * Defaults to `1`.
   */
  threads?: number;
  /**
   * Threads for decode steps that evaluate at least {@link PROMPT_BATCH_TOKENS} tokens (a new prompt), where a
   * big batch amortizes the threads' barriers. On an idle 2-core machine, 2 threads evaluate SmolLM2-135M
   * prompts 1.75x faster (bench/engineThreads.ts: 267 vs 153 tok/s) while generation, one token per step,
   * stays fastest on 1; on shared cores 2 threads can lose even there, hence the default. Defaults to `threads`.
   */
  promptThreads?: number;
  /** Tokens per sequence (prompt + completion), capped at the model's training context. Defaults to `2048`. */
  contextSize?: number;
  /**
   * Generations that run at once per loaded base model, batched into one decode per token step (one per LoRA
   * adapter in use on a context: a base and its adapters share these sequences, split among `contextsPerModel`
   * contexts). Each sequence has its own KV cache of `contextSize` tokens. On 2 cores, 8 concurrent streams
   * got about the same aggregate tokens/s with 4 sequences as with 8 (bench/engine.ts). Defaults to `4`.
   */
  parallelSequences?: number;
  /**
   * Contexts a loaded base's `parallelSequences` are split among (the same KV cache in all). Generations are
   * grouped by LoRA adapter onto contexts, so different adapters decode side by side on libuv's thread pool
   * instead of one after another on one context, and one base's generations use as many threads as contexts
   * (bench/README.md §Serving many adapters). Capped at `parallelSequences`. Defaults to `2`.
   */
  contextsPerModel?: number;
  /**
   * Requests that may wait (for a free sequence or for their model to load) across all models; one more is
   * refused with `rate_limited` and a `retryAfter` estimate. Defaults to `32`.
   */
  maxQueue?: number;
  /**
   * Bytes of model files kept loaded (a base once, each LoRA adapter its own file). Loading a model that would
   * exceed it first unloads the least recently used models (adapters included) that have no running or queued
   * generation; a model bigger than the budget still loads alone.
   * Defaults to `8 GiB`.
   */
  memoryBudgetBytes?: number;
  /**
   * The compute backend (`CONDUIT_GPU`, see accelerator.ts): `"auto"` takes a GPU when node-llama-cpp's prebuilt
   * binaries find a working one, `"cuda"`/`"vulkan"` insist (loading fails without), `"off"` or `false` is the
   * CPU. Defaults to `"off"`.
   */
  gpu?: GpuSetting | false;
  /** Layers of each model offloaded to the GPU (`CONDUIT_GPU_LAYERS`). Defaults to `"all"`. */
  gpuLayers?: GpuLayers;
  /**
   * Whether generations of different LoRA adapters share one decode through the mixed-adapter build
   * (`npm run setup:adapters`, mixedAdapterBuild.ts; `CONDUIT_ADAPTER_BATCHING`): `"auto"` when it is there and
   * the CPU is used, `"grouped"` never (one decode per adapter in use each step). Defaults to `"auto"`.
   */
  adapterBatching?: AdapterBatchingSetting;
  /**
   * Bytes of GPU memory that loaded models may take, estimated per model at load and counted apart from
   * `memoryBudgetBytes`. Defaults to 90% of the GPU memory free when the backend starts.
   */
  gpuMemoryBudgetBytes?: number;
  /**
   * Most tokens evaluated in one decode step (capped at `contextSize`); long prompts are split across steps
   * so running streams keep flowing. Defaults to `512`.
   */
  batchSize?: number;
  /**
   * An existing node-llama-cpp instance to use; the engine does not dispose it. Creating one costs ~1 s (it
   * test-runs the prebuilt binary in a child process), so tests and benchmarks share one. Defaults to one
   * created on first use (CPU or GPU per `gpu`) and disposed with the engine.
   */
  llama?: Llama;
  /**
   * Receives llama.cpp's warnings and errors, and the engine's notes (`info`: a model file that changed on disk
   * is loaded again). Defaults to `console.warn`.
   */
  logger?: (level: "error" | "warn" | "info", message: string) => void;
}

const DEFAULTS = {
  threads: 1,
  contextSize: 2048,
  parallelSequences: 4,
  contextsPerModel: 2,
  maxQueue: 32,
  memoryBudgetBytes: 8 * 1024 ** 3,
  batchSize: 512,
} as const;

/** Most alternatives per token a request may ask for (OpenAI's `top_logprobs` limit). */
export const MAX_TOP_LOGPROBS = 20;

/** Creates the node-llama-cpp engine. Nothing native is loaded until the first `generate` or `load`. */
export function createLlamaEngine(options: LlamaEngineOptions = {}): Engine {
  return new LlamaEngine(options);
}

/**
 * The engine: validates a request, gets its model from the pool (ModelPool.ts: loading, memory budgets,
 * eviction), admits it (Admission.ts: the bounded queue), and runs it on the model's sequences
 * (SequenceBatcher.ts: prefix reuse, batched decoding, sampling, streaming).
 */
class LlamaEngine implements Engine {
  private readonly pool: ModelPool;
  private readonly admission: Admission;
  private readonly grammars = new GrammarCache();
  /** Where long prompts are tokenized, off the event loop. */
  private readonly tokenizer = new TokenizerThread();
  private disposed = false;
  private readonly counters = {
    completed: 0,
    promptTokens: 0,
    cachedPromptTokens: 0,
    completionTokens: 0,
    embeddingTokens: 0,
  };

  constructor(options: LlamaEngineOptions) {
    const threads = positiveInteger(options.threads ?? DEFAULTS.threads, "threads");
    const promptThreads = positiveInteger(options.promptThreads ?? threads, "promptThreads");
    const parallel = positiveInteger(
      options.parallelSequences ?? DEFAULTS.parallelSequences,
      "parallelSequences",
    );
    const batchSize = positiveInteger(options.batchSize ?? DEFAULTS.batchSize, "batchSize");
    const logger = options.logger ?? ((level, message) => console.warn(`[llama.cpp ${level}] ${message}`));
    this.admission = new Admission(Math.max(0, Math.floor(options.maxQueue ?? DEFAULTS.maxQueue)), parallel);
    this.pool = new ModelPool({
      contextSize: positiveInteger(options.contextSize ?? DEFAULTS.contextSize, "contextSize"),
      parallel,
      contexts: positiveInteger(options.contextsPerModel ?? DEFAULTS.contextsPerModel, "contextsPerModel"),
      threads,
      batchSize,
      memoryBudget: options.memoryBudgetBytes ?? DEFAULTS.memoryBudgetBytes,
      gpu: options.gpu === false ? "off" : (options.gpu ?? "off"),
      gpuLayers: options.gpuLayers ?? "all",
      adapterBatching: options.adapterBatching ?? "auto",
      gpuMemoryBudget: options.gpuMemoryBudgetBytes,
      llama: options.llama,
      logger,
      createBatcher: ({ touch, ...parts }) =>
        new SequenceBatcher({
          ...parts,
          tokenizer: this.tokenizer,
          threads,
          promptThreads,
          batchSize,
          logger,
          onFinish: (result, elapsedMs, adapterKey) => {
            this.counters.completed++;
            this.counters.promptTokens += result.promptTokens;
            this.counters.cachedPromptTokens += result.cachedTokens;
            this.counters.completionTokens += result.completionTokens;
            this.admission.recordGeneration(elapsedMs);
            touch(adapterKey);
          },
        }),
    });
  }

  async generate(request: GenerationRequest): Promise<GenerationResult> {
    this.ensureOpen();
    const { sampling, signal } = request;
    validateRequest(request);
    signal?.throwIfAborted();
    // Compiled before the model is loaded, so a schema the grammar cannot honour is refused at once.
    const grammar: LlamaGrammar | undefined = request.responseFormat
      ? await abortable(
          this.pool.getLlama().then((llama) => this.grammars.get(llama, request.responseFormat!)),
          signal,
        )
      : undefined;
    this.ensureOpen();

    let loaded: LoadedModel | undefined;
    let prompt: number[] = [];
    while (!loaded) {
      let candidate = this.pool.get(request.model);
      while (!candidate) {
        const next = await this.admission.whileLoading(() => this.pool.load(request.model), signal);
        this.ensureOpen();
        // Unloaded while this request waited for it (its run deleted, its file changed): load it again.
        if (this.pool.isCurrent(next)) candidate = next;
      }
      // A long prompt is tokenized off the event loop: the model stays loaded meanwhile (a user of it).
      candidate.users++;
      try {
        prompt = await candidate.batcher.tokenize(request);
      } finally {
        candidate.users--;
      }
      this.ensureOpen();
      signal?.throwIfAborted();
      if (this.pool.isCurrent(candidate)) loaded = candidate;
    }
    const { batcher } = loaded;
    loaded.lastUsed = Date.now();
    // Synchronous from here to taking a sequence, so the free-sequence check and the queue bound cannot race.
    if (
      sampling.maxTokensMustFit === true &&
      sampling.maxTokens !== undefined &&
      prompt.length + sampling.maxTokens > batcher.contextSize
    )
      throw new ConduitError(
        "invalid_request",
        `The prompt is ${prompt.length} tokens and max_tokens asks for ${sampling.maxTokens} more; this model's ` +
          `context holds ${batcher.contextSize}. Lower max_tokens, or leave it out to use the room left.`,
        { param: "maxTokens" },
      );
    signal?.throwIfAborted();
    const ticket =
      batcher.takeSequence(prompt, loaded.adapter) ?? (await this.waitForSequence(loaded, signal));
    return batcher.start(ticket, prompt, request, grammar, loaded.adapter);
  }

  /** Waits in the bounded queue for one of the model's sequences; the model is not evicted meanwhile. */
  private async waitForSequence(m: LoadedModel, signal: AbortSignal | undefined): Promise<SequenceTicket> {
    m.users++;
    try {
      return await this.admission.whileQueued(() => m.batcher.waitForSequence(m.adapter, signal));
    } finally {
      m.users--;
    }
  }

  async embed(request: EmbeddingRequest): Promise<EmbeddingResult> {
    this.ensureOpen();
    const { signal } = request;
    if (request.inputs.length === 0)
      throw new ConduitError("invalid_request", "input must hold at least one text.", { param: "input" });
    signal?.throwIfAborted();
    let m = this.pool.get(request.model);
    while (!m) {
      const next = await this.admission.whileLoading(() => this.pool.load(request.model), signal);
      this.ensureOpen();
      if (this.pool.isCurrent(next)) m = next;
    }
    // Held until the vectors are out: the model (and its embedding context) is not unloaded meanwhile.
    m.users++;
    try {
      const embedder = await abortable(this.pool.embedder(m), signal);
      if (request.dimensions !== undefined && request.dimensions !== embedder.dimensions)
        throw new ConduitError(
          "invalid_request",
          `dimensions is ${request.dimensions}; this model's vectors have ${embedder.dimensions} (they are never shortened).`,
          { param: "dimensions" },
        );
      const inputs = await this.embeddingTokens(m, embedder, request.inputs);
      this.ensureOpen();
      signal?.throwIfAborted();
      const end = embedder.busy
        ? await this.admission.whileQueued(() => embedder.turn(signal))
        : await embedder.turn(signal);
      const started = Date.now();
      try {
        const vectors = await embedder.embed(inputs.tokens, m.adapter, signal);
        this.counters.embeddingTokens += inputs.count;
        this.admission.recordGeneration(Date.now() - started);
        return { vectors, dimensions: embedder.dimensions, promptTokens: inputs.count };
      } finally {
        end();
      }
    } finally {
      m.users--;
      this.pool.used(m);
    }
  }

  /**
   * The inputs' tokens, and how many the embedding context evaluates (with the BOS and end tokens it adds). A
   * text with more bytes than the context's tokens can stand for is refused before it is tokenized; texts past the
   * first {@link INLINE_PROMPT_BYTES} bytes of the request are tokenized off the event loop (2,048 short texts
   * add up).
   */
  private async embeddingTokens(
    m: LoadedModel,
    embedder: Embedder,
    inputs: (string | number[])[],
  ): Promise<{ tokens: number[][]; count: number }> {
    const { model } = m.base;
    const most = embedder.contextSize - 1;
    const { vocabularySize: vocabulary, maxTokenBytes } = embedder;
    const refuse = (message: string) => new ConduitError("invalid_request", message, { param: "input" });
    const tokens: number[][] = [];
    let count = 0;
    let inlineBytes = 0;
    for (const [i, input] of inputs.entries()) {
      this.ensureOpen();
      const at = inputs.length === 1 ? "input" : `input[${i}]`;
      let ids: number[];
      if (typeof input === "string") {
        const bytes = Buffer.byteLength(input);
        if (bytes === 0) throw refuse(`${at} is empty.`);
        if (Math.ceil(bytes / maxTokenBytes) > most)
          throw refuse(`${at} is ${bytes} bytes, more than the ${most} tokens this model embeds at once.`);
        inlineBytes += bytes;
        ids =
          (inlineBytes > INLINE_PROMPT_BYTES
            ? await this.tokenizer.tokenize(m.base.path, m.base.identity, { text: input, special: false })
            : undefined) ?? (model.tokenize(input, false) as number[]);
      } else {
        if (input.length === 0) throw refuse(`${at} is empty.`);
        const bad = input.find((t) => !Number.isInteger(t) || t < 0 || t >= vocabulary);
        if (bad !== undefined)
          throw refuse(`${at} holds token ${bad}, outside this model's vocabulary (0 to ${vocabulary - 1}).`);
        ids = input;
      }
      const length = embedder.inputLength(ids);
      if (length > most)
        throw refuse(`${at} is ${length} tokens; this model embeds at most ${most} tokens at once.`);
      count += length;
      if (count > MAX_EMBEDDING_TOKENS)
        throw refuse(`The inputs are more than ${MAX_EMBEDDING_TOKENS} tokens in all; send fewer at once.`);
      tokens.push(ids);
    }
    return { tokens, count };
  }

  async load(model: ModelRef): Promise<void> {
    this.ensureOpen();
    await this.pool.load(model);
  }

  unload(file: string): void {
    this.pool.forget(file);
  }

  loaded(): LoadedModelInfo[] {
    return this.pool.loaded().map((m) => ({
      id: m.ref.id,
      path: m.ref.path,
      ...(m.ref.lora ? { lora: m.ref.lora.path } : {}),
      sizeBytes: m.sizeBytes,
      activeSequences: this.pool.running(m),
      queuedRequests: m.users,
      contextSize: m.batcher.contextSize,
      lastUsedAt: new Date(m.lastUsed),
    }));
  }

  stats(): EngineStats {
    const models = this.pool.loaded();
    return {
      queueDepth: this.admission.queueDepth,
      activeGenerations: [...new Set(models.map((m) => m.batcher))].reduce((n, b) => n + b.activeCount, 0),
      loadedModels: models.length,
      loadedBases: this.pool.loadedBases,
      loadingModels: this.pool.loadingModels,
      completedGenerations: this.counters.completed,
      rejectedRequests: this.admission.rejected,
      promptTokens: this.counters.promptTokens,
      cachedPromptTokens: this.counters.cachedPromptTokens,
      completionTokens: this.counters.completionTokens,
      embeddingTokens: this.counters.embeddingTokens,
    };
  }

  accelerator(): Promise<AcceleratorInfo> {
    return this.pool.accelerator();
  }

  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    const shuttingDown = () => new ConduitError("unavailable", "The inference engine is shutting down.");
    // Queued and running generations fail at once; models still loading are refused by the pool.
    for (const m of [...this.pool.loaded(), ...this.pool.retired()]) m.batcher.close(shuttingDown);
    this.pool.closeEmbedders(shuttingDown);
    await Promise.all([this.pool.dispose(), this.grammars.dispose(), this.tokenizer.dispose()]);
  }

  private ensureOpen(): void {
    if (this.disposed) throw new ConduitError("unavailable", "The inference engine is shutting down.");
  }
}

function validateRequest(request: GenerationRequest): void {
  if ((request.messages === undefined) === (request.prompt === undefined))
    throw new ConduitError("invalid_request", "Give exactly one of `messages` and `prompt`.", {
      param: "messages",
    });
  validateSampling(request.sampling);
  if (
    request.logprobs !== undefined &&
    !(Number.isInteger(request.logprobs) && request.logprobs >= 0 && request.logprobs <= MAX_TOP_LOGPROBS)
  )
    throw new ConduitError(
      "invalid_request",
      `logprobs must ask for 0 to ${MAX_TOP_LOGPROBS} alternatives per token.`,
      { param: "logprobs" },
    );
}

function positiveInteger(value: number, name: string): number {
  if (!Number.isInteger(value) || value < 1)
    throw new RangeError(`${name} must be a positive integer, got ${value}`);
  return value;
}

function validateSampling(s: SamplingOptions): void {
  const bad = (param: DomainField, message: string) =>
    new ConduitError("invalid_request", message, { param });
  if (s.maxTokens !== undefined && (!Number.isInteger(s.maxTokens) || s.maxTokens < 1))
    throw bad("maxTokens", "max_tokens must be at least 1.");
  if (!(s.temperature >= 0)) throw bad("temperature", "temperature must be 0 or more.");
  if (!(s.topP > 0 && s.topP <= 1)) throw bad("topP", "top_p must be in (0, 1].");
  if (!Number.isInteger(s.topK) || s.topK < 0) throw bad("topK", "top_k must be a whole number, 0 or more.");
  if (!Number.isFinite(s.presencePenalty)) throw bad("presencePenalty", "presence_penalty must be a number.");
  if (!Number.isFinite(s.frequencyPenalty))
    throw bad("frequencyPenalty", "frequency_penalty must be a number.");
  if (s.seed !== undefined && !Number.isInteger(s.seed)) throw bad("seed", "seed must be an integer.");
}
