import crypto from "node:crypto";
import fs from "node:fs";
import { getLlama, GgufInsights, LlamaLogLevel, readGgufFileInfo } from "node-llama-cpp";
import type { Llama, LlamaContext, LlamaGrammar, LlamaModel, Token } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import { loadChatTemplate } from "../model/chatTemplate.ts";
import type { ChatTemplate, RenderedSegments } from "../model/chatTemplate.ts";
import {
  backendOf,
  describeAccelerator,
  gpuUnavailable,
  llamaGpuOption,
  modelGpuLayers,
  type AcceleratorInfo,
  type GpuLayers,
  type GpuSetting,
} from "./accelerator.ts";
import type { Engine, EngineStats, LoadedModelInfo } from "./Engine.ts";
import { bindNative } from "./nativeBatch.ts";
import { GrammarCache } from "./grammars.ts";
import type { NativeBinding, NativeGrammarState, NativeSampler } from "./nativeBatch.ts";
import { TextOutput } from "./TextOutput.ts";
import type {
  FinishReason,
  GenerationRequest,
  GenerationResult,
  ModelRef,
  SamplingOptions,
  TokenLogprob,
} from "./types.ts";

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
   * Generations that run at once per model, batched into one decode per token step. Each sequence has its own
   * KV cache of `contextSize` tokens. On 2 cores, 8 concurrent streams got about the same aggregate tokens/s
   * with 4 sequences as with 8 (bench/engine.ts). Defaults to `4`.
   */
  parallelSequences?: number;
  /**
   * Requests that may wait (for a free sequence or for their model to load) across all models; one more is
   * refused with `rate_limited` and a `retryAfter` estimate. Defaults to `32`.
   */
  maxQueue?: number;
  /**
   * Bytes of model files kept loaded. Loading a model that would exceed it first unloads the least recently
   * used models that have no running or queued generation; a model bigger than the budget still loads alone.
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
  /** Receives llama.cpp's warnings and errors. Defaults to `console.warn`. */
  logger?: (level: "error" | "warn", message: string) => void;
}

/** Decode steps with at least this many tokens run on `promptThreads`. */
export const PROMPT_BATCH_TOKENS = 32;

const DEFAULTS = {
  threads: 1,
  contextSize: 2048,
  parallelSequences: 4,
  maxQueue: 32,
  memoryBudgetBytes: 8 * 1024 ** 3,
  batchSize: 512,
} as const;

/** Creates the node-llama-cpp engine. Nothing native is loaded until the first `generate` or `load`. */
export function createLlamaEngine(options: LlamaEngineOptions = {}): Engine {
  return new LlamaEngine(options);
}

interface Waiter {
  resolve(sequenceId: number): void;
  reject(error: unknown): void;
}

/** One running generation on one sequence of a loaded model. */
interface Generation {
  sequenceId: number;
  sampler: NativeSampler;
  /** Tokens still to be evaluated: the prompt (in chunks), then each sampled token. */
  pending: number[];
  /** Position of the next token in the sequence. */
  position: number;
  /** The tokens in the sequence's KV cache (`position` of them), kept for the next request on it. */
  fed: number[];
  /** Prompt tokens found in the KV cache already (a common prefix with the sequence's last request). */
  cachedTokens: number;
  /** Set when a decode failed: the KV cache is in an unknown state and must be cleared. */
  cacheInvalid: boolean;
  output: TextOutput;
  completionTokens: number;
  promptTokens: number;
  maxTokens: number;
  onText: ((text: string, logprobs?: TokenLogprob[]) => void) | undefined;
  /** Set when the request asked for log probabilities. */
  logprobs: LogprobState | undefined;
  /** Set once the caller has its answer (finished, failed or aborted); the slot is released by the step loop. */
  settled: boolean;
  resolve(result: GenerationResult): void;
  reject(error: unknown): void;
  startedAt: number;
}

/** Most alternatives per token a request may ask for (OpenAI's `top_logprobs` limit). */
export const MAX_TOP_LOGPROBS = 20;

/** A generation's log probabilities: a greedy sampler without penalties reads the raw distribution. */
interface LogprobState {
  top: number;
  sampler: NativeSampler;
  /** One entry per generated token, with where its text starts in the output (`TextOutput.decodedLength`). */
  entries: { entry: TokenLogprob; start: number }[];
  /** Entries already streamed. */
  sent: number;
  /** The entry of the token just sampled, until `accept` takes it. */
  next: TokenLogprob | undefined;
}

/** Bytes of host memory and of GPU memory. */
interface Memory {
  host: number;
  gpu: number;
}

/** Base weights in memory, shared by every context (the bare model and each LoRA adapter) that uses them. */
interface LoadedBase {
  path: string;
  model: LlamaModel;
  /** Host memory the weights take (the file's size on the CPU). */
  sizeBytes: number;
  /** GPU memory the offloaded layers take (`0` on the CPU). */
  gpuBytes: number;
  /** Contexts (LoadedModel entries) on these weights; the weights are released with the last one. */
  users: number;
}

/**
 * One servable model: a context with its sequences on a loaded base, with a LoRA adapter applied when the
 * ref has one. llama.cpp applies adapters per context, so each adapter in use has its own context (and KV
 * cache) while the weights are loaded once: bench/README.md §LoRA serving measures this against switching.
 */
interface LoadedModel {
  key: string;
  ref: ModelRef;
  /** The adapter file's size for a LoRA model, else the base's (the base itself is counted once, in `bases`). */
  sizeBytes: number;
  /** Where the adapter's bytes are counted: GPU memory when the backend is a GPU, else host memory. */
  adapterOnGpu: boolean;
  base: LoadedBase;
  model: LlamaModel;
  context: LlamaContext;
  native: NativeBinding;
  /** Read at load, so formatting a request never waits. */
  template: ChatTemplate;
  contextSize: number;
  addBos: boolean;
  bos: number | undefined;
  freeSequences: number[];
  /** The tokens still in the KV cache of each free sequence (absent: empty), for prefix reuse. */
  cached: Map<number, number[]>;
  active: Set<Generation>;
  waiters: Waiter[];
  lastUsed: number;
  stepping: boolean;
  /** Requests waiting for one of this model's sequences; such a model is never evicted. */
  users: number;
  /** Resolves when the step loop has stopped (used by unload and dispose). */
  idle: Promise<void>;
  markIdle: () => void;
}

class LlamaEngine implements Engine {
  private readonly threads: number;
  private readonly promptThreads: number;
  private readonly contextSize: number;
  private readonly parallel: number;
  private readonly maxQueue: number;
  private readonly memoryBudget: number;
  private readonly gpu: GpuSetting;
  private readonly gpuLayers: GpuLayers;
  /** Resolved with the backend (`undefined` until then; unused on the CPU). */
  private gpuMemoryBudget: number | undefined;
  private readonly batchSize: number;
  private readonly logger: (level: "error" | "warn", message: string) => void;

  private llama: Promise<Llama> | undefined;
  private readonly ownsLlama: boolean;
  private readonly grammars = new GrammarCache();
  private readonly models = new Map<string, LoadedModel>();
  private readonly loading = new Map<string, Promise<LoadedModel>>();
  private readonly bases = new Map<string, LoadedBase>();
  private readonly loadingBases = new Map<string, Promise<LoadedBase>>();
  private waiting = 0;
  /** Requests waiting for their model to load. */
  private loadWaiting = 0;
  private disposed = false;
  private readonly counters = {
    completed: 0,
    rejected: 0,
    promptTokens: 0,
    cachedPromptTokens: 0,
    completionTokens: 0,
  };
  /** Moving average of generation time in ms, for `retryAfter`. */
  private averageGenerationMs = 1000;

  constructor(options: LlamaEngineOptions) {
    this.threads = positiveInteger(options.threads ?? DEFAULTS.threads, "threads");
    this.promptThreads = positiveInteger(options.promptThreads ?? this.threads, "promptThreads");
    this.contextSize = positiveInteger(options.contextSize ?? DEFAULTS.contextSize, "contextSize");
    this.parallel = positiveInteger(
      options.parallelSequences ?? DEFAULTS.parallelSequences,
      "parallelSequences",
    );
    this.maxQueue = Math.max(0, Math.floor(options.maxQueue ?? DEFAULTS.maxQueue));
    this.memoryBudget = options.memoryBudgetBytes ?? DEFAULTS.memoryBudgetBytes;
    this.gpu = options.gpu === false ? "off" : (options.gpu ?? "off");
    this.gpuLayers = options.gpuLayers ?? "all";
    this.gpuMemoryBudget = options.gpuMemoryBudgetBytes;
    this.batchSize = positiveInteger(options.batchSize ?? DEFAULTS.batchSize, "batchSize");
    this.logger = options.logger ?? ((level, message) => console.warn(`[llama.cpp ${level}] ${message}`));
    this.ownsLlama = options.llama === undefined;
    if (options.llama) this.llama = Promise.resolve(options.llama);
  }

  async generate(request: GenerationRequest): Promise<GenerationResult> {
    this.ensureOpen();
    const { sampling, signal } = request;
    if ((request.messages === undefined) === (request.prompt === undefined))
      throw new ConduitError("invalid_request", "Give exactly one of `messages` and `prompt`.", {
        param: "messages",
      });
    validateSampling(sampling);
    if (
      request.logprobs !== undefined &&
      !(Number.isInteger(request.logprobs) && request.logprobs >= 0 && request.logprobs <= MAX_TOP_LOGPROBS)
    )
      throw new ConduitError(
        "invalid_request",
        `logprobs must ask for 0 to ${MAX_TOP_LOGPROBS} alternatives per token.`,
        { param: "logprobs" },
      );
    signal?.throwIfAborted();
    // Compiled before the model is loaded, so a schema the grammar cannot honour is refused at once.
    const grammar = request.responseFormat
      ? await abortable(
          this.getLlama().then((llama) => this.grammars.get(llama, request.responseFormat!)),
          signal,
        )
      : undefined;
    this.ensureOpen();

    const ready = this.models.get(modelKey(request.model));
    let loaded: LoadedModel;
    if (ready) loaded = ready;
    else {
      // A burst for a cold model is bounded too: as many as will find a sequence once it is loaded, plus
      // the queue. (Counting them against the queue alone would refuse even the first request when
      // maxQueue is 0.)
      if (this.loadWaiting >= this.maxQueue + this.parallel) this.refuse();
      this.loadWaiting++;
      try {
        loaded = await abortable(this.loadModel(request.model), signal);
      } finally {
        this.loadWaiting--;
      }
      this.ensureOpen();
    }
    loaded.lastUsed = Date.now();
    // Synchronous from here to taking a sequence, so the free-sequence check and the queue bound cannot race.
    const prompt = this.tokenizeRequest(loaded, request);
    if (
      sampling.maxTokensMustFit === true &&
      sampling.maxTokens !== undefined &&
      prompt.length + sampling.maxTokens > loaded.contextSize
    )
      throw new ConduitError(
        "invalid_request",
        `The prompt is ${prompt.length} tokens and max_tokens asks for ${sampling.maxTokens} more; this model's ` +
          `context holds ${loaded.contextSize}. Lower max_tokens, or leave it out to use the room left.`,
        { param: "max_tokens" },
      );
    signal?.throwIfAborted();
    let sequenceId = loaded.waiters.length === 0 ? takeSequence(loaded, prompt) : undefined;
    if (sequenceId === undefined) {
      this.admitToQueue();
      loaded.users++;
      try {
        sequenceId = await this.waitForSequence(loaded, signal);
      } finally {
        this.waiting--;
        loaded.users--;
      }
    }
    return this.start(loaded, sequenceId, prompt, request, grammar);
  }

  /** Counts one more waiting request, or refuses it with `rate_limited` when the queue is full. */
  private admitToQueue(): void {
    if (this.waiting >= this.maxQueue) this.refuse();
    this.waiting++;
  }

  private refuse(): never {
    this.counters.rejected++;
    throw new ConduitError("rate_limited", "Too many generations are waiting; retry later.", {
      retryAfter: this.retryAfterSeconds(),
    });
  }

  async load(model: ModelRef): Promise<void> {
    this.ensureOpen();
    await this.loadModel(model);
  }

  loaded(): LoadedModelInfo[] {
    return [...this.models.values()].map((m) => ({
      id: m.ref.id,
      path: m.ref.path,
      ...(m.ref.lora ? { lora: m.ref.lora.path } : {}),
      sizeBytes: m.sizeBytes,
      activeSequences: m.active.size,
      queuedRequests: m.waiters.length,
      contextSize: m.contextSize,
      lastUsedAt: new Date(m.lastUsed),
    }));
  }

  stats(): EngineStats {
    let active = 0;
    for (const m of this.models.values()) active += m.active.size;
    return {
      queueDepth: this.waiting + this.loadWaiting,
      activeGenerations: active,
      loadedModels: this.models.size,
      loadedBases: this.bases.size,
      loadingModels: this.loading.size,
      completedGenerations: this.counters.completed,
      rejectedRequests: this.counters.rejected,
      promptTokens: this.counters.promptTokens,
      cachedPromptTokens: this.counters.cachedPromptTokens,
      completionTokens: this.counters.completionTokens,
    };
  }

  async dispose(): Promise<void> {
    if (this.disposed) return;
    this.disposed = true;
    const shuttingDown = () => new ConduitError("unavailable", "The inference engine is shutting down.");
    await Promise.allSettled(this.loading.values());
    for (const m of this.models.values()) {
      for (const waiter of m.waiters.splice(0)) waiter.reject(shuttingDown());
      for (const gen of m.active) settle(gen, () => gen.reject(shuttingDown()));
    }
    await Promise.all([...this.models.values()].map((m) => this.unload(m)));
    const llama = this.llama;
    this.llama = undefined;
    if (llama && this.ownsLlama) await (await llama.catch(() => undefined))?.dispose();
  }

  // ---- loading ----

  private getLlama(): Promise<Llama> {
    this.llama ??= this.startLlama();
    return this.llama;
  }

  private async startLlama(): Promise<Llama> {
    let llama: Llama;
    try {
      llama = await this.createLlama();
    } catch (error) {
      // `auto` never fails for want of a GPU (node-llama-cpp falls back to the CPU); `cuda`/`vulkan` do.
      throw this.gpu === "cuda" || this.gpu === "vulkan" ? gpuUnavailable(this.gpu, error) : error;
    }
    if (backendOf(llama) !== "cpu" && this.gpuMemoryBudget === undefined) {
      const vram = await llama.getVramState();
      this.gpuMemoryBudget = Math.floor(vram.free * 0.9);
    }
    return llama;
  }

  async accelerator(): Promise<AcceleratorInfo> {
    return describeAccelerator(await this.getLlama(), this.gpu, this.gpuLayers);
  }

  private createLlama(): Promise<Llama> {
    return getLlama({
      gpu: llamaGpuOption(this.gpu),
      // Prebuilt binaries only: never compile llama.cpp (or download anything) inside a server.
      build: "never",
      // 0 turns off node-llama-cpp's thread splitter, so `threads` is exactly what llama.cpp uses.
      maxThreads: 0,
      logLevel: LlamaLogLevel.warn,
      logger: (level, message) => {
        const text = message.trim();
        if (text === "") return;
        if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) this.logger("error", text);
        else if (level === LlamaLogLevel.warn) this.logger("warn", text);
      },
    });
  }

  /**
   * What loading `file` costs: on the CPU its size (the weights are mapped); on a GPU node-llama-cpp's estimate
   * of host and GPU memory with `gpuLayers` offloaded, so each budget counts its own memory.
   */
  private async memoryNeed(file: string, fileBytes: number): Promise<Memory> {
    const llama = await this.getLlama();
    const backend = backendOf(llama);
    if (backend === "cpu") return { host: fileBytes, gpu: 0 };
    const insights = await GgufInsights.from(await readGgufFileInfo(file), llama);
    const layers = modelGpuLayers(backend, this.gpuLayers);
    const estimate = await insights.estimateModelResourceRequirementsV2({
      gpuLayers: layers === "max" ? insights.totalLayers : Math.min(layers, insights.totalLayers),
    });
    return { host: estimate.cpuRam, gpu: estimate.gpuVram };
  }

  /** Loads a model once; concurrent callers share the same promise. */
  private loadModel(ref: ModelRef): Promise<LoadedModel> {
    const key = modelKey(ref);
    const loaded = this.models.get(key);
    if (loaded) return Promise.resolve(loaded);
    let promise = this.loading.get(key);
    if (!promise) {
      promise = this.doLoad(ref).finally(() => this.loading.delete(key));
      this.loading.set(key, promise);
    }
    return promise;
  }

  private async doLoad(ref: ModelRef): Promise<LoadedModel> {
    const sizeOf = (file: string) => {
      try {
        return fs.statSync(file).size;
      } catch (error) {
        throw new ConduitError("model_not_found", `The model '${ref.id}' does not exist.`, {
          param: "model",
          cause: error,
        });
      }
    };
    const baseBytes = sizeOf(ref.path);
    const adapterBytes = ref.lora ? sizeOf(ref.lora.path) : 0;
    // A base already in memory costs nothing more; an adapter costs its own file.
    const sizeBytes = ref.lora ? adapterBytes : baseBytes;
    let base: LoadedBase | undefined;
    let context: LlamaContext | undefined;
    let adapterOnGpu = false;
    try {
      const need = this.bases.has(ref.path)
        ? { host: 0, gpu: 0 }
        : await this.memoryNeed(ref.path, baseBytes);
      adapterOnGpu = backendOf(await this.getLlama()) !== "cpu";
      await this.makeRoomFor({
        host: need.host + (adapterOnGpu ? 0 : adapterBytes),
        gpu: need.gpu + (adapterOnGpu ? adapterBytes : 0),
      });
      base = await this.acquireBase(ref.path, need);
      const model = base.model;
      const contextSize = Math.max(
        16,
        Math.min(this.contextSize, model.trainContextSize || this.contextSize),
      );
      context = await model.createContext({
        contextSize,
        sequences: this.parallel,
        threads: this.threads,
        batchSize: Math.min(this.batchSize, contextSize),
        // One loaded context serves many requests; do not fail over to a smaller size silently.
        failedCreationRemedy: false,
        ...(ref.lora
          ? { lora: { adapters: [{ filePath: ref.lora.path, scale: ref.lora.scale ?? 1 }] } }
          : {}),
      });
      const template = await loadChatTemplate(ref);
      const llama = await this.getLlama();
      const native = bindNative(llama, model, context);
      native.context.setThreads(this.threads);
      const entry: LoadedModel = {
        key: modelKey(ref),
        ref,
        sizeBytes,
        adapterOnGpu,
        base,
        model,
        context,
        native,
        template,
        contextSize: context.contextSize,
        addBos: model.tokens.shouldPrependBosToken,
        bos: model.tokens.bos ?? undefined,
        freeSequences: Array.from({ length: this.parallel }, (_, i) => i),
        cached: new Map(),
        active: new Set(),
        waiters: [],
        lastUsed: Date.now(),
        stepping: false,
        users: 0,
        idle: Promise.resolve(),
        markIdle: () => {},
      };
      if (this.disposed) throw new ConduitError("unavailable", "The inference engine is shutting down.");
      this.models.set(entry.key, entry);
      return entry;
    } catch (error) {
      await context?.dispose().catch(() => {});
      if (base) await this.releaseBase(base);
      if (error instanceof ConduitError) throw error;
      this.logger(
        "error",
        `loading model '${ref.id}' failed: ${error instanceof Error ? error.message : error}`,
      );
      throw new ConduitError("unavailable", `The model '${ref.id}' could not be loaded.`, { cause: error });
    }
  }

  /** The base weights at `path`, loaded once and counted as one more user. */
  private async acquireBase(path: string, need: Memory): Promise<LoadedBase> {
    let base = this.bases.get(path);
    if (!base) {
      let loading = this.loadingBases.get(path);
      if (!loading) {
        loading = (async () => {
          const llama = await this.getLlama();
          const model = await llama.loadModel({
            modelPath: path,
            gpuLayers: modelGpuLayers(backendOf(llama), this.gpuLayers),
          });
          const loaded: LoadedBase = { path, model, sizeBytes: need.host, gpuBytes: need.gpu, users: 0 };
          this.bases.set(path, loaded);
          return loaded;
        })().finally(() => this.loadingBases.delete(path));
        this.loadingBases.set(path, loading);
      }
      base = await loading;
    }
    base.users++;
    return base;
  }

  /** One user fewer; the weights are freed with the last. */
  private async releaseBase(base: LoadedBase): Promise<void> {
    base.users--;
    if (base.users > 0) return;
    this.bases.delete(base.path);
    await base.model.dispose().catch(() => {});
  }

  /**
   * Unloads least recently used idle models until `incoming` more bytes fit both budgets: host memory
   * (`memoryBudgetBytes`) and GPU memory (`gpuMemoryBudgetBytes`, on a GPU backend).
   */
  private async makeRoomFor(incoming: Memory): Promise<void> {
    const used: Memory = { host: 0, gpu: 0 };
    for (const b of this.bases.values()) {
      used.host += b.sizeBytes;
      used.gpu += b.gpuBytes;
    }
    for (const m of this.models.values())
      if (m.ref.lora) used[m.adapterOnGpu ? "gpu" : "host"] += m.sizeBytes;
    const gpuBudget = this.gpuMemoryBudget ?? Infinity;
    const fits = () =>
      used.host + incoming.host <= this.memoryBudget &&
      (incoming.gpu === 0 || used.gpu + incoming.gpu <= gpuBudget);
    const idle = [...this.models.values()]
      .filter((m) => m.active.size === 0 && m.waiters.length === 0 && m.users === 0)
      .sort((a, b) => a.lastUsed - b.lastUsed);
    for (const victim of idle) {
      if (fits()) break;
      // Unloading awaits; a victim may have been picked up by a request meanwhile.
      if (victim.active.size > 0 || victim.waiters.length > 0 || victim.users > 0) continue;
      if (victim.ref.lora) used[victim.adapterOnGpu ? "gpu" : "host"] -= victim.sizeBytes;
      // The base's bytes come back only when its last context goes.
      if (victim.base.users === 1) {
        used.host -= victim.base.sizeBytes;
        used.gpu -= victim.base.gpuBytes;
      }
      await this.unload(victim);
    }
  }

  private async unload(m: LoadedModel): Promise<void> {
    this.models.delete(m.key);
    await m.idle;
    await m.context.dispose().catch(() => {});
    await this.releaseBase(m.base);
  }

  // ---- admission ----

  private tokenizeRequest(m: LoadedModel, request: GenerationRequest): number[] {
    // Special tokens are parsed in the template's text (chat templates write <|im_start|> as text) and in a
    // raw prompt (its writer controls the whole text), never in a message's content (see chatTokens).
    const tokens =
      request.messages !== undefined
        ? chatTokens(
            m.template.renderSegments(request.messages, {
              addGenerationPrompt: true,
              ...(request.tools ? { tools: request.tools } : {}),
            }),
            (text, special) => m.model.tokenize(text, special) as number[],
          )
        : (m.model.tokenize(request.prompt ?? "", true) as number[]);
    if (m.addBos && m.bos !== undefined && tokens[0] !== m.bos) tokens.unshift(m.bos);
    const param = request.messages !== undefined ? "messages" : "prompt";
    if (tokens.length === 0) throw new ConduitError("invalid_request", "The prompt is empty.", { param });
    if (tokens.length >= m.contextSize)
      throw new ConduitError(
        "invalid_request",
        `The prompt is ${tokens.length} tokens; this model's context holds ${m.contextSize}.`,
        { param },
      );
    // max_tokens is a cap, as in llama-server, never refused for the context size: a generation stops with
    // finish_reason "length" when the context is full (`start` caps it), so the default of 256 works on a
    // model with a 128-token context.
    return tokens;
  }

  private waitForSequence(m: LoadedModel, signal: AbortSignal | undefined): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      const onAbort = () => {
        const index = m.waiters.indexOf(waiter);
        if (index !== -1) m.waiters.splice(index, 1);
        reject(signal?.reason);
      };
      const waiter: Waiter = {
        resolve: (id) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(id);
        },
        reject: (error) => {
          signal?.removeEventListener("abort", onAbort);
          reject(error);
        },
      };
      m.waiters.push(waiter);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /**
   * Frees a generation's sequence. Only called between decode steps (the KV cache is not in use). What the
   * sequence evaluated stays in its KV cache, so that a next request sharing a prefix with it (the next turn
   * of a chat, the same system prompt) evaluates only what is new.
   */
  private releaseSequence(m: LoadedModel, gen: Generation): void {
    m.active.delete(gen);
    gen.sampler.dispose();
    gen.logprobs?.sampler.dispose();
    if (gen.cacheInvalid || gen.fed.length === 0) {
      m.native.context.disposeSequence(gen.sequenceId);
      m.cached.delete(gen.sequenceId);
    } else m.cached.set(gen.sequenceId, gen.fed);
    this.returnSequence(m, gen.sequenceId);
  }

  /**
   * Keeps the longest prefix of the sequence's KV cache that `prompt` starts with (at most all but the
   * prompt's last token, which is evaluated again for its logits) and drops the rest. Returns its length.
   */
  private reusePrefix(m: LoadedModel, sequenceId: number, prompt: number[]): number {
    const cached = m.cached.get(sequenceId) ?? [];
    m.cached.delete(sequenceId);
    const keep = Math.min(commonPrefix(cached, prompt), prompt.length - 1);
    if (keep === cached.length) return keep;
    // Models whose cache cannot drop a tail (recurrent ones) start again from an empty sequence.
    if (keep > 0 && m.native.context.removeTokenCellsFromSequence(sequenceId, keep, -1)) return keep;
    m.native.context.disposeSequence(sequenceId);
    return 0;
  }

  /** Hands a free sequence to the next waiter, or back to the pool. */
  private returnSequence(m: LoadedModel, sequenceId: number): void {
    const next = m.waiters.shift();
    if (next && !this.disposed) next.resolve(sequenceId);
    else m.freeSequences.push(sequenceId);
  }

  // ---- generation ----

  private start(
    m: LoadedModel,
    sequenceId: number,
    prompt: number[],
    request: GenerationRequest,
    grammar: LlamaGrammar | undefined,
  ) {
    const { sampling, signal } = request;
    const model = m.model;
    // max_tokens is a cap: the generation also ends when the context is full (absent: only then).
    const maxTokens = Math.min(sampling.maxTokens ?? Infinity, m.contextSize - prompt.length);
    let sampler: NativeSampler;
    let grammarState: NativeGrammarState | undefined;
    let logprobs: LogprobState | undefined;
    try {
      // One grammar state per generation: the sampler advances it with every token it samples.
      grammarState = grammar ? m.native.createGrammarState(grammar) : undefined;
      sampler = m.native.createSampler();
      if (request.logprobs !== undefined) {
        // Greedy, no penalties, no grammar: its candidates are the raw logits of the whole vocabulary.
        const raw = m.native.createSampler();
        raw.applyConfig({
          temperature: 0,
          topK: 0,
          topP: 1,
          seed: 0,
          repeatPenalty: 1,
          repeatPenaltyMaxTokens: 0,
          repeatPenaltyTokens: new Uint32Array(0),
          repeatPenaltyPresencePenalty: 0,
          repeatPenaltyFrequencyPenalty: 0,
        });
        logprobs = { top: request.logprobs, sampler: raw, entries: [], sent: 0, next: undefined };
      }
    } catch (error) {
      logprobs?.sampler.dispose();
      this.returnSequence(m, sequenceId);
      throw error;
    }
    sampler.applyConfig({
      temperature: sampling.temperature,
      topK: sampling.topK,
      topP: sampling.topP,
      seed: sampling.seed ?? crypto.randomInt(0, 2 ** 31),
      // OpenAI's presence/frequency penalties are llama.cpp's additive penalties (logit -= count * frequency +
      // (count > 0) * presence), applied to the tokens generated so far; the multiplicative repeat penalty stays
      // off (1). The history covers the whole completion; the sampler adds each sampled token itself.
      repeatPenalty: 1,
      // Capped like max_tokens: the native sampler allocates a history of this many tokens.
      repeatPenaltyMaxTokens: Math.max(1, maxTokens),
      repeatPenaltyTokens: new Uint32Array(0),
      repeatPenaltyPresencePenalty: sampling.presencePenalty,
      repeatPenaltyFrequencyPenalty: sampling.frequencyPenalty,
      ...(grammarState ? { grammarEvaluationState: grammarState } : {}),
    });
    // A chat answer on the fallback ChatML template also ends at its turn markers: a model without ChatML
    // control tokens writes them as text (see CHATML_STOP_STRINGS). Raw prompts are left alone.
    const turnStops = request.messages !== undefined ? m.template.stopStrings : [];
    // A JSON grammar ends its value with whitespace and a run of newlines (node-llama-cpp's stop trigger),
    // which is not part of the answer.
    const grammarStops = (grammar?.stopGenerationTriggers ?? []).flatMap((t) =>
      typeof t === "string" ? [t] : Array.isArray(t) ? [] : [t.toString()],
    );
    const output = new TextOutput(
      (tokens, previous) => model.detokenize(tokens as Token[], false, previous as Token[]),
      [...(sampling.stop ?? []), ...turnStops, ...grammarStops],
      grammar?.trimWhitespaceSuffix === true,
    );
    let reused: number;
    try {
      reused = this.reusePrefix(m, sequenceId, prompt);
    } catch (error) {
      sampler.dispose();
      logprobs?.sampler.dispose();
      m.native.context.disposeSequence(sequenceId);
      this.returnSequence(m, sequenceId);
      throw error;
    }
    return new Promise<GenerationResult>((resolve, reject) => {
      const gen: Generation = {
        sequenceId,
        sampler,
        pending: prompt.slice(reused),
        position: reused,
        fed: prompt.slice(0, reused),
        cachedTokens: reused,
        cacheInvalid: false,
        output,
        completionTokens: 0,
        promptTokens: prompt.length,
        maxTokens,
        onText: request.onText,
        logprobs,
        settled: false,
        resolve,
        reject,
        startedAt: performance.now(),
      };
      if (signal) {
        // Answer at once; the step loop frees the sequence before its next decode.
        const onAbort = () => settle(gen, () => reject(signal.reason));
        signal.addEventListener("abort", onAbort, { once: true });
        const cleanup = () => signal.removeEventListener("abort", onAbort);
        gen.resolve = (result) => (cleanup(), resolve(result));
        gen.reject = (error) => (cleanup(), reject(error));
      }
      m.active.add(gen);
      this.ensureStepping(m);
    });
  }

  private ensureStepping(m: LoadedModel): void {
    if (m.stepping) return;
    m.stepping = true;
    m.idle = new Promise<void>((resolve) => (m.markIdle = resolve));
    void this.stepLoop(m)
      .catch((error: unknown) => {
        // Not a decode error (those fail only their batch): something is badly wrong; fail everything running.
        this.logger("error", `step loop failed: ${error instanceof Error ? error.message : error}`);
        for (const gen of m.active) {
          settle(gen, () => gen.reject(error));
          try {
            this.releaseSequence(m, gen);
          } catch {
            m.active.delete(gen);
          }
        }
      })
      .finally(() => {
        m.stepping = false;
        m.markIdle();
        // A generation may have joined after the loop's last check.
        if (m.active.size > 0 && !this.disposed) this.ensureStepping(m);
      });
  }

  /**
   * Continuous batching: each step evaluates, in one decode, the next token of every generating sequence plus
   * chunks of new prompts (up to `batchSize` tokens), then samples every sequence that produced logits.
   */
  private async stepLoop(m: LoadedModel): Promise<void> {
    const ctx = m.native.context;
    while (m.active.size > 0) {
      for (const gen of m.active) if (gen.settled) this.releaseSequence(m, gen);
      if (m.active.size === 0) break;

      // Generating sequences (one pending token) first, so a long new prompt cannot stall running streams.
      const order = [...m.active].sort((a, b) => a.pending.length - b.pending.length);
      const batch: { gen: Generation; tokens: number[]; logits: boolean }[] = [];
      let budget = Math.min(this.batchSize, m.context.batchSize);
      for (const gen of order) {
        if (budget === 0) break;
        const take = Math.min(gen.pending.length, budget);
        const tokens = gen.pending.slice(0, take);
        batch.push({ gen, tokens, logits: take === gen.pending.length });
        budget -= take;
      }
      const total = batch.reduce((n, item) => n + item.tokens.length, 0);
      // Only changes a field of the llama.cpp context when the count differs; no threads are kept between steps.
      if (this.promptThreads !== this.threads)
        ctx.setThreads(total >= PROMPT_BATCH_TOKENS ? this.promptThreads : this.threads);

      const sampleAt: { gen: Generation; index: number }[] = [];
      try {
        ctx.initBatch(total);
        for (const item of batch) {
          const logitIndexes = item.logits ? Uint32Array.of(item.tokens.length - 1) : new Uint32Array(0);
          const indexes = ctx.addToBatch(
            item.gen.sequenceId,
            item.gen.position,
            Uint32Array.from(item.tokens),
            logitIndexes,
          );
          item.gen.position += item.tokens.length;
          item.gen.pending = item.gen.pending.slice(item.tokens.length);
          item.gen.fed.push(...item.tokens);
          const index = indexes[0];
          if (item.logits && index !== undefined) sampleAt.push({ gen: item.gen, index });
        }
        await ctx.decodeBatch();
        // Sampling runs on libuv's pool, one job per sequence, concurrently.
        const tokens = await Promise.all(
          sampleAt.map(({ gen, index }) =>
            gen.logprobs ? this.sampleWithLogprobs(m, gen, index) : ctx.sampleToken(index, gen.sampler),
          ),
        );
        for (let i = 0; i < sampleAt.length; i++) this.accept(m, sampleAt[i]!.gen, tokens[i]!);
      } catch (error) {
        // A failed decode leaves these sequences in an unknown state: fail them (and free their slots).
        for (const item of batch) {
          item.gen.cacheInvalid = true;
          settle(item.gen, () => item.gen.reject(error));
        }
        this.logger("error", `decode failed: ${error instanceof Error ? error.message : error}`);
      }
    }
  }

  /**
   * Samples `gen`'s next token, then reads its log probability and the top alternatives from the same logits
   * with the generation's raw sampler (a second native call, only for requests that ask).
   */
  private async sampleWithLogprobs(m: LoadedModel, gen: Generation, index: number): Promise<number> {
    const state = gen.logprobs!;
    const ctx = m.native.context;
    const token = await ctx.sampleToken(index, gen.sampler);
    state.next = undefined;
    if (token < 0 || m.model.isEogToken(token as Token)) return token;
    const [, , , pairs, weight] = await ctx.sampleToken(
      index,
      state.sampler,
      false,
      false,
      [[token], false, false, false, Math.max(1, state.top)],
      true,
    );
    if (!pairs || pairs.length < 4 || weight === undefined)
      throw new Error("the native sampler returned no logits");
    // Pairs: the top logits, highest first, then the sampled token's. log p = logit − max − log Σ exp(l − max).
    const logZ = pairs[1]! + Math.log(weight);
    const topCount = Math.min(state.top, pairs.length / 2 - 1);
    // Token text in context, so a SentencePiece word start keeps its space.
    const previous = gen.fed.slice(-4) as Token[];
    const text = (t: number) => m.model.detokenize([t as Token], true, previous);
    const top: TokenLogprob["top"] = [];
    for (let i = 0; i < topCount; i++)
      top.push({ token: text(pairs[2 * i]!), logprob: pairs[2 * i + 1]! - logZ });
    state.next = { token: text(token), logprob: pairs[2 * topCount + 1]! - logZ, top };
    return token;
  }

  private accept(m: LoadedModel, gen: Generation, token: number): void {
    if (gen.settled) return;
    if (token < 0 || m.model.isEogToken(token as Token)) return this.finish(m, gen, "stop");
    gen.completionTokens++;
    if (gen.logprobs?.next)
      gen.logprobs.entries.push({ entry: gen.logprobs.next, start: gen.output.decodedLength });
    const piece = gen.output.push(token);
    if (piece !== "" || gen.logprobs) this.stream(gen, piece);
    if (gen.settled) return;
    if (gen.output.stopped) return this.finish(m, gen, "stop");
    if (gen.completionTokens >= gen.maxTokens) return this.finish(m, gen, "length");
    gen.pending = [token];
  }

  /** Streams `piece` with the log probabilities of the tokens whose text now starts in the streamed text. */
  private stream(gen: Generation, piece: string): void {
    if (!gen.onText) return;
    const logprobs = gen.logprobs ? this.takeLogprobs(gen.logprobs, gen.output.text.length) : undefined;
    if (piece === "" && (logprobs === undefined || logprobs.length === 0)) return;
    try {
      gen.onText(piece, logprobs);
    } catch (error) {
      // A throwing consumer ends its own generation, not the step loop.
      settle(gen, () => gen.reject(error));
    }
  }

  /** The entries not streamed yet whose text starts before `end`. */
  private takeLogprobs(state: LogprobState, end: number): TokenLogprob[] {
    const taken: TokenLogprob[] = [];
    while (state.sent < state.entries.length && state.entries[state.sent]!.start < end)
      taken.push(state.entries[state.sent++]!.entry);
    return taken;
  }

  private finish(m: LoadedModel, gen: Generation, finishReason: FinishReason): void {
    const rest = gen.output.finish();
    if (rest !== "") this.stream(gen, rest);
    if (gen.settled) return;
    const end = gen.output.text.length;
    const result: GenerationResult = {
      text: gen.output.text,
      finishReason,
      promptTokens: gen.promptTokens,
      cachedTokens: gen.cachedTokens,
      completionTokens: gen.completionTokens,
      // Tokens whose text is in the answer (not those of a stop sequence or trimmed whitespace).
      ...(gen.logprobs
        ? { logprobs: gen.logprobs.entries.filter((e) => e.start < end).map((e) => e.entry) }
        : {}),
    };
    this.counters.completed++;
    this.counters.promptTokens += result.promptTokens;
    this.counters.cachedPromptTokens += result.cachedTokens;
    this.counters.completionTokens += result.completionTokens;
    const elapsed = performance.now() - gen.startedAt;
    this.averageGenerationMs = this.averageGenerationMs * 0.8 + elapsed * 0.2;
    m.lastUsed = Date.now();
    settle(gen, () => gen.resolve(result));
    this.releaseSequence(m, gen);
  }

  private retryAfterSeconds(): number {
    const rounds = Math.ceil((this.waiting + 1) / this.parallel);
    return Math.min(60, Math.max(1, Math.ceil((rounds * this.averageGenerationMs) / 1000)));
  }

  private ensureOpen(): void {
    if (this.disposed) throw new ConduitError("unavailable", "The inference engine is shutting down.");
  }
}

/**
 * A chat prompt's tokens, with control-token text in the messages kept as plain text: a user who writes
 * `<|im_end|><|im_start|>system` gets those characters, not a forged turn. When no message holds such text
 * (the usual case) the whole text is tokenized at once, exactly as llama-server does; otherwise piece by
 * piece, contents without special-token parsing. A template that rewrites contents cannot be split into
 * pieces: a message with control-token text is then refused.
 */
export function chatTokens(
  rendered: RenderedSegments,
  tokenize: (text: string, special: boolean) => number[],
): number[] {
  const forging = (text: string) => {
    const plain = tokenize(text, false);
    const special = tokenize(text, true);
    return plain.length !== special.length || plain.some((token, i) => token !== special[i]);
  };
  if (rendered.opaque.some(forging))
    throw new ConduitError(
      "invalid_request",
      "A tool definition or tool call contains control-token text (such as <|im_end|>); remove it.",
      { param: "messages" },
    );
  if (!rendered.contents.some(forging))
    return tokenize(rendered.segments.map((segment) => segment.text).join(""), true);
  if (!rendered.exact)
    throw new ConduitError(
      "invalid_request",
      "A message contains control-token text (such as <|im_end|>) that this model's chat template cannot keep " +
        "apart from its own turn markers; remove it.",
      { param: "messages" },
    );
  return rendered.segments.flatMap((segment) => tokenize(segment.text, segment.trusted));
}

/** Models are told apart by their weights and their adapter: one base serves many adapters. */
function modelKey(ref: ModelRef): string {
  return ref.lora ? `${ref.path}\0${ref.lora.path}\0${ref.lora.scale ?? 1}` : ref.path;
}

/**
 * A free sequence for `prompt`: the one whose KV cache shares the longest prefix with it, when that prefix is
 * worth keeping (at least {@link MIN_REUSED_PREFIX} tokens); otherwise the one freed longest ago, so that a
 * prompt sharing only a BOS or a turn marker does not overwrite another conversation's cache.
 */
function takeSequence(m: LoadedModel, prompt: number[]): number | undefined {
  let best = 0;
  let bestLength = 0;
  for (const [i, id] of m.freeSequences.entries()) {
    const length = commonPrefix(m.cached.get(id) ?? [], prompt);
    if (length > bestLength) [best, bestLength] = [i, length];
  }
  if (bestLength < MIN_REUSED_PREFIX) best = 0;
  return m.freeSequences.splice(best, 1)[0];
}

/** Shorter shared prefixes are not worth taking a sequence that holds another conversation's cache. */
const MIN_REUSED_PREFIX = 16;

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

function settle(gen: Generation, answer: () => void): void {
  if (gen.settled) return;
  gen.settled = true;
  answer();
}

/** Waits for `promise` but gives up (with the signal's reason) when `signal` aborts; the work itself goes on. */
function abortable<T>(promise: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return promise;
  signal.throwIfAborted();
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (value) => (signal.removeEventListener("abort", onAbort), resolve(value)),
      (error: unknown) => (signal.removeEventListener("abort", onAbort), reject(error)),
    );
  });
}

function positiveInteger(value: number, name: string): number {
  if (!Number.isInteger(value) || value < 1)
    throw new RangeError(`${name} must be a positive integer, got ${value}`);
  return value;
}

function validateSampling(s: SamplingOptions): void {
  const bad = (param: string, message: string) => new ConduitError("invalid_request", message, { param });
  if (s.maxTokens !== undefined && (!Number.isInteger(s.maxTokens) || s.maxTokens < 1))
    throw bad("max_tokens", "max_tokens must be at least 1.");
  if (!(s.temperature >= 0)) throw bad("temperature", "temperature must be 0 or more.");
  if (!(s.topP > 0 && s.topP <= 1)) throw bad("top_p", "top_p must be in (0, 1].");
  if (!Number.isInteger(s.topK) || s.topK < 0) throw bad("top_k", "top_k must be a whole number, 0 or more.");
  if (!Number.isFinite(s.presencePenalty))
    throw bad("presence_penalty", "presence_penalty must be a number.");
  if (!Number.isFinite(s.frequencyPenalty))
    throw bad("frequency_penalty", "frequency_penalty must be a number.");
  if (s.seed !== undefined && !Number.isInteger(s.seed)) throw bad("seed", "seed must be an integer.");
}
