/**
 * A one-sequence greedy decoder on the libllama node-llama-cpp ships, through koffi (the trainer's bindings in
 * `src/train/native/llamaLib.ts` plus the sampler calls they lack). For bench/nativeLoop.ts and its worker.
 */
import koffi from "koffi";
import { findLibrary, loadLlamaLib, type Pointer } from "../../src/train/libllama/llamaLib.ts";

export interface KoffiDecoder {
  /** Empties the KV cache. */
  clear(): void;
  /** Decodes `token` at the next position on this thread and returns the greedy next token. */
  step(token: number): number;
  /** The same, `llama_decode` on koffi's worker thread. */
  stepAsync(token: number): Promise<number>;
}

let opened: ReturnType<typeof open> | undefined;

function open(file: string) {
  const lib = loadLlamaLib();
  lib.ggml_backend_load_all_from_path(lib.binDir);
  lib.llama_backend_init();
  const libllama = koffi.load(findLibrary(lib.binDir, /^libllama\.((cuda|vulkan)\.)?v[\d.]+\.so$/));
  koffi.struct("bench_sampler_chain_params", { no_perf: "bool" });
  const SeqConfig = koffi.struct("bench_sampler_seq_config", { seq_id: "int32_t", sampler: "void *" });
  const model = lib.llama_model_load_from_file(file, lib.llama_model_default_params());
  if (model === null) throw new Error(`could not load ${file} through koffi`);
  return {
    file,
    lib,
    model,
    SeqConfig,
    chainDefault: libllama.func("bench_sampler_chain_params llama_sampler_chain_default_params(void)"),
    chainInit: libllama.func("void *llama_sampler_chain_init(bench_sampler_chain_params params)"),
    chainAdd: libllama.func("void llama_sampler_chain_add(void *chain, void *smpl)"),
    initGreedy: libllama.func("void *llama_sampler_init_greedy(void)"),
    sampledToken: libllama.func("int32_t llama_get_sampled_token_ith(void *ctx, int32_t i)"),
    samplerSample: libllama.func("int32_t llama_sampler_sample(void *smpl, void *ctx, int32_t idx)"),
    getMemory: libllama.func("void *llama_get_memory(void *ctx)"),
    memoryClear: libllama.func("void llama_memory_clear(void *mem, bool data)"),
    decode: libllama.func("int32_t llama_decode(void *ctx, llama_batch batch)"),
  };
}

/**
 * A decoder with its own context. `backendSampling`: the greedy sampler runs inside `llama_decode`'s graph
 * (`llama_context_params.samplers`, read back by `llama_get_sampled_token_ith`) instead of on the CPU after it.
 */
export function koffiDecoder(file: string, threads: number, backendSampling: boolean): KoffiDecoder {
  const k = (opened ??= open(file));
  if (k.file !== file) throw new Error(`koffiDecoder: this process already loaded ${k.file}`);
  const params = k.lib.llama_context_default_params() as unknown as Record<string, unknown>;
  Object.assign(params, { n_ctx: 512, n_batch: 512, n_ubatch: 512, n_seq_max: 1, n_threads: threads });
  Object.assign(params, { n_threads_batch: threads, no_perf: true });
  const chain = k.chainInit(k.chainDefault()) as Pointer;
  k.chainAdd(chain, k.initGreedy());
  if (backendSampling) {
    const config = koffi.alloc(k.SeqConfig, 1) as Pointer;
    koffi.encode(config, k.SeqConfig, { seq_id: 0, sampler: chain });
    Object.assign(params, { samplers: config, n_samplers: 1 });
  }
  const ctx = k.lib.llama_init_from_model(k.model, params as never);
  if (ctx === null) throw new Error("could not create a koffi context");
  const cell = koffi.alloc("int32_t", 1) as Pointer;
  const next = (status: number) => {
    if (status !== 0) throw new Error(`llama_decode: ${status}`);
    return (backendSampling ? k.sampledToken(ctx, -1) : k.samplerSample(chain, ctx, -1)) as number;
  };
  return {
    clear: () => k.memoryClear(k.getMemory(ctx), true),
    step(token) {
      koffi.encode(cell, "int32_t", token);
      return next(k.decode(ctx, k.lib.llama_batch_get_one(cell, 1)) as number);
    },
    stepAsync(token) {
      koffi.encode(cell, "int32_t", token);
      return new Promise((resolve, reject) =>
        k.decode.async(ctx, k.lib.llama_batch_get_one(cell, 1), (error: unknown, status: number) => {
          if (error) return reject(error as Error);
          try {
            resolve(next(status));
          } catch (failure) {
            reject(failure as Error);
          }
        }),
      );
    },
  };
}
