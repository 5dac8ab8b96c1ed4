/**
 * Which base models a LoRA run trains on as they are (QLoRA when quantized) and which are converted first.
 *
 * The adapter trains through the frozen base's matrix multiplications; their backward pass needs
 * `OUT_PROD`/`MUL_MAT` on the weight's type. In the pinned llama.cpp the CPU backend has those for F32 and
 * the quantized types below (verified by training on each: bench/README.md §LoRA). Any other type (F16,
 * BF16, the other K-quants, ...) is converted once to Q8_0, the measured default: it trains at F32's speed
 * within a few percent while holding a quarter of F32's memory (numbers in bench/README.md §LoRA).
 */
import type { OutputType } from "./llamaLib.ts";
import type { ModelFileInfo } from "./modelFile.ts";

/** `enum ggml_type` values whose weights a LoRA adapter can train through, with their names. */
export const LORA_BASE_TYPES: ReadonlyMap<number, string> = new Map([
  [0, "F32"],
  [2, "Q4_0"],
  [3, "Q4_1"],
  [8, "Q8_0"],
  [12, "Q4_K"],
]);

/** The type a base of any other type is converted to before LoRA training. */
export const LORA_FALLBACK_BASE_TYPE: OutputType = "Q8_0";

/** `undefined` when the base trains as it is, else the type to convert it to and why. */
export function loraBaseConversion(model: ModelFileInfo): { to: OutputType; reason: string } | undefined {
  const tensors = model.tensors;
  // Only the 2-D block weights go through the backward matrix products; norms and embeddings are read only.
  const other = tensors.find(
    (t) => /^blk\.\d+\..*\.weight$/.test(t.name) && t.dims.length >= 2 && !LORA_BASE_TYPES.has(t.type),
  );
  if (other === undefined) return undefined;
  return {
    to: LORA_FALLBACK_BASE_TYPE,
    reason: `${other.name} is of ggml type ${other.type}, which LoRA cannot train through in this llama.cpp`,
  };
}
