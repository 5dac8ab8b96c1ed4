/**
 * koffi bindings to the training API of the libllama that node-llama-cpp ships (llama.cpp release
 * `v0.5.0`, node-llama-cpp `3.22.1`). Struct layouts are copied from that release's `include/llama.h`
 * and `ggml/include/ggml-opt.h`; {@link checkAbi} refuses to run against anything else, because a
 * by-value struct with a shifted field does not fail, it silently passes garbage to native code.
 */
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import koffi from "koffi";

/** The llama.cpp release these bindings were written against. */
export const PINNED_LLAMA_CPP_RELEASE = "v0.5.0";

/** Native pointers are BigInts in koffi 3 (null for NULL). */
export type Pointer = bigint;

/** `sizeof` in this release, verified against the headers (x86-64 / arm64 LP64). */
export const EXPECTED_STRUCT_SIZES = {
  llama_model_params: 80,
  llama_context_params: 160,
  llama_opt_params: 48,
  ggml_opt_optimizer_params: 28,
  llama_model_quantize_params: 64,
  llama_batch: 56,
} as const;

const LlamaModelParams = koffi.struct("llama_model_params", {
  devices: "void *",
  tensor_buft_overrides: "void *",
  n_gpu_layers: "int32_t",
  split_mode: "int32_t",
  load_mode: "int32_t",
  lazy_mode: "int32_t",
  main_gpu: "int32_t",
  tensor_split: "void *",
  progress_callback: "void *",
  progress_callback_user_data: "void *",
  kv_overrides: "void *",
  vocab_only: "bool",
  check_tensors: "bool",
  use_extra_bufts: "bool",
  no_host: "bool",
  no_alloc: "bool",
  load_mtp: "bool",
});

const LlamaContextParams = koffi.struct("llama_context_params", {
  n_ctx: "uint32_t",
  n_batch: "uint32_t",
  n_ubatch: "uint32_t",
  n_seq_max: "uint32_t",
  n_rs_seq: "uint32_t",
  n_outputs_max: "uint32_t",
  n_outputs_max_per_seq: "uint32_t",
  n_threads: "int32_t",
  n_threads_batch: "int32_t",
  ctx_type: "int32_t",
  rope_scaling_type: "int32_t",
  pooling_type: "int32_t",
  attention_type: "int32_t",
  flash_attn_type: "int32_t",
  rope_freq_base: "float",
  rope_freq_scale: "float",
  yarn_ext_factor: "float",
  yarn_attn_factor: "float",
  yarn_beta_fast: "float",
  yarn_beta_slow: "float",
  yarn_orig_ctx: "uint32_t",
  defrag_thold: "float",
  cb_eval: "void *",
  cb_eval_user_data: "void *",
  type_k: "int32_t",
  type_v: "int32_t",
  abort_callback: "void *",
  abort_callback_data: "void *",
  embeddings: "bool",
  offload_kqv: "bool",
  no_perf: "bool",
  op_offload: "bool",
  swa_full: "bool",
  kv_unified: "bool",
  samplers: "void *",
  n_samplers: "size_t",
  ctx_other: "void *",
});

const LlamaOptParams = koffi.struct("llama_opt_params", {
  n_ctx_train: "uint32_t",
  param_filter: "void *",
  param_filter_ud: "void *",
  get_opt_pars: "void *",
  get_opt_pars_ud: "void *",
  optimizer_type: "int32_t",
});

/** Seven floats; the training loop owns one and rewrites it before every step (learning-rate schedules). */
export const GgmlOptOptimizerParams = koffi.struct("ggml_opt_optimizer_params", {
  adamw: koffi.struct({ alpha: "float", beta1: "float", beta2: "float", eps: "float", wd: "float" }),
  sgd: koffi.struct({ alpha: "float", wd: "float" }),
});

const LlamaModelQuantizeParams = koffi.struct("llama_model_quantize_params", {
  nthread: "int32_t",
  ftype: "int32_t",
  output_tensor_type: "int32_t",
  token_embedding_type: "int32_t",
  allow_requantize: "bool",
  quantize_output_tensor: "bool",
  only_copy: "bool",
  pure: "bool",
  keep_split: "bool",
  dry_run: "bool",
  imatrix: "void *",
  kv_overrides: "void *",
  tt_overrides: "void *",
  prune_layers: "void *",
  max_buf_size: "size_t",
});

// Registered by name for gguf_init_from_file (passed by value).
koffi.struct("gguf_init_params", { no_alloc: "bool", ctx: "void *" });

const LlamaBatch = koffi.struct("llama_batch", {
  n_tokens: "int32_t",
  token: "void *",
  embd: "void *",
  pos: "void *",
  n_seq_id: "void *",
  seq_id: "void *",
  logits: "void *",
});

/** `ggml_backend_sched_eval_callback`: asked for every node (ask = true), then told once it has run. */
export const SchedEvalCallback = koffi.proto(
  "bool ggml_backend_sched_eval_callback(void *t, bool ask, void *ud)",
);
/** `llama_opt_param_filter`: whether a tensor is trainable. */
export const OptParamFilter = koffi.proto("bool llama_opt_param_filter(void *tensor, void *ud)");

/** Byte offsets into `struct ggml_tensor` of this release (type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10], ...). */
export const GGML_TENSOR_OP_OFFSET = 80;
export const GGML_TENSOR_SRC_OFFSET = 152;
/** `enum ggml_op` value of `GGML_OP_OPT_STEP_ADAMW` (checked against `ggml_op_name` at load). */
export const GGML_OP_OPT_STEP_ADAMW = 98;
/** `GGML_OP_OPT_STEP_SGD`, the next value (checked at load too). */
export const GGML_OP_OPT_STEP_SGD = GGML_OP_OPT_STEP_ADAMW + 1;
/** The loss op and its backward: names looked up at load ({@link opByName}), 96 and 97 in this release. */
export const GGML_OP_CROSS_ENTROPY_LOSS_NAME = "CROSS_ENTROPY_LOSS";
export const GGML_OP_CROSS_ENTROPY_LOSS_BACK_NAME = "CROSS_ENTROPY_LOSS_BACK";
/** Byte offsets of `ne[4]` (int64) and `nb[4]` (size_t) in `struct ggml_tensor`. */
export const GGML_TENSOR_NE_OFFSET = 16;
export const GGML_TENSOR_NB_OFFSET = 48;
export const GGML_MAX_SRC = 10;
/** `enum ggml_op` name of a matrix multiplication; its value is looked up at load ({@link opByName}). */
export const GGML_OP_MUL_MAT_NAME = "MUL_MAT";

export const GGML_TYPE_F32 = 0;
export const GGML_TYPE_I32 = 26;
export const LLAMA_LOAD_MODE_NONE = 0;
export const LLAMA_FLASH_ATTN_TYPE_DISABLED = 0;
export const GGML_OPT_OPTIMIZER_TYPE_ADAMW = 0;
export const GGML_OPT_OPTIMIZER_TYPE_SGD = 1;

/** `enum llama_ftype` values of this release for the output types we offer. */
export const LLAMA_FTYPES = {
  F32: 0,
  F16: 1,
  Q4_0: 2,
  Q4_1: 3,
  Q8_0: 7,
  Q5_0: 8,
  Q5_1: 9,
  Q2_K: 10,
  Q3_K_S: 11,
  Q3_K_M: 12,
  Q3_K_L: 13,
  Q4_K_S: 14,
  Q4_K_M: 15,
  Q5_K_S: 16,
  Q5_K_M: 17,
  Q6_K: 18,
  BF16: 32,
} as const;

export type OutputType = keyof typeof LLAMA_FTYPES;

export interface LlamaModelParamsValue {
  n_gpu_layers: number;
  load_mode: number;
  [field: string]: unknown;
}

export interface LlamaContextParamsValue {
  n_ctx: number;
  n_batch: number;
  n_ubatch: number;
  n_seq_max: number;
  n_threads: number;
  n_threads_batch: number;
  flash_attn_type: number;
  cb_eval: Pointer | null;
  cb_eval_user_data: Pointer | null;
  type_k: number;
  type_v: number;
  [field: string]: unknown;
}

export interface LlamaOptParamsValue {
  n_ctx_train: number;
  param_filter: Pointer | null;
  param_filter_ud: Pointer | null;
  get_opt_pars: Pointer | null;
  get_opt_pars_ud: Pointer | null;
  optimizer_type: number;
}

export interface LlamaModelQuantizeParamsValue {
  nthread: number;
  ftype: number;
  allow_requantize: boolean;
  [field: string]: unknown;
}

/** The subset of libllama / libggml the trainer uses, typed. */
export interface LlamaLib {
  binDir: string;
  llama_version(): string;
  llama_backend_init(): void;
  llama_backend_free(): void;
  ggml_backend_load_all_from_path(dir: string): void;
  /** Registers one backend library (`ggml_backend_load`); `null` when it did not load. */
  ggml_backend_load(path: string): Pointer | null;
  llama_model_default_params(): LlamaModelParamsValue;
  llama_context_default_params(): LlamaContextParamsValue;
  llama_model_quantize_default_params(): LlamaModelQuantizeParamsValue;
  llama_model_load_from_file(path: string, params: LlamaModelParamsValue): Pointer | null;
  llama_model_free(model: Pointer): void;
  llama_init_from_model(model: Pointer, params: LlamaContextParamsValue): Pointer | null;
  llama_free(ctx: Pointer): void;
  llama_model_get_vocab(model: Pointer): Pointer;
  llama_model_n_layer(model: Pointer): number;
  llama_model_n_ctx_train(model: Pointer): number;
  llama_vocab_n_tokens(vocab: Pointer): number;
  llama_vocab_bos(vocab: Pointer): number;
  llama_vocab_eos(vocab: Pointer): number;
  llama_vocab_get_add_bos(vocab: Pointer): boolean;
  /** The process's llama.cpp log callback and its user data (`out` arrays of one pointer each). */
  llama_log_get(callback: [Pointer | null], userData: [Pointer | null]): void;
  /** Sets the process's llama.cpp log callback (a pointer from `llama_log_get`, or a registered callback). */
  llama_log_set(callback: unknown, userData: Pointer | null): void;
  llama_tokenize(
    vocab: Pointer,
    text: string,
    textLength: number,
    tokens: Int32Array,
    maxTokens: number,
    addSpecial: boolean,
    parseSpecial: boolean,
  ): number;
  llama_batch_get_one(tokens: Pointer, nTokens: number): Record<string, unknown>;
  llama_decode(ctx: Pointer, batch: Record<string, unknown>): number;
  /** The logits of output `i` of the last decode (`-1`: the last), `n_vocab` floats owned by the context. */
  llama_get_logits_ith(ctx: Pointer, i: number): Pointer | null;
  llama_opt_init(ctx: Pointer, model: Pointer, params: LlamaOptParamsValue): void;
  llama_opt_epoch(
    ctx: Pointer,
    dataset: Pointer,
    resultTrain: Pointer | null,
    resultEval: Pointer | null,
    idataSplit: number,
    callbackTrain: Pointer | null,
    callbackEval: Pointer | null,
  ): void;
  llama_model_save_to_file(model: Pointer, path: string): void;
  llama_adapter_lora_init(model: Pointer, path: string): Pointer | null;
  llama_adapter_lora_free(adapter: Pointer): void;
  llama_set_adapters_lora(ctx: Pointer, adapters: Pointer[], count: number, scales: Float32Array): number;
  llama_model_quantize(input: string, output: string, params: LlamaModelQuantizeParamsValue): number;
  ggml_opt_dataset_init(
    typeData: number,
    typeLabel: number,
    neDatapoint: number,
    neLabel: number,
    ndata: number,
    ndataShard: number,
  ): Pointer | null;
  ggml_opt_dataset_free(dataset: Pointer): void;
  ggml_opt_dataset_data(dataset: Pointer): Pointer;
  ggml_opt_dataset_labels(dataset: Pointer): Pointer;
  ggml_opt_result_init(): Pointer;
  ggml_opt_result_free(result: Pointer): void;
  ggml_opt_result_reset(result: Pointer): void;
  ggml_opt_result_loss(result: Pointer, loss: Float64Array, unc: Float64Array): void;
  ggml_get_name(tensor: Pointer): string;
  gguf_init_from_file(path: string, params: { no_alloc: boolean; ctx: Pointer | null }): Pointer | null;
  gguf_free(ctx: Pointer): void;
  gguf_find_key(ctx: Pointer, key: string): number | bigint;
  gguf_get_kv_type(ctx: Pointer, keyId: number | bigint): number;
  gguf_get_val_str(ctx: Pointer, keyId: number | bigint): string;
  gguf_get_val_u32(ctx: Pointer, keyId: number | bigint): number;
  gguf_get_n_tensors(ctx: Pointer): number | bigint;
  gguf_get_tensor_name(ctx: Pointer, tensorId: number): string;
  gguf_get_tensor_ne(ctx: Pointer, tensorId: number): Pointer;
  gguf_get_tensor_type(ctx: Pointer, tensorId: number): number;
  ggml_set_param(tensor: Pointer): void;
  ggml_backend_tensor_get(tensor: Pointer, data: Float32Array, offset: number, size: number): void;
  ggml_op_name(op: number): string;
  ggml_nbytes(tensor: Pointer): number;
  ggml_nelements(tensor: Pointer): number;
  ggml_backend_tensor_set(tensor: Pointer, data: Int32Array, offset: number, size: number): void;
  /** `ggml_backend_tensor_set` with float data. */
  ggml_backend_tensor_set_f32(tensor: Pointer, data: Float32Array, offset: number, size: number): void;
  ggml_backend_tensor_memset(tensor: Pointer, value: number, offset: number, size: number): void;
  /** Address of `ggml_opt_get_constant_optimizer_params`, the native `get_opt_pars` callback. */
  constantOptimizerParamsFn: Pointer;
  /** Devices ggml registered (after `ggml_backend_load_all_from_path`): the CPU, and GPUs whose backend loaded. */
  ggml_backend_dev_count(): number;
  ggml_backend_dev_get(index: number): Pointer;
  ggml_backend_dev_name(device: Pointer): string;
  ggml_backend_dev_description(device: Pointer): string;
  /** `enum ggml_backend_dev_type`: see {@link GGML_BACKEND_DEVICE_TYPE_GPU}. */
  ggml_backend_dev_type(device: Pointer): number;
  ggml_backend_dev_memory(device: Pointer, free: [number], total: [number]): void;
  ggml_backend_dev_supports_op(device: Pointer, op: Pointer): boolean;
}

/** `GGML_BACKEND_DEVICE_TYPE_GPU`: a GPU with its own memory (ggml-backend.h; CPU is 0, integrated GPU 2). */
export const GGML_BACKEND_DEVICE_TYPE_GPU = 1;

/** Where llama.cpp computes: which of its builds is loaded (the CPU's, or a GPU's). */
export type ComputeDevice = "cpu" | "cuda" | "vulkan";

/**
 * The directory holding the libllama that node-llama-cpp itself loads, so the trainer runs the same
 * kernels as generation: a local build made with `npx --no node-llama-cpp source download --gpu false`
 * (compiled for this CPU) when there is a finished one, else the prebuilt package for this platform.
 * `gpu: "cuda"` picks the CUDA build or `@node-llama-cpp/linux-x64-cuda` (it needs the CUDA runtime).
 */
export function findBinDir(gpu: ComputeDevice = "cpu"): string {
  const platform = `${process.platform}-${process.arch}`;
  const nodeLlamaCpp = resolveOrUndefined(createRequire(import.meta.url), "node-llama-cpp");
  const local = nodeLlamaCpp && localBuildDir(path.join(path.dirname(nodeLlamaCpp), ".."), gpu);
  if (local) return local;
  const packageName = gpu === "cpu" ? `@node-llama-cpp/${platform}` : `@node-llama-cpp/${platform}-${gpu}`;
  // The package exports only its entry (dist/index.js), not package.json; bins/ sits next to dist/.
  // It is a dependency of node-llama-cpp, so look next to it too in case npm nested it there.
  let entry: string | undefined;
  for (const from of [import.meta.url, nodeLlamaCpp]) {
    if (from === undefined) continue;
    entry = resolveOrUndefined(createRequire(from), packageName);
    if (entry !== undefined) break;
  }
  if (entry === undefined)
    throw new Error(`trainer: ${packageName} is not installed, so there is no libllama to train with`);
  const binsRoot = path.join(path.dirname(entry), "..", "bins");
  const dirs = fs.existsSync(binsRoot) ? fs.readdirSync(binsRoot) : [];
  const dir = dirs.find((name) => fs.existsSync(path.join(binsRoot, name, "_nlcBuildMetadata.json")));
  if (dir === undefined) throw new Error(`trainer: no prebuilt binaries under ${binsRoot}`);
  return path.join(binsRoot, dir);
}

/**
 * A finished local build of node-llama-cpp (its own layout, see its getLocalBuildBinaryPath):
 * `llama/localBuilds/<platform>-<arch>[-cuda]/Release`, valid once `buildDone.status` is written.
 * node-llama-cpp's engine (with `build: "never"`) loads this folder first too.
 */
export function localBuildDir(nodeLlamaCppRoot: string, gpu: ComputeDevice): string | undefined {
  const platform = `${process.platform}-${process.arch}`;
  const folder = path.join(
    nodeLlamaCppRoot,
    "llama",
    "localBuilds",
    gpu === "cpu" ? platform : `${platform}-${gpu}`,
  );
  const release = path.join(folder, "Release");
  const done =
    fs.existsSync(path.join(folder, "buildDone.status")) &&
    fs.existsSync(path.join(release, "_nlcBuildMetadata.json"));
  return done ? release : undefined;
}

function resolveOrUndefined(require: NodeJS.Require, specifier: string): string | undefined {
  try {
    return require.resolve(specifier);
  } catch {
    return undefined;
  }
}

/** The one file in `binDir` whose name matches `pattern`. */
export function findLibrary(binDir: string, pattern: RegExp): string {
  const name = fs.readdirSync(binDir).find((file) => pattern.test(file));
  if (name === undefined) throw new Error(`trainer: no library matching ${pattern} in ${binDir}`);
  return path.join(binDir, name);
}

/** Throws unless the binaries were built from {@link PINNED_LLAMA_CPP_RELEASE}. */
function checkRelease(binDir: string): void {
  const metadata = JSON.parse(fs.readFileSync(path.join(binDir, "_nlcBuildMetadata.json"), "utf8")) as {
    buildOptions?: { llamaCpp?: { release?: string } };
  };
  const release = metadata.buildOptions?.llamaCpp?.release;
  if (release !== PINNED_LLAMA_CPP_RELEASE) {
    throw new Error(
      `trainer: libllama in ${binDir} is llama.cpp ${release ?? "(unknown)"}, but the training bindings ` +
        `were written for ${PINNED_LLAMA_CPP_RELEASE}; re-check the struct layouts before upgrading`,
    );
  }
}

/**
 * Fails loudly when the struct definitions above drift from the sizes in the pinned headers, and when
 * the library's default parameters do not decode to the documented defaults (a shifted field would).
 */
export function checkAbi(
  lib?: Pick<LlamaLib, "llama_context_default_params" | "llama_model_default_params" | "ggml_op_name">,
  expected: Record<keyof typeof EXPECTED_STRUCT_SIZES, number> = EXPECTED_STRUCT_SIZES,
): void {
  const actual: Record<keyof typeof EXPECTED_STRUCT_SIZES, number> = {
    llama_model_params: koffi.sizeof(LlamaModelParams),
    llama_context_params: koffi.sizeof(LlamaContextParams),
    llama_opt_params: koffi.sizeof(LlamaOptParams),
    ggml_opt_optimizer_params: koffi.sizeof(GgmlOptOptimizerParams),
    llama_model_quantize_params: koffi.sizeof(LlamaModelQuantizeParams),
    llama_batch: koffi.sizeof(LlamaBatch),
  };
  const wrong = Object.entries(expected).filter(
    ([name, size]) => actual[name as keyof typeof EXPECTED_STRUCT_SIZES] !== size,
  );
  if (wrong.length > 0) {
    const detail = wrong
      .map(
        ([name, size]) =>
          `${name} is ${actual[name as keyof typeof EXPECTED_STRUCT_SIZES]} bytes, expected ${size}`,
      )
      .join("; ");
    throw new Error(`trainer: struct layout mismatch with llama.cpp ${PINNED_LLAMA_CPP_RELEASE}: ${detail}`);
  }
  if (lib === undefined) return;
  const cparams = lib.llama_context_default_params();
  const mparams = lib.llama_model_default_params();
  const looksRight =
    cparams.n_ctx === 512 &&
    cparams.n_batch === 2048 &&
    cparams.n_ubatch === 512 &&
    cparams.n_seq_max === 1 &&
    cparams.cb_eval === null &&
    cparams.type_k === 1 &&
    cparams.type_v === 1 &&
    cparams["defrag_thold"] === -1 &&
    cparams["offload_kqv"] === true &&
    cparams["n_samplers"] === 0 &&
    cparams["ctx_other"] === null &&
    mparams.n_gpu_layers === -1 &&
    mparams["devices"] === null &&
    mparams["kv_overrides"] === null;
  if (
    !looksRight ||
    lib.ggml_op_name(GGML_OP_OPT_STEP_ADAMW) !== "OPT_STEP_ADAMW" ||
    lib.ggml_op_name(GGML_OP_OPT_STEP_SGD) !== "OPT_STEP_SGD"
  ) {
    throw new Error(
      `trainer: llama_context_default_params/llama_model_default_params or ggml_op_name decode to ` +
        `unexpected values; the struct layouts or enums do not match this libllama`,
    );
  }
}

let loaded: LlamaLib | undefined;

/**
 * Loads libggml-base, libggml and libllama from node-llama-cpp's prebuilt binaries, once per process,
 * and checks the ABI before anything is called with a struct.
 */
export function loadLlamaLib(options: { binDir?: string; gpu?: ComputeDevice } = {}): LlamaLib {
  if (loaded !== undefined) return loaded;
  checkAbi();
  const binDir = options.binDir ?? findBinDir(options.gpu);
  checkRelease(binDir);
  // Loaded in dependency order so that libllama's DT_NEEDED entries resolve to these exact files.
  const base = koffi.load(findLibrary(binDir, /^libggml-base\.so$/));
  const ggml = koffi.load(findLibrary(binDir, /^libggml\.((cuda|vulkan)\.)?v[\d.]+\.so$/));
  const llama = koffi.load(findLibrary(binDir, /^libllama\.((cuda|vulkan)\.)?v[\d.]+\.so$/));

  const lib: LlamaLib = {
    binDir,
    llama_version: llama.func("const char *llama_version(void)"),
    llama_backend_init: llama.func("void llama_backend_init(void)"),
    llama_backend_free: llama.func("void llama_backend_free(void)"),
    ggml_backend_load_all_from_path: ggml.func("void ggml_backend_load_all_from_path(const char *dir)"),
    ggml_backend_load: ggml.func("void *ggml_backend_load(const char *path)"),
    llama_model_default_params: llama.func("llama_model_params llama_model_default_params(void)"),
    llama_context_default_params: llama.func("llama_context_params llama_context_default_params(void)"),
    llama_model_quantize_default_params: llama.func(
      "llama_model_quantize_params llama_model_quantize_default_params(void)",
    ),
    llama_model_load_from_file: llama.func(
      "void *llama_model_load_from_file(const char *path, llama_model_params params)",
    ),
    llama_model_free: llama.func("void llama_model_free(void *model)"),
    llama_init_from_model: llama.func(
      "void *llama_init_from_model(void *model, llama_context_params params)",
    ),
    llama_free: llama.func("void llama_free(void *ctx)"),
    llama_model_get_vocab: llama.func("void *llama_model_get_vocab(void *model)"),
    llama_model_n_layer: llama.func("int32_t llama_model_n_layer(void *model)"),
    llama_model_n_ctx_train: llama.func("int32_t llama_model_n_ctx_train(void *model)"),
    llama_vocab_n_tokens: llama.func("int32_t llama_vocab_n_tokens(void *vocab)"),
    llama_vocab_bos: llama.func("int32_t llama_vocab_bos(void *vocab)"),
    llama_vocab_eos: llama.func("int32_t llama_vocab_eos(void *vocab)"),
    llama_vocab_get_add_bos: llama.func("bool llama_vocab_get_add_bos(void *vocab)"),
    llama_log_get: llama.func("void llama_log_get(_Out_ void **callback, _Out_ void **user_data)"),
    llama_log_set: llama.func("void llama_log_set(void *callback, void *user_data)"),
    llama_tokenize: llama.func(
      "int32_t llama_tokenize(void *vocab, const char *text, int32_t text_len, _Out_ int32_t *tokens, " +
        "int32_t n_tokens_max, bool add_special, bool parse_special)",
    ),
    llama_batch_get_one: llama.func("llama_batch llama_batch_get_one(void *tokens, int32_t n_tokens)"),
    llama_decode: llama.func("int32_t llama_decode(void *ctx, llama_batch batch)"),
    llama_get_logits_ith: llama.func("float *llama_get_logits_ith(void *ctx, int32_t i)"),
    llama_opt_init: llama.func("void llama_opt_init(void *ctx, void *model, llama_opt_params params)"),
    llama_opt_epoch: llama.func(
      "void llama_opt_epoch(void *ctx, void *dataset, void *result_train, void *result_eval, " +
        "int64_t idata_split, void *callback_train, void *callback_eval)",
    ),
    llama_model_save_to_file: llama.func("void llama_model_save_to_file(void *model, const char *path)"),
    llama_adapter_lora_init: llama.func("void *llama_adapter_lora_init(void *model, const char *path)"),
    llama_adapter_lora_free: llama.func("void llama_adapter_lora_free(void *adapter)"),
    llama_set_adapters_lora: llama.func(
      "int32_t llama_set_adapters_lora(void *ctx, void **adapters, size_t n_adapters, float *scales)",
    ),
    llama_model_quantize: llama.func(
      "uint32_t llama_model_quantize(const char *input, const char *output, const llama_model_quantize_params *params)",
    ),
    ggml_opt_dataset_init: base.func(
      "void *ggml_opt_dataset_init(int type_data, int type_label, int64_t ne_datapoint, int64_t ne_label, " +
        "int64_t ndata, int64_t ndata_shard)",
    ),
    ggml_opt_dataset_free: base.func("void ggml_opt_dataset_free(void *dataset)"),
    ggml_opt_dataset_data: base.func("void *ggml_opt_dataset_data(void *dataset)"),
    ggml_opt_dataset_labels: base.func("void *ggml_opt_dataset_labels(void *dataset)"),
    ggml_opt_result_init: base.func("void *ggml_opt_result_init(void)"),
    ggml_opt_result_free: base.func("void ggml_opt_result_free(void *result)"),
    ggml_opt_result_reset: base.func("void ggml_opt_result_reset(void *result)"),
    ggml_opt_result_loss: base.func(
      "void ggml_opt_result_loss(void *result, _Out_ double *loss, _Out_ double *unc)",
    ),
    ggml_get_name: base.func("const char *ggml_get_name(void *tensor)"),
    gguf_init_from_file: base.func("void *gguf_init_from_file(const char *fname, gguf_init_params params)"),
    gguf_free: base.func("void gguf_free(void *ctx)"),
    gguf_find_key: base.func("int64_t gguf_find_key(void *ctx, const char *key)"),
    gguf_get_kv_type: base.func("int gguf_get_kv_type(void *ctx, int64_t key_id)"),
    gguf_get_val_str: base.func("const char *gguf_get_val_str(void *ctx, int64_t key_id)"),
    gguf_get_val_u32: base.func("uint32_t gguf_get_val_u32(void *ctx, int64_t key_id)"),
    gguf_get_n_tensors: base.func("int64_t gguf_get_n_tensors(void *ctx)"),
    gguf_get_tensor_name: base.func("const char *gguf_get_tensor_name(void *ctx, int64_t tensor_id)"),
    gguf_get_tensor_ne: base.func("void *gguf_get_tensor_ne(void *ctx, int64_t tensor_id)"),
    gguf_get_tensor_type: base.func("int gguf_get_tensor_type(void *ctx, int64_t tensor_id)"),
    ggml_set_param: base.func("void ggml_set_param(void *tensor)"),
    ggml_backend_tensor_get: base.func(
      "void ggml_backend_tensor_get(void *tensor, _Out_ float *data, size_t offset, size_t size)",
    ),
    ggml_op_name: base.func("const char *ggml_op_name(int op)"),
    ggml_nbytes: base.func("size_t ggml_nbytes(void *tensor)"),
    ggml_nelements: base.func("int64_t ggml_nelements(void *tensor)"),
    ggml_backend_tensor_set: base.func(
      "void ggml_backend_tensor_set(void *tensor, const int32_t *data, size_t offset, size_t size)",
    ),
    ggml_backend_tensor_set_f32: base.func(
      "void ggml_backend_tensor_set(void *tensor, const float *data, size_t offset, size_t size)",
    ),
    ggml_backend_tensor_memset: base.func(
      "void ggml_backend_tensor_memset(void *tensor, uint8_t value, size_t offset, size_t size)",
    ),
    constantOptimizerParamsFn: base.symbol("ggml_opt_get_constant_optimizer_params") as Pointer,
    ggml_backend_dev_count: ggml.func("size_t ggml_backend_dev_count(void)"),
    ggml_backend_dev_get: ggml.func("void *ggml_backend_dev_get(size_t index)"),
    ggml_backend_dev_name: base.func("const char *ggml_backend_dev_name(void *device)"),
    ggml_backend_dev_description: base.func("const char *ggml_backend_dev_description(void *device)"),
    ggml_backend_dev_type: base.func("int ggml_backend_dev_type(void *device)"),
    ggml_backend_dev_memory: base.func(
      "void ggml_backend_dev_memory(void *device, _Out_ size_t *free, _Out_ size_t *total)",
    ),
    ggml_backend_dev_supports_op: base.func("bool ggml_backend_dev_supports_op(void *device, void *op)"),
  };
  checkAbi(lib);
  loaded = lib;
  return lib;
}

/**
 * The `enum ggml_op` value whose `ggml_op_name` is `name`, searched below `GGML_OP_OPT_STEP_ADAMW` (whose
 * value {@link checkAbi} has verified, so every smaller value is inside ggml's name table).
 */
export function opByName(lib: Pick<LlamaLib, "ggml_op_name">, name: string): number {
  for (let op = 0; op < GGML_OP_OPT_STEP_ADAMW; op++) if (lib.ggml_op_name(op) === name) return op;
  throw new Error(`trainer: this ggml has no ${name} op`);
}

/** Reads `tensor->op`. */
export function tensorOp(tensor: Pointer): number {
  return koffi.decode(tensor, GGML_TENSOR_OP_OFFSET, "int32_t") as number;
}

/** Reads `tensor->src[index]` (a pointer, or null). */
export function tensorSource(tensor: Pointer, index: number): Pointer | null {
  return koffi.decode(tensor, GGML_TENSOR_SRC_OFFSET + 8 * index, "void *") as Pointer | null;
}

/** Reads `tensor->ne[index]`. */
export function tensorNe(tensor: Pointer, index: number): number {
  return Number(koffi.decode(tensor, GGML_TENSOR_NE_OFFSET + 8 * index, "int64_t"));
}

/** Reads `tensor->nb[index]`. */
export function tensorNb(tensor: Pointer, index: number): number {
  return Number(koffi.decode(tensor, GGML_TENSOR_NB_OFFSET + 8 * index, "uint64_t"));
}

/** Reads `tensor->type`. */
export function tensorType(tensor: Pointer): number {
  return koffi.decode(tensor, 0, "int32_t") as number;
}

/** ggml's log levels (`ggml_log_level`): warnings and errors are kept by {@link withQuietLog}. */
const GGML_LOG_LEVEL_WARN = 3;
const GGML_LOG_LEVEL_CONT = 5;
const LogCallback = koffi.proto(
  "void conduit_ggml_log_callback(int level, const char *text, void *user_data)",
);
let quietLines: string[] | undefined;
let quietCallback: unknown;

/**
 * Runs `fn` (synchronous llama.cpp calls, such as reading a model's vocabulary) with llama.cpp's log caught
 * instead of printed, and puts back whatever log callback the process had (node-llama-cpp's, in a server):
 * `fn` gets the warnings and errors logged so far, to name in an error.
 */
export function withQuietLog<T>(lib: LlamaLib, fn: (warnings: () => string) => T): T {
  quietCallback ??= koffi.register((level: number, text: string | null) => {
    if (quietLines !== undefined && level >= GGML_LOG_LEVEL_WARN && level !== GGML_LOG_LEVEL_CONT && text)
      quietLines.push(text.trim());
  }, koffi.pointer(LogCallback));
  const callback: [Pointer | null] = [null];
  const userData: [Pointer | null] = [null];
  lib.llama_log_get(callback, userData);
  const lines: string[] = [];
  quietLines = lines;
  lib.llama_log_set(quietCallback, null);
  try {
    return fn(() => lines.slice(-4).join(" | "));
  } finally {
    lib.llama_log_set(callback[0], userData[0]);
    quietLines = undefined;
  }
}
