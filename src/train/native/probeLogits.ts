/**
 * llama.cpp's logits for a sequence of tokens on a base model with an adapter applied, decoded one token at
 * a time on the CPU: how an exported adapter is checked against the logits its trainer computed (the torch
 * trainer's `probe`), in the tests and on a GPU-trained adapter.
 */
import koffi from "koffi";
import {
  GGML_TYPE_F32,
  LLAMA_FLASH_ATTN_TYPE_DISABLED,
  loadLlamaLib,
  type Pointer,
} from "../libllama/llamaLib.ts";

/**
 * One row of logits per token. F32 keys and values and no flash attention: with the serving defaults (F16
 * cache, CPU flash attention) llama.cpp alone differs from an F32 reference by up to ~1e-3 of the logits.
 */
export function llamaCppLogits(
  modelPath: string,
  adapterPath: string | null,
  tokens: readonly number[],
): Float32Array[] {
  const lib = loadLlamaLib();
  lib.ggml_backend_load_all_from_path(lib.binDir);
  lib.llama_backend_init();
  const model = lib.llama_model_load_from_file(modelPath, lib.llama_model_default_params());
  if (model === null) throw new Error(`cannot load ${modelPath}`);
  let adapter: Pointer | null = null;
  let ctx: Pointer | null = null;
  const token = koffi.alloc("int32_t", 1) as Pointer;
  try {
    adapter = adapterPath === null ? null : lib.llama_adapter_lora_init(model, adapterPath);
    if (adapterPath !== null && adapter === null)
      throw new Error(`llama.cpp cannot load the adapter ${adapterPath}`);
    const params = lib.llama_context_default_params();
    const size = Math.max(256, Math.ceil(tokens.length / 256) * 256);
    params.n_ctx = size;
    params.n_batch = size;
    params.n_ubatch = size;
    params.n_threads = 1;
    params.n_threads_batch = 1;
    params.type_k = GGML_TYPE_F32;
    params.type_v = GGML_TYPE_F32;
    params.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    ctx = lib.llama_init_from_model(model, params);
    if (ctx === null) throw new Error("cannot create a llama.cpp context");
    if (adapter !== null && lib.llama_set_adapters_lora(ctx, [adapter], 1, Float32Array.of(1)) !== 0)
      throw new Error("llama_set_adapters_lora failed");
    const vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(model));
    return tokens.map((t) => {
      koffi.encode(token, "int32_t", t);
      if (lib.llama_decode(ctx!, lib.llama_batch_get_one(token, 1)) !== 0)
        throw new Error("llama_decode failed");
      const logits = lib.llama_get_logits_ith(ctx!, -1);
      if (logits === null) throw new Error("no logits");
      return Float32Array.from(koffi.decode(logits, "float", vocab) as number[]);
    });
  } finally {
    koffi.free(token);
    if (ctx !== null) lib.llama_free(ctx);
    if (adapter !== null) lib.llama_adapter_lora_free(adapter);
    lib.llama_model_free(model);
    lib.llama_backend_free();
  }
}
