/**
 * Which base models a LoRA run trains on as they are and which are converted first, chosen by measurement
 * (bench/lora.ts, SmolLM2-135M, 1 thread, same run; bench/README.md §LoRA): against full fine-tuning, LoRA
 * trains at 1.43× the tokens/s with 0.51× the peak RSS on an F32 base, 1.08× / 0.35× on Q8_0, and only
 * 0.59–0.63× / 0.33× on Q4_1 or Q4_0 (the CPU backward through 4-bit weights takes ggml's slow `OUT_PROD`
 * path). So F32 and Q8_0 bases train as they are; any other type (Q4_x, K-quants, F16, BF16, ...) is converted
 * once to Q8_0, which trains 1.8× faster than a 4-bit base for ~5% more memory, and keeps a 4-bit model's
 * values (Q8_0 holds them almost exactly). The adapter is then served on the original file.
 */
import type { OutputType } from "../libllama/llamaLib.ts";
import type { ModelFileInfo } from "../core/modelFile.ts";

/** `enum ggml_type` values of the block weights a LoRA run trains through as they are. */
export const LORA_BASE_TYPES: ReadonlyMap<number, string> = new Map([
  [0, "F32"],
  [8, "Q8_0"],
]);

/** The type a base of any other type is converted to before LoRA training. */
export const LORA_FALLBACK_BASE_TYPE: OutputType = "Q8_0";

/** What the choice depends on besides the model. */
export interface LoraBaseOptions {
  /**
   * The products the trainer's BLAS backend takes (blasBackend.ts): `none`, no backend; `f32`, those of F32
   * weights only (a build without bin/patches/ggml-blas-out-prod-quantized.diff); `any`, those of a weight of any
   * type as well, the backward pass's `OUT_PROD` included, converting the weight to F32 one product at a time.
   */
  blas: "none" | "f32" | "any";
  /** Bytes an F32 copy of the base may take; a larger base trains as it is through BLAS, or by the rule without. */
  f32Budget: number;
  /** With `any`: train through the base as it is even when its F32 copy fits (bench/trainTorch.ts compares). */
  asIs?: boolean;
  /**
   * With `any`: the backend computes the products of weights that are not F32 in bf16 (blasBackend.ts's `bf16`).
   * The base as it is then trains faster than its F32 copy, in less memory (1.22x on SmolLM2, 1.23x on
   * Qwen2.5-Coder-0.5B; bench/README.md, "bf16 products"), so it trains as it is.
   */
  bf16?: boolean;
}

/**
 * `undefined` when the base trains as it is, else the type to convert it to and why. A backend with bf16 products
 * trains every base as it is (faster than an F32 copy, in less memory). Otherwise, with a BLAS backend the base
 * is trained in F32 whenever its F32 copy fits `f32Budget`: that is 2–2.5x the tokens per CPU-second of a Q8_0 base
 * without BLAS, for about 1.5x its peak RSS on SmolLM2 (bench/README.md, "The embedded trainer with BLAS"). A larger
 * base trains as it is through a backend that takes products of any weight type, at 0.87–0.95x an F32 copy's
 * tokens/s in 0.64–0.75x its memory (bench/README.md, "A quantized base through BLAS"), and by the rule without BLAS
 * through one that takes F32 weights only. Without BLAS, F32 and Q8_0 train as they are and any other type goes to
 * Q8_0.
 */
export function loraBaseConversion(
  model: ModelFileInfo,
  options: LoraBaseOptions = { blas: "none", f32Budget: 0 },
): { to: OutputType; reason: string } | undefined {
  // Only the 2-D block weights go through the backward matrix products; norms and embeddings are read only.
  const blocks = model.tensors.filter((t) => /^blk\.\d+\..*\.weight$/.test(t.name) && t.dims.length >= 2);
  if (options.blas === "any" && (options.asIs === true || options.bf16 === true)) return undefined;
  if (options.blas !== "none") {
    const notF32 = blocks.find((t) => t.type !== 0);
    if (notF32 === undefined) return undefined;
    const f32Bytes = model.tensors.reduce((sum, t) => sum + 4 * t.dims.reduce((a, b) => a * b, 1), 0);
    const mib = (bytes: number) => `${Math.round(bytes / 2 ** 20)} MiB`;
    if (f32Bytes <= options.f32Budget)
      return {
        to: "F32",
        reason:
          `${notF32.name} is of ggml type ${notF32.type}; with the BLAS backend LoRA trains fastest through F32 ` +
          `weights (${mib(f32Bytes)}, within the F32 budget of ${mib(options.f32Budget)})`,
      };
    if (options.blas === "any") return undefined;
    const rule = loraBaseConversion(model);
    return rule === undefined
      ? undefined
      : {
          ...rule,
          reason:
            `${rule.reason} (an F32 copy, ${mib(f32Bytes)}, would exceed the F32 budget of ${mib(options.f32Budget)}; ` +
            `this BLAS backend takes F32 weights only: npm run setup:trainer again makes one that trains the base as it is)`,
        };
  }
  const other = blocks.find((t) => !LORA_BASE_TYPES.has(t.type));
  if (other === undefined) return undefined;
  return {
    to: LORA_FALLBACK_BASE_TYPE,
    reason: `${other.name} is of ggml type ${other.type}; LoRA trains fastest through F32 or Q8_0 weights`,
  };
}
