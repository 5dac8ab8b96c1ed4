/**
 * ggml's own dequantization (node-llama-cpp's prebuilt `libggml-base`), for weights in types Conduit does not
 * decode itself: the K-quants (Q4_K, Q6_K, …) and the IQ types most published GGUFs use. `decode` is ggml's
 * `to_float` (`dequantize_row_*`): the values llama.cpp computes with.
 */
import koffi from "koffi";
import { findBinDir, findLibrary } from "./llamaLib.ts";

export interface GgmlQuants {
  /** Bytes of `rows` rows of `perRow` values of `type`; undefined for a type ggml cannot decode here. */
  bytes(type: number, rows: number, perRow: number): number | undefined;
  /** The values of `count` elements of `type` in `bytes`. */
  decode(bytes: Buffer, type: number, count: number): Float32Array;
}

let loaded: GgmlQuants | null | undefined;

/** ggml's dequantization, or `undefined` where its library cannot be loaded. Loaded once per process. */
export function ggmlQuants(): GgmlQuants | undefined {
  if (loaded === undefined) {
    try {
      loaded = bind(koffi.load(findLibrary(findBinDir("cpu"), /^libggml-base\.so$/)));
    } catch {
      loaded = null;
    }
  }
  return loaded ?? undefined;
}

function bind(lib: ReturnType<typeof koffi.load>): GgmlQuants {
  // ggml.h's struct ggml_type_traits.
  const Traits = koffi.struct("conduit_ggml_type_traits", {
    type_name: "const char *",
    blck_size: "int64_t",
    blck_size_interleave: "int64_t",
    type_size: "size_t",
    is_quantized: "bool",
    to_float: "void *",
    from_float_ref: "void *",
  });
  const ToFloat = koffi.proto("void conduit_ggml_to_float(const void *x, float *y, int64_t k)");
  const getTraits = lib.func("void *ggml_get_type_traits(int type)");
  const traitsOf = (type: number) => {
    const traits = koffi.decode(getTraits(type), Traits) as {
      blck_size: number;
      type_size: number;
      is_quantized: boolean;
      to_float: unknown;
    };
    return traits;
  };
  // The types ggml knows end well below this; asking beyond its table would read out of bounds.
  const known = (type: number) => Number.isInteger(type) && type >= 0 && type < 40;
  return {
    bytes(type, rows, perRow) {
      if (!known(type)) return undefined;
      const traits = traitsOf(type);
      if (!traits.is_quantized || traits.to_float === null || traits.blck_size <= 0) return undefined;
      if (perRow % traits.blck_size !== 0) return undefined;
      return rows * (perRow / traits.blck_size) * traits.type_size;
    },
    decode(bytes, type, count) {
      const out = new Float32Array(count);
      koffi.call(traitsOf(type).to_float, ToFloat, bytes, out, count);
      return out;
    },
  };
}
