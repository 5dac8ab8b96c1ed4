import fs from "node:fs";
import { getLlama, GgufInsights, LlamaLogLevel, readGgufFileInfo } from "node-llama-cpp";
import type { Llama, LlamaContext, LlamaModel } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import { loadChatTemplate } from "../model/chatTemplate.ts";
import type { ChatTemplate } from "../model/chatTemplate.ts";
import { describeFileChange, fileIdentity } from "../model/fileIdentity.ts";
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
import { keepFreedMemoryReturnable } from "./heap.ts";
import {
  adapterBatchingOf,
  loadMixedAdapterLlama,
  mixedAdapterBuildStatus,
  type AdapterBatching,
  type AdapterBatchingSetting,
} from "./mixedAdapterBuild.ts";
import { adapterSetLock } from "./adapterSetLock.ts";
import { embeddingContextOver, hasBatchedEmbeddings, loadAdapter } from "./nativeBatch.ts";
import { BatcherGroup } from "./BatcherGroup.ts";
import { Embedder } from "./Embedder.ts";
import type { BatchAdapter, SequenceBatcher } from "./SequenceBatcher.ts";
import type { ModelRef } from "./types.ts";

export interface ModelPoolOptions {
  /** Tokens per sequence, capped at each model's training context. */
  contextSize: number;
  /** Sequences per loaded base (shared by its adapters). */
  parallel: number;
  /** Contexts the base's sequences are split among (at most `parallel`), so that adapters decode side by side. */
  contexts: number;
  threads: number;
  batchSize: number;
  /** Bytes of host memory that loaded models may take. */
  memoryBudget: number;
  gpu: GpuSetting;
  gpuLayers: GpuLayers;
  /** Whether to serve different adapters in one decode with the mixed-adapter build (mixedAdapterBuild.ts). */
  adapterBatching: AdapterBatchingSetting;
  /** Bytes of GPU memory that loaded models may take; absent: 90% of what is free when the backend starts. */
  gpuMemoryBudget: number | undefined;
  /** An existing node-llama-cpp instance (not disposed with the pool); absent: one is created on first use. */
  llama: Llama | undefined;
  logger: (level: "error" | "warn" | "info", message: string) => void;
  /**
   * Makes what serves a base just loaded, and every LoRA adapter of it (the pool keeps it until the base is
   * unloaded).
   */
  createBatcher(parts: BatcherParts): SequenceBatcher;
}

/** What a loaded base gives its batcher. */
export interface BatcherParts {
  llama: Llama;
  model: LlamaModel;
  /** The model file, and its {@link fileIdentity} when it was read. */
  file: { path: string; identity: string };
  context: LlamaContext;
  template: ChatTemplate;
  /**
   * Marks the model used now (least recently used models are evicted first): the adapter of that key
   * (`BatchAdapter.key`), or the bare base when `undefined`.
   */
  touch(adapterKey: string | undefined): void;
}

/** Bytes of host memory and of GPU memory. */
interface Memory {
  host: number;
  gpu: number;
}

/**
 * Base weights in memory with the contexts that serve them (`contexts` of them, the base's sequences split
 * among them): the bare model and each of its LoRA adapters share those sequences (each batcher switches its
 * context's adapter between decodes; the group puts generations of one adapter together).
 */
interface LoadedBase {
  path: string;
  /** The file's {@link fileIdentity} when it was read: another one now means the file was replaced or rewritten. */
  identity: string;
  model: LlamaModel;
  /** Host memory the weights take (the file's size on the CPU). */
  sizeBytes: number;
  /** GPU memory the offloaded layers take (`0` on the CPU). */
  gpuBytes: number;
  /** Servable models (LoadedModel entries) on these weights; the weights and contexts go with the last one. */
  users: number;
  contexts: LlamaContext[];
  batcher: BatcherGroup;
  /** The chat template the base is served with (its own, its family's, or the fallback). */
  template: ChatTemplate;
  /** Its embedding context, created by the first embedding request and freed with the base. */
  embedder: Promise<Embedder> | undefined;
}

/**
 * One servable model: a loaded base, with a LoRA adapter when the ref has one. Every model of a base is
 * served by the base's contexts and batchers; an adapter costs its own tensors only (no context, no KV cache):
 * bench/README.md §Serving many adapters measures this against a context per adapter.
 */
export interface LoadedModel {
  key: string;
  ref: ModelRef;
  /** The adapter file's size for a LoRA model, else the base's (the base itself is counted once, in `bases`). */
  sizeBytes: number;
  /** Where the adapter's bytes are counted: GPU memory when the backend is a GPU, else host memory. */
  adapterOnGpu: boolean;
  base: LoadedBase;
  /** The adapter file's {@link fileIdentity} when it was read (LoRA models only). */
  adapterIdentity: string | undefined;
  /** The loaded adapter (LoRA models only), owned by this entry: freed when it is unloaded. */
  adapter: BatchAdapter | undefined;
  /** The base's batchers (shared by the base and its adapters). */
  batcher: BatcherGroup;
  lastUsed: number;
  /** Requests waiting for one of this model's sequences; such a model is never evicted. */
  users: number;
}

/**
 * The models in memory (Ollama's `server/sched.go` to the batcher's `llm/server.go`): loads each once, shares
 * base weights and contexts between a model and its LoRA adapters, keeps host and GPU memory within their
 * budgets by unloading the least recently used idle models (adapters included: each counts its tensors), and
 * owns the node-llama-cpp instance.
 *
 * Model files can change under it (an operator copies a new version over one): the weights are read into
 * memory, not mapped, so a file truncated or rewritten in place cannot fault the process, and before each use
 * the files' identity is checked (one `stat`): a model whose file changed is retired and its file loaded again.
 */
export class ModelPool {
  private readonly options: ModelPoolOptions;
  private llama: Promise<Llama> | undefined;
  private readonly ownsLlama: boolean;
  /** Resolved with the backend (`undefined` until then; unused on the CPU). */
  private gpuMemoryBudget: number | undefined;
  private readonly models = new Map<string, LoadedModel>();
  private readonly loading = new Map<string, Promise<LoadedModel>>();
  private readonly bases = new Map<string, LoadedBase>();
  /** Models whose file changed: out of service, unloaded once their running generations end. */
  private readonly retiring = new Map<LoadedModel, Promise<void>>();
  private readonly loadingBases = new Map<string, Promise<LoadedBase>>();
  /** The budgets' check after what is loaded changed (one at a time; see {@link enforceBudget}). */
  private enforcing: Promise<void> | undefined;
  private enforceAgain = false;
  private closed = false;

  constructor(options: ModelPoolOptions) {
    this.options = options;
    this.gpuMemoryBudget = options.gpuMemoryBudget;
    this.ownsLlama = options.llama === undefined;
    if (options.llama) {
      this.llama = Promise.resolve(options.llama);
      this.adapters = adapterBatchingOf(options.llama);
    }
    keepFreedMemoryReturnable();
  }

  /**
   * The model if it is loaded now from the files that are there now. One whose file changed since it was read is
   * retired (see {@link retire}) and `undefined` returned, so that `load` reads the file again.
   */
  get(ref: ModelRef): LoadedModel | undefined {
    const loaded = this.models.get(modelKey(ref));
    if (loaded === undefined) return undefined;
    const change = this.fileChange(loaded);
    if (change === undefined) return loaded;
    this.retire(loaded, change);
    return undefined;
  }

  /** Models taken out of service because their file changed whose generations have not ended yet. */
  retired(): LoadedModel[] {
    return [...this.retiring.keys()];
  }

  /** Loaded models (a base and each of its adapters count one each). */
  loaded(): LoadedModel[] {
    return [...this.models.values()];
  }

  get loadedBases(): number {
    return this.bases.size;
  }

  /** Generations running now on `m` (on its adapter, for a LoRA model). */
  running(m: LoadedModel): number {
    return m.batcher.runningOn(m.adapter?.key ?? "");
  }

  /** Something runs on `m` or waits for it: it must stay loaded. */
  private busy(m: LoadedModel): boolean {
    return m.users > 0 || this.running(m) > 0;
  }

  /** Whether `m` is still in service (not unloaded or retired since it was handed out). */
  isCurrent(m: LoadedModel): boolean {
    return this.models.get(m.key) === m;
  }

  /**
   * Unloads every model served from `file` (a model file or a LoRA adapter), for a run whose files are being
   * deleted: each is taken out of service at once and freed when its running generations end.
   */
  forget(file: string): void {
    for (const m of [...this.models.values()])
      if (m.ref.path === file || m.ref.lora?.path === file) this.retire(m, "its run was deleted");
  }

  get loadingModels(): number {
    return this.loading.size;
  }

  /** Stops loading (a load under way fails), waits for loads under way, unloads everything. */
  async dispose(): Promise<void> {
    this.closed = true;
    await this.enforcing;
    await Promise.allSettled(this.loading.values());
    await Promise.all([...this.models.values()].map((m) => this.unload(m)));
    await Promise.allSettled(this.retiring.values());
    const llama = this.llama;
    this.llama = undefined;
    if (llama && this.ownsLlama) await (await llama.catch(() => undefined))?.dispose();
  }

  getLlama(): Promise<Llama> {
    this.llama ??= this.startLlama();
    return this.llama;
  }

  async accelerator(): Promise<AcceleratorInfo> {
    const info = await describeAccelerator(await this.getLlama(), this.options.gpu, this.options.gpuLayers);
    return { ...info, adapters: this.adapters };
  }

  /** How adapters share a decode, known once the node-llama-cpp instance is made. */
  private adapters: AdapterBatching = { batching: "grouped", reason: "not started" };

  private async startLlama(): Promise<Llama> {
    let llama: Llama;
    try {
      llama = await this.createLlama();
    } catch (error) {
      // `auto` never fails for want of a GPU (node-llama-cpp falls back to the CPU); `cuda`/`vulkan` do.
      const gpu = this.options.gpu;
      throw gpu === "cuda" || gpu === "vulkan" ? gpuUnavailable(gpu, error) : error;
    }
    if (backendOf(llama) !== "cpu" && this.gpuMemoryBudget === undefined) {
      const vram = await llama.getVramState();
      this.gpuMemoryBudget = Math.floor(vram.free * 0.9);
    }
    return llama;
  }

  private async createLlama(): Promise<Llama> {
    const gpu = this.options.gpu;
    const build =
      gpu === "cuda" || gpu === "vulkan"
        ? {
            available: false as const,
            reason: `the mixed-adapter build is for the CPU, and CONDUIT_GPU is ${gpu}`,
          }
        : mixedAdapterBuildStatus(this.options.adapterBatching);
    if (!build.available) {
      this.adapters = { batching: "grouped", reason: build.reason };
      return this.createPrebuiltLlama();
    }
    if (gpu === "auto") {
      // A GPU the prebuilt binaries find wins over the CPU-only mixed-adapter build.
      const prebuilt = await this.createPrebuiltLlama();
      if (prebuilt.gpu !== false) {
        this.adapters = {
          batching: "grouped",
          reason: "a GPU is in use, and the mixed-adapter build is for the CPU",
        };
        return prebuilt;
      }
      await prebuilt.dispose();
    }
    try {
      const llama = await loadMixedAdapterLlama(build.dir, {
        maxThreads: 0,
        logLevel: LlamaLogLevel.warn,
        logger: this.llamaLogger,
      });
      this.adapters = {
        batching: "per-sequence",
        build: `${build.dir} (node-llama-cpp ${build.nodeLlamaCpp}, llama.cpp ${build.llamaCpp.slice(0, 12)})`,
      };
      return llama;
    } catch (error) {
      const reason = `the mixed-adapter build in ${build.dir} did not load (${error instanceof Error ? error.message : String(error)})`;
      this.options.logger("warn", `${reason}; adapters are decoded in groups`);
      this.adapters = { batching: "grouped", reason };
      return this.createPrebuiltLlama();
    }
  }

  private readonly llamaLogger = (level: LlamaLogLevel, message: string): void => {
    const text = message.trim();
    if (text === "") return;
    if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) this.options.logger("error", text);
    else if (level === LlamaLogLevel.warn) this.options.logger("warn", text);
  };

  private createPrebuiltLlama(): Promise<Llama> {
    return getLlama({
      gpu: llamaGpuOption(this.options.gpu),
      // Prebuilt binaries only: never compile llama.cpp (or download anything) inside a server.
      build: "never",
      // 0 turns off node-llama-cpp's thread splitter, so `threads` is exactly what llama.cpp uses.
      maxThreads: 0,
      logLevel: LlamaLogLevel.warn,
      logger: this.llamaLogger,
    });
  }

  /**
   * What loading `file` costs: on the CPU its size (the weights are read into memory); on a GPU node-llama-cpp's
   * estimate of host and GPU memory with `gpuLayers` offloaded, so each budget counts its own memory.
   */
  private async memoryNeed(file: string, fileBytes: number): Promise<Memory> {
    const llama = await this.getLlama();
    const backend = backendOf(llama);
    if (backend === "cpu") return { host: fileBytes, gpu: 0 };
    const insights = await GgufInsights.from(await readGgufFileInfo(file), llama);
    const layers = modelGpuLayers(backend, this.options.gpuLayers);
    const estimate = await insights.estimateModelResourceRequirementsV2({
      gpuLayers: layers === "max" ? insights.totalLayers : Math.min(layers, insights.totalLayers),
    });
    return { host: estimate.cpuRam, gpu: estimate.gpuVram };
  }

  /** Loads a model once; concurrent callers share the same promise. */
  load(ref: ModelRef): Promise<LoadedModel> {
    const key = modelKey(ref);
    const loaded = this.get(ref);
    if (loaded) return Promise.resolve(loaded);
    let promise = this.loading.get(key);
    if (!promise) {
      promise = this.doLoad(ref).finally(() => this.loading.delete(key));
      this.loading.set(key, promise);
    }
    return promise;
  }

  private async doLoad(ref: ModelRef): Promise<LoadedModel> {
    const { options } = this;
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
    // Taken before the file is read: a change while it is read shows at the next use, which reads it again.
    const adapterIdentity = ref.lora ? (fileIdentity(ref.lora.path) ?? "") : undefined;
    // A base already in memory costs nothing more; an adapter costs its own file.
    const sizeBytes = ref.lora ? adapterBytes : baseBytes;
    let base: LoadedBase | undefined;
    let adapter: BatchAdapter | undefined;
    let adapterOnGpu = false;
    try {
      const need = this.currentBase(ref.path)
        ? { host: 0, gpu: 0 }
        : await this.memoryNeed(ref.path, baseBytes);
      const llama = await this.getLlama();
      adapterOnGpu = backendOf(llama) !== "cpu";
      await this.makeRoomFor({
        host: need.host + (adapterOnGpu ? 0 : adapterBytes),
        gpu: need.gpu + (adapterOnGpu ? adapterBytes : 0),
      });
      base = await this.acquireBase(ref, need);
      const key = modelKey(ref);
      if (ref.lora)
        adapter = {
          key,
          native: await loadAdapter(llama, base.model, ref.lora.path),
          scale: ref.lora.scale ?? 1,
        };
      const entry: LoadedModel = {
        key,
        ref,
        sizeBytes,
        adapterOnGpu,
        base,
        adapterIdentity,
        adapter,
        batcher: base.batcher,
        lastUsed: Date.now(),
        users: 0,
      };
      if (this.closed) throw new ConduitError("unavailable", "The inference engine is shutting down.");
      this.models.set(entry.key, entry);
      // Held for the callers of this load until they have taken a sequence or a place in its queue (they do it
      // in the microtasks that follow): another load's room-making would otherwise unload it unused, and its
      // request would load it again (more loads than requests). Then the budgets are checked again: a load that
      // found every other model busy went past them.
      entry.users++;
      setImmediate(() => {
        entry.users--;
        this.enforceBudget();
      });
      options.logger(
        "info",
        `model '${ref.id}' loaded: chat template ${base.template.name} (${base.template.origin}${base.template.origin === "embedded" ? "" : ", the model has none of its own"})`,
      );
      return entry;
    } catch (error) {
      await adapter?.native.dispose().catch(() => {});
      if (base) await this.releaseBase(base);
      if (error instanceof ConduitError) throw error;
      options.logger(
        "error",
        `loading model '${ref.id}' failed: ${error instanceof Error ? error.message : error}`,
      );
      throw new ConduitError("unavailable", `The model '${ref.id}' could not be loaded.`, { cause: error });
    }
  }

  /** The base weights of `ref` (its `path`) with their context, loaded once and counted as one more user. */
  private async acquireBase(ref: ModelRef, need: Memory): Promise<LoadedBase> {
    const { path } = ref;
    let base = this.currentBase(path);
    if (!base) {
      let loading = this.loadingBases.get(path);
      if (!loading) {
        loading = (async () => {
          const llama = await this.getLlama();
          const identity = fileIdentity(path) ?? "";
          const model = await llama.loadModel({
            modelPath: path,
            gpuLayers: modelGpuLayers(backendOf(llama), this.options.gpuLayers),
            // Read, not mapped: a mapped file truncated or rewritten in place (an operator's `cp` over it) ends
            // the process with SIGBUS at the next access. Reading takes the same resident memory (anonymous
            // pages instead of file pages) and about the same time (bench/README.md §Model files).
            useMmap: false,
          });
          try {
            const { contexts, batcher, template } = await this.createServing(llama, model, ref, identity);
            const loaded: LoadedBase = {
              path,
              identity,
              model,
              sizeBytes: need.host,
              gpuBytes: need.gpu,
              users: 0,
              contexts,
              batcher,
              template,
              embedder: undefined,
            };
            this.bases.set(path, loaded);
            return loaded;
          } catch (error) {
            await model.dispose().catch(() => {});
            throw error;
          }
        })().finally(() => this.loadingBases.delete(path));
        this.loadingBases.set(path, loading);
      }
      base = await loading;
    }
    base.users++;
    return base;
  }

  /**
   * The contexts (`parallel` sequences split among `contexts` of them) and their batchers that serve a base
   * and its adapters.
   */
  private async createServing(
    llama: Llama,
    model: LlamaModel,
    ref: ModelRef,
    identity: string,
  ): Promise<{ contexts: LlamaContext[]; batcher: BatcherGroup; template: ChatTemplate }> {
    const { options } = this;
    const contextSize = this.contextSizeOf(model);
    const count = Math.max(1, Math.min(options.contexts, options.parallel));
    const contexts: LlamaContext[] = [];
    // A context's creation reads the model's adapter set (llama.cpp reserves its graph for every adapter loaded).
    const lock = adapterSetLock(model);
    try {
      for (let i = 0; i < count; i++)
        contexts.push(
          await lock.read(() =>
            model.createContext({
              contextSize,
              // 5 over 2 contexts: 3 and 2.
              sequences: Math.floor(options.parallel / count) + (i < options.parallel % count ? 1 : 0),
              threads: options.threads,
              batchSize: Math.min(options.batchSize, contextSize),
              // One loaded context serves many requests; do not fail over to a smaller size silently.
              failedCreationRemedy: false,
            }),
          ),
        );
      const template = await loadChatTemplate({ id: ref.id, path: ref.path });
      const path = ref.path;
      const touch = (adapterKey: string | undefined) => {
        const m = this.models.get(adapterKey ?? path);
        if (m) m.lastUsed = Date.now();
        // A generation ended: a model past the budgets may be idle now.
        this.enforceBudget();
      };
      const batcher = new BatcherGroup(
        contexts.map((context) =>
          options.createBatcher({ llama, model, file: { path, identity }, context, template, touch }),
        ),
      );
      return { contexts, batcher, template };
    } catch (error) {
      for (const context of contexts) await context.dispose().catch(() => {});
      throw error;
    }
  }

  /** Tokens per sequence on `model`: `contextSize`, capped at the model's training context. */
  private contextSizeOf(model: LlamaModel): number {
    const { contextSize } = this.options;
    return Math.max(16, Math.min(contextSize, model.trainContextSize || contextSize));
  }

  /**
   * The embedding context of `m`'s base (shared by the base and its adapters), created on first use with the
   * base's context size and, with the mixed-adapter build, as many sequences as the base's generations (one
   * without), and kept until the base is unloaded. Its memory (node-llama-cpp's
   * estimate: KV cache and compute buffers) is counted with the base against the budgets: idle models are
   * unloaded first to make room. The caller holds `m` (its `users`) meanwhile.
   */
  embedder(m: LoadedModel): Promise<Embedder> {
    const base = m.base;
    if (base.embedder === undefined) {
      const creating = this.createEmbedder(base);
      base.embedder = creating;
      creating.catch(() => {
        if (base.embedder === creating) base.embedder = undefined;
      });
    }
    return base.embedder;
  }

  private async createEmbedder(base: LoadedBase): Promise<Embedder> {
    const { model } = base;
    const contextSize = this.contextSizeOf(model);
    // As many inputs in one decode as generations run at once, where the addon reads each one's vector (the
    // mixed-adapter build); each sequence has the context's tokens, as a generation's has.
    const lanes = hasBatchedEmbeddings(await this.getLlama()) ? this.options.parallel : 1;
    // Every token of an input in one decode: a pooled (non-causal) model needs the whole input in one batch.
    const estimate = model.fileInsights.estimateContextResourceRequirements({
      contextSize,
      modelGpuLayers: model.gpuLayers,
      batchSize: contextSize,
      sequences: lanes,
      isEmbeddingContext: true,
    });
    const memory = { host: estimate.cpuRam, gpu: estimate.gpuVram };
    await this.makeRoomFor(memory);
    if (this.closed) throw new ConduitError("unavailable", "The inference engine is shutting down.");
    let context;
    try {
      // Read the model's adapter set, as every context's creation does (adapterSetLock.ts).
      context = await adapterSetLock(model).read(async () =>
        lanes === 1
          ? await model.createEmbeddingContext({
              contextSize,
              batchSize: contextSize,
              threads: this.options.threads,
            })
          : embeddingContextOver(
              await model.createContext({
                contextSize,
                sequences: lanes,
                batchSize: contextSize,
                threads: this.options.threads,
                // node-llama-cpp's own option for the context of an embedding context (llama.cpp's `embeddings`).
                ...{ _embeddings: true },
              }),
            ),
      );
    } catch (error) {
      this.options.logger(
        "error",
        `creating the embedding context of ${base.path} failed: ${error instanceof Error ? error.message : error}`,
      );
      throw new ConduitError("unavailable", "The model's embedding context could not be created.", {
        cause: error,
      });
    }
    base.sizeBytes += memory.host;
    base.gpuBytes += memory.gpu;
    return new Embedder(context, model, contextSize, memory, lanes);
  }

  /** Fails embedding requests under way at their next input (the engine is shutting down). */
  closeEmbedders(reason: () => Error): void {
    const bases = new Set([
      ...this.bases.values(),
      ...[...this.models.values(), ...this.retiring.keys()].map((m) => m.base),
    ]);
    for (const base of bases)
      void base.embedder?.then(
        (e) => e.close(reason),
        () => {},
      );
  }

  /** Marks `m` used now (after an embedding request); a model past the budgets may be idle now. */
  used(m: LoadedModel): void {
    m.lastUsed = Date.now();
    this.enforceBudget();
  }

  /** One user fewer; the contexts and weights are freed with the last. */
  private async releaseBase(base: LoadedBase): Promise<void> {
    base.users--;
    if (base.users > 0) return;
    // A base whose file changed may already have been replaced by its new version.
    if (this.bases.get(base.path) === base) this.bases.delete(base.path);
    await base.batcher.idle();
    const embedder = await base.embedder?.catch(() => undefined);
    await embedder?.dispose().catch(() => {});
    for (const context of base.contexts) await context.dispose().catch(() => {});
    await base.model.dispose().catch(() => {});
  }

  /** The loaded base of `path` if its file has not changed since; a changed one is forgotten (its users keep it). */
  private currentBase(path: string): LoadedBase | undefined {
    const base = this.bases.get(path);
    if (base === undefined || fileIdentity(path) === base.identity) return base;
    this.bases.delete(path);
    return undefined;
  }

  /** How the model's files changed since they were read, in words; `undefined` when they have not. */
  private fileChange(m: LoadedModel): string | undefined {
    const base = fileIdentity(m.base.path);
    if (base !== m.base.identity) return `${m.base.path} ${describeFileChange(m.base.identity, base)}`;
    if (m.ref.lora === undefined) return undefined;
    const adapter = fileIdentity(m.ref.lora.path);
    if (adapter !== m.adapterIdentity)
      return `${m.ref.lora.path} ${describeFileChange(m.adapterIdentity ?? "", adapter)}`;
    return undefined;
  }

  /**
   * Takes a model whose file changed out of service: the next request loads the file as it is now, and
   * generations running on the old weights (in memory, not mapped) finish before they are unloaded.
   */
  private retire(m: LoadedModel, change: string): void {
    this.models.delete(m.key);
    // When the base file changed, the next load reads it again; the base's other users retire at their next use.
    this.currentBase(m.base.path);
    this.options.logger("info", `model '${m.ref.id}': ${change}; unloading it and loading the file again`);
    this.retiring.set(
      m,
      this.unload(m).finally(() => this.retiring.delete(m)),
    );
  }

  /**
   * Brings what is loaded back within the budgets once it can: a load that found every other model busy went
   * past them, and the models it could not unload then are unloaded (least recently used first) as they become
   * idle, not at the next load. Called after a load and whenever a generation ends; a no-op within the budgets,
   * so nothing is unloaded that is not over them (no thrashing). One check at a time, the last call's after it.
   */
  private enforceBudget(): void {
    if (this.closed) return;
    if (this.enforcing) {
      this.enforceAgain = true;
      return;
    }
    // On the next turn, once the generation that ended has given its sequence back.
    this.enforcing = new Promise<void>((resolve) => setImmediate(resolve))
      .then(() => this.makeRoomFor({ host: 0, gpu: 0 }, true))
      .catch((error: unknown) =>
        this.options.logger(
          "warn",
          `keeping the model memory budget: ${error instanceof Error ? error.message : error}`,
        ),
      )
      .finally(() => {
        this.enforcing = undefined;
        if (this.enforceAgain) {
          this.enforceAgain = false;
          this.enforceBudget();
        }
      });
  }

  /**
   * Unloads least recently used idle models until `incoming` more bytes fit both budgets: host memory
   * (`memoryBudgetBytes`) and GPU memory (`gpuMemoryBudgetBytes`, on a GPU backend). A load that takes no GPU
   * memory needs no room there; `both` checks both budgets whatever comes.
   */
  private async makeRoomFor(incoming: Memory, both = false): Promise<void> {
    const used: Memory = { host: 0, gpu: 0 };
    // Retired models and bases whose file changed hold their memory until their generations end.
    const holders = [...this.models.values(), ...this.retiring.keys()];
    for (const b of new Set([...this.bases.values(), ...holders.map((m) => m.base)])) {
      used.host += b.sizeBytes;
      used.gpu += b.gpuBytes;
    }
    for (const m of holders) if (m.ref.lora) used[m.adapterOnGpu ? "gpu" : "host"] += m.sizeBytes;
    const gpuBudget = this.gpuMemoryBudget ?? Infinity;
    const fits = () =>
      used.host + incoming.host <= this.options.memoryBudget &&
      ((incoming.gpu === 0 && !both) || used.gpu + incoming.gpu <= gpuBudget);
    const idle = [...this.models.values()]
      .filter((m) => !this.busy(m))
      .sort((a, b) => a.lastUsed - b.lastUsed);
    for (const victim of idle) {
      if (fits()) break;
      // Unloading awaits; a victim may have been picked up by a request meanwhile.
      if (this.busy(victim) || this.models.get(victim.key) !== victim) continue;
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
    if (this.models.get(m.key) === m) this.models.delete(m.key);
    // Out of service now (the engine starts nothing on a model that is not current), but generations running
    // on it and requests already waiting for one of its sequences finish first. A timer, not a promise: a
    // waiting request takes its sequence and starts its generation within one run of microtasks.
    while (this.busy(m)) {
      await m.batcher.idleOn(m.adapter?.key ?? "");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    if (m.adapter) {
      // Off the context before its tensors are freed; its KV caches go too (a new version may reuse the key).
      await m.batcher.forgetAdapter(m.adapter.key);
      await m.adapter.native.dispose().catch(() => {});
    }
    await this.releaseBase(m.base);
  }
}

/** Models are told apart by their weights and their adapter: one base serves many adapters. */
function modelKey(ref: ModelRef): string {
  return ref.lora ? `${ref.path}\0${ref.lora.path}\0${ref.lora.scale ?? 1}` : ref.path;
}
