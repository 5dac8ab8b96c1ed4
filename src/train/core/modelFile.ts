/**
 * What the trainer needs to know about a GGUF model file before loading it (its architecture and its
 * tensors' names, shapes and types), read with ggml's own GGUF reader (`gguf_init_from_file` with
 * `no_alloc`: the header only, no tensor data).
 */
import koffi from "koffi";
import type { LlamaLib, Pointer } from "../libllama/llamaLib.ts";

/** `enum gguf_type` values. */
const GGUF_TYPE_UINT32 = 4;
const GGUF_TYPE_STRING = 8;

export interface ModelTensorInfo {
  name: string;
  /** Shape in ggml order (`dims[0]` is the row length), without trailing 1s. */
  dims: number[];
  /** `enum ggml_type` (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 8 Q8_0, 12 Q4_K, ...). */
  type: number;
}

export interface ModelFileInfo {
  path: string;
  /** `general.architecture`. */
  architecture: string;
  /** `<architecture>.block_count`, or the number of `blk.N` prefixes when the key is absent. */
  blockCount: number;
  tensors: ModelTensorInfo[];
}

export function readModelFile(lib: LlamaLib, path: string): ModelFileInfo {
  const ctx = lib.gguf_init_from_file(path, { no_alloc: true, ctx: null });
  if (ctx === null) throw new Error(`trainer: ${path} is not a readable GGUF file`);
  try {
    const key = (name: string, type: number) => {
      const id = lib.gguf_find_key(ctx, name);
      return Number(id) >= 0 && lib.gguf_get_kv_type(ctx, id) === type ? id : undefined;
    };
    const archId = key("general.architecture", GGUF_TYPE_STRING);
    if (archId === undefined) throw new Error(`trainer: ${path} names no general.architecture`);
    const architecture = lib.gguf_get_val_str(ctx, archId);
    const tensors: ModelTensorInfo[] = [];
    const count = Number(lib.gguf_get_n_tensors(ctx));
    for (let i = 0; i < count; i++) {
      const ne = koffi.decode(lib.gguf_get_tensor_ne(ctx, i) as Pointer, "int64_t", 4) as BigInt64Array;
      const dims = Array.from(ne, Number);
      while (dims.length > 1 && dims.at(-1) === 1) dims.pop();
      tensors.push({ name: lib.gguf_get_tensor_name(ctx, i), dims, type: lib.gguf_get_tensor_type(ctx, i) });
    }
    const blocksId = key(`${architecture}.block_count`, GGUF_TYPE_UINT32);
    const blockCount =
      blocksId !== undefined
        ? lib.gguf_get_val_u32(ctx, blocksId)
        : new Set(tensors.map((t) => /^blk\.(\d+)\./.exec(t.name)?.[1]).filter((b) => b !== undefined)).size;
    return { path, architecture, blockCount, tensors };
  } finally {
    lib.gguf_free(ctx);
  }
}

/**
 * How many of `nLayers` blocks train at `complexity` in (0, 1]: at least one, counted from the top (a
 * run's `complexity`: the fraction of transformer blocks that train or get adapters).
 */
export function trainableBlocks(nLayers: number, complexity: number): number {
  return Math.min(nLayers, Math.max(1, Math.ceil(complexity * nLayers - 1e-9)));
}
