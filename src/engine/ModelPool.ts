import fs from "node:fs";
import { getLlama, GgufInsights, LlamaLogLevel, readGgufFileInfo } from "node-llama-cpp";
import type { Llama, LlamaContext, LlamaModel } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import { loadChatTemplate } from "../model/chatTemplate.ts";
import type { ChatTemplate } from "../model/chatTemplate.ts";
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
import type { SequenceBatcher } from "./SequenceBatcher.ts";
import type { ModelRef } from "./types.ts";

export interface ModelPoolOptions {
  /** Tokens per sequence, capped at each model's training context. */
  contextSize: number;
  /** Sequences per loaded model. */
  parallel: number;
  threads: number;
  batchSize: number;
  /** Bytes of host memory that loaded models may take. */
  memoryBudget: number;
  gpu: GpuSetting;
  gpuLayers: GpuLayers;
  /** Bytes of GPU memory that loaded models may take; absent: 90% of what is free when the backend starts. */
  gpuMemoryBudget: number | undefined;
  /** An existing node-llama-cpp instance (not disposed with the pool); absent: one is created on first use. */
  llama: Llama | undefined;
  logger: (level: "error" | "warn", message: string) => void;
  /** Makes what serves a model just loaded (the pool keeps it until the model is unloaded). */
  createBatcher(parts: BatcherParts): SequenceBatcher;
}

/** What a loaded model gives its batcher. */
export interface BatcherParts {
  llama: Llama;
  model: LlamaModel;
  context: LlamaContext;
  template: ChatTemplate;
  /** Marks the model used now (least recently used models are evicted first). */
  touch(): void;
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
export interface LoadedModel {
  key: string;
  ref: ModelRef;
  /** The adapter file's size for a LoRA model, else the base's (the base itself is counted once, in `bases`). */
  sizeBytes: number;
  /** Where the adapter's bytes are counted: GPU memory when the backend is a GPU, else host memory. */
  adapterOnGpu: boolean;
  base: LoadedBase;
  context: LlamaContext;
  batcher: SequenceBatcher;
  lastUsed: number;
  /** Requests waiting for one of this model's sequences; such a model is never evicted. */
  users: number;
}

/**
 * The models in memory (Ollama's `server/sched.go` to the batcher's `llm/server.go`): loads each once, shares
 * base weights between a model and its LoRA adapters, keeps host and GPU memory within their budgets by
 * unloading the least recently used idle models, and owns the node-llama-cpp instance.
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
  private readonly loadingBases = new Map<string, Promise<LoadedBase>>();
  private closed = false;

  constructor(options: ModelPoolOptions) {
    this.options = options;
    this.gpuMemoryBudget = options.gpuMemoryBudget;
    this.ownsLlama = options.llama === undefined;
    if (options.llama) this.llama = Promise.resolve(options.llama);
  }

  /** The model if it is loaded now. */
  get(ref: ModelRef): LoadedModel | undefined {
    return this.models.get(modelKey(ref));
  }

  /** Loaded models (a base and each of its adapters count one each). */
  loaded(): LoadedModel[] {
    return [...this.models.values()];
  }

  get loadedBases(): number {
    return this.bases.size;
  }

  get loadingModels(): number {
    return this.loading.size;
  }

  /** Stops loading (a load under way fails), waits for loads under way, unloads everything. */
  async dispose(): Promise<void> {
    this.closed = true;
    await Promise.allSettled(this.loading.values());
    await Promise.all([...this.models.values()].map((m) => this.unload(m)));
    const llama = this.llama;
    this.llama = undefined;
    if (llama && this.ownsLlama) await (await llama.catch(() => undefined))?.dispose();
  }

  getLlama(): Promise<Llama> {
    this.llama ??= this.startLlama();
    return this.llama;
  }

  async accelerator(): Promise<AcceleratorInfo> {
    return describeAccelerator(await this.getLlama(), this.options.gpu, this.options.gpuLayers);
  }

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

  private createLlama(): Promise<Llama> {
    return getLlama({
      gpu: llamaGpuOption(this.options.gpu),
      // Prebuilt binaries only: never compile llama.cpp (or download anything) inside a server.
      build: "never",
      // 0 turns off node-llama-cpp's thread splitter, so `threads` is exactly what llama.cpp uses.
      maxThreads: 0,
      logLevel: LlamaLogLevel.warn,
      logger: (level, message) => {
        const text = message.trim();
        if (text === "") return;
        if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal)
          this.options.logger("error", text);
        else if (level === LlamaLogLevel.warn) this.options.logger("warn", text);
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
    const layers = modelGpuLayers(backend, this.options.gpuLayers);
    const estimate = await insights.estimateModelResourceRequirementsV2({
      gpuLayers: layers === "max" ? insights.totalLayers : Math.min(layers, insights.totalLayers),
    });
    return { host: estimate.cpuRam, gpu: estimate.gpuVram };
  }

  /** Loads a model once; concurrent callers share the same promise. */
  load(ref: ModelRef): Promise<LoadedModel> {
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
        Math.min(options.contextSize, model.trainContextSize || options.contextSize),
      );
      context = await model.createContext({
        contextSize,
        sequences: options.parallel,
        threads: options.threads,
        batchSize: Math.min(options.batchSize, contextSize),
        // One loaded context serves many requests; do not fail over to a smaller size silently.
        failedCreationRemedy: false,
        ...(ref.lora
          ? { lora: { adapters: [{ filePath: ref.lora.path, scale: ref.lora.scale ?? 1 }] } }
          : {}),
      });
      const template = await loadChatTemplate(ref);
      const llama = await this.getLlama();
      const entry: LoadedModel = {
        key: modelKey(ref),
        ref,
        sizeBytes,
        adapterOnGpu,
        base,
        context,
        batcher: options.createBatcher({
          llama,
          model,
          context,
          template,
          touch: () => (entry.lastUsed = Date.now()),
        }),
        lastUsed: Date.now(),
        users: 0,
      };
      if (this.closed) throw new ConduitError("unavailable", "The inference engine is shutting down.");
      this.models.set(entry.key, entry);
      return entry;
    } catch (error) {
      await context?.dispose().catch(() => {});
      if (base) await this.releaseBase(base);
      if (error instanceof ConduitError) throw error;
      options.logger(
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
            gpuLayers: modelGpuLayers(backendOf(llama), this.options.gpuLayers),
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
      used.host + incoming.host <= this.options.memoryBudget &&
      (incoming.gpu === 0 || used.gpu + incoming.gpu <= gpuBudget);
    const idle = [...this.models.values()]
      .filter((m) => !m.batcher.busy && m.users === 0)
      .sort((a, b) => a.lastUsed - b.lastUsed);
    for (const victim of idle) {
      if (fits()) break;
      // Unloading awaits; a victim may have been picked up by a request meanwhile.
      if (victim.batcher.busy || victim.users > 0) continue;
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
    await m.batcher.idle();
    await m.context.dispose().catch(() => {});
    await this.releaseBase(m.base);
  }
}

/** Models are told apart by their weights and their adapter: one base serves many adapters. */
function modelKey(ref: ModelRef): string {
  return ref.lora ? `${ref.path}\0${ref.lora.path}\0${ref.lora.scale ?? 1}` : ref.path;
}
