/**
 * The llama.cpp trainer: llama.cpp's own training API in the shipped libllama, driven through koffi in the
 * trainer child process (`runTraining.ts`). It ships with Conduit (nothing to install), trains LoRA and full
 * fine-tunes, and computes where generation does (the CPU, or the engine's GPU build).
 */
import os from "node:os";
import { Type } from "@sinclair/typebox";
import type { LoraTarget } from "../../contract/runs.ts";
import type { ComputeDevice } from "../libllama/llamaLib.ts";
import {
  memoryOf,
  totalMemory,
  type EstimatePrior,
  type MemoryLine,
  type TrainerBackend,
  type TrainerHealth,
} from "../core/TrainerBackend.ts";
import { blasKind, blasStatus } from "./blasBackend.ts";
import type { LoraBaseOptions } from "./loraBase.ts";
import { F32_BASE_MEMORY_FRACTION, runTraining } from "./runTraining.ts";

/** The llama.cpp trainer's settings for a job. */
export interface LlamaCppOptions {
  /**
   * Which llama.cpp build computes: the CPU's, or a GPU's (`CONDUIT_GPU` as the engine resolved it). A GPU build
   * whose device does not register trains on the CPU, with a log line.
   */
  device: ComputeDevice;
  /** Model layers offloaded to the GPU, `all` or a count; ignored on the CPU. */
  gpuLayers: "all" | number;
  /**
   * A ggml BLAS backend library to load on the CPU (`npm run setup:trainer`, blasBackend.ts): LoRA then trains
   * through the base as it is where the backend has bf16 products, else through an F32 copy of the base when it
   * fits a quarter of the memory, else through the base as it is (a build that takes F32 weights only: Q8_0).
   * `null`: none.
   */
  blasLibrary: string | null;
  /**
   * Which base LoRA trains through with a BLAS backend that takes every weight type: `auto` (loraBase.ts's rule) or
   * `as-is`, the base's own file even when an F32 copy would fit (for bench/trainTorch.ts's comparison). Defaults
   * to `auto`.
   */
  loraBase?: "auto" | "as-is";
  /**
   * OpenBLAS's threads in the BLAS backend (`OPENBLAS_NUM_THREADS`, unless the environment sets it); ggml's own
   * CPU ops keep the job's `threads`.
   */
  blasThreads: number;
  /**
   * Whether OpenBLAS's threads are chosen between steps by timing them (`threadTuner.ts`: every core, or one
   * fewer when another process takes a core), starting from `blasThreads`; `CONDUIT_TRAIN_THREADS=auto` does.
   * Defaults to false.
   */
  tuneBlasThreads?: boolean;
}

/**
 * The LoRA targets llama.cpp trains: `attn_k` and `attn_v` are left out because in the pinned release keys and
 * values reach attention through the KV cache (`set_rows`), which has no backward pass, so adapters on them
 * would get no gradient and never train.
 */
export const LLAMA_CPP_LORA_TARGETS = [
  "attn_q",
  "attn_output",
  "ffn_gate",
  "ffn_up",
  "ffn_down",
  "output",
] as const satisfies readonly LoraTarget[];

const GEGLU =
  "its feed-forward layers use GEGLU, which this llama.cpp release cannot differentiate (no backward pass)";
const SQUARED_RELU =
  "its feed-forward layers use a squared-ReLU gate, which this llama.cpp release cannot differentiate";

/**
 * Architectures llama.cpp cannot train, with the reason: in the pinned release only the split SwiGLU gate has a
 * backward pass (`ggml_compute_backward`, `GGML_OP_GLU`); these use another gate (read from its
 * `src/models/*.cpp`).
 */
export const LLAMA_CPP_UNTRAINABLE_ARCHITECTURES: Readonly<Record<string, string>> = {
  gemma: GEGLU,
  gemma2: GEGLU,
  gemma3: GEGLU,
  gemma3n: GEGLU,
  gemma4: GEGLU,
  "gemma4-assistant": GEGLU,
  "gemma-embedding": GEGLU,
  grok: GEGLU,
  spark2_5: GEGLU,
  bert: GEGLU,
  "modern-bert": GEGLU,
  nemotron_h: SQUARED_RELU,
  nemotron_h_moe: SQUARED_RELU,
};

/**
 * Its rate at one thread in training tokens per CPU-second, by the bench numbers (docs/trainers.md;
 * bench/README.md, #27): LoRA rank 16, 256-token windows, anchored at SmolLM2-135M and falling with the model's
 * parameters to the power fitted between it and the ~1B model of TinyLlama's shape (on Q8_0 23.4 → 4.2); tiny
 * models are capped by the per-step work that does not shrink with them.
 */
const RATE = {
  referenceParameters: 134_515_008,
  /** LoRA through a Q8_0 base: the default for any base but F32, which is converted to Q8_0 first. */
  loraQuantized: 23.4,
  loraF32: 48.5,
  full: 36.7,
  exponent: 0.82,
  /**
   * With the BLAS backend (bench/README.md, #26: 144.8 on SmolLM2, 25.7 on the ~1B model, the same exponent),
   * LoRA on the F32 copy of any base, and full fine-tuning (91–102 measured with a BLAS build). LoRA through a
   * quantized base as it is (a base whose F32 copy is over budget) made 51.1 and 20.4 tok/s on Qwen2.5-Coder 0.5B
   * and 1.5B, where this line says 49.8 and 19.5.
   */
  loraBlas: 144.8,
  fullBlas: 95,
  /**
   * LoRA through the base as it is with bf16 products (blasBackend.ts's `bf16`; bench/README.md, "bf16 products"):
   * 191.7, 68.0 and 33.1 tok/s on 2 threads on SmolLM2, Qwen2.5-Coder 0.5B and 1.5B, per thread as the threads'
   * exponent below has it, falling with the parameters to this power (0.5B: 55.7 by the line).
   */
  loraBf16: 142,
  bf16Exponent: 0.72,
  /** The test model (64 wide, 2 blocks, 172k parameters) trained LoRA at 7,000–14,000 tokens per second here. */
  most: 8_000,
  /** 2 threads trained SmolLM2 1.35× faster than 1 on 2 cores (measured on the torch trainer). */
  threadExponent: Math.log2(1.35),
} as const;

/**
 * The llama.cpp trainer's prior, by the products its BLAS backend takes (loraBase.ts): none, F32 weights only (a LoRA
 * base over the F32 budget then trains through Q8_0 without it), or every weight type.
 */
export function llamaCppPrior(blas: LoraBaseOptions["blas"], bf16 = false): EstimatePrior {
  return {
    tokensPerSecond(method, model, threads) {
      const scale = model.parameters > 0 ? model.parameters / RATE.referenceParameters : 1;
      if (blas === "any" && bf16 && method !== "full")
        return (
          Math.min(RATE.most, RATE.loraBf16 * scale ** -RATE.bf16Exponent) *
          Math.max(1, threads) ** RATE.threadExponent
        );
      const throughBlas =
        blas === "any" ||
        (blas === "f32" &&
          (method === "full" || 4 * model.parameters <= F32_BASE_MEMORY_FRACTION * totalMemory()));
      const anchored = throughBlas
        ? method === "full"
          ? RATE.fullBlas
          : RATE.loraBlas
        : method === "full"
          ? RATE.full
          : model.fileType === "F32"
            ? RATE.loraF32
            : RATE.loraQuantized;
      const perThread = Math.min(RATE.most, anchored * scale ** -RATE.exponent);
      return perThread * Math.max(1, threads) ** RATE.threadExponent;
    },
    // Preparing the examples and starting the trainer's process (half a second for the test model here), then
    // loading the base and converting it when it is neither F32 nor Q8_0 (SmolLM2's 94 MB Q4_1: about 4 s in all).
    overheadSeconds: (model) => 0.5 + 0.04 * (model.sizeBytes / 2 ** 20),
    // Its backward pass is the slow part (ggml's vector loops, docs/trainers.md): a forward pass costs a tenth.
    forwardShare: 0.1,
  };
}

/**
 * The trainer's peak RSS (bench/README.md, `lora.ts` and `trainTorch.ts`): SmolLM2-135M full 2.42 GB, LoRA on an F32
 * base 1.24 GB, through Q8_0 0.87 GB; ~1.1B of TinyLlama's shape LoRA F32 6.04 GB, Q8_0 3.32 GB; lines through
 * those points (full: F32 weights, gradients and AdamW's two moments, 16 bytes a parameter, and the graph's).
 */
const LLAMA_CPP_MEMORY = {
  full: { fixed: 0.57e9, perParameter: 13.7 },
  loraF32: { fixed: 0.57e9, perParameter: 4.97 },
  loraQ8: { fixed: 0.53e9, perParameter: 2.54 },
  /** Through a quantized base as it is, with BLAS: 2.48 and 4.15 GB on Qwen2.5-Coder 0.5B and 1.5B (0.95 on SmolLM2). */
  loraAsIs: { fixed: 1.7e9, perParameter: 1.6 },
  /**
   * Through the base as it is with bf16 products (bench/README.md, "bf16 products"): 0.92, 2.29 and 3.79 GB on
   * SmolLM2, Qwen2.5-Coder 0.5B and 1.5B. The need grows slower on larger bases (the vocabulary's part shrinks): the
   * lower of the line through the two small bases and the line through the two Qwen bases.
   */
  loraBf16Small: { fixed: 0.41e9, perParameter: 3.8 },
  loraBf16Large: { fixed: 1.582e9, perParameter: 1.427 },
} satisfies Record<string, MemoryLine>;

const LlamaCppHealth = Type.Object(
  {
    available: Type.Boolean({ description: "Always: it ships with node-llama-cpp." }),
    blas: Type.Object(
      {
        available: Type.Boolean({
          description:
            "Runs on the CPU load it and take their products through it (an F32 copy of the base when it fits).",
        }),
        library: Type.Union([Type.String(), Type.Null()], {
          description: "The library (`CONDUIT_TRAINER_BLAS`).",
        }),
        quantized: Type.Optional(
          Type.Boolean({
            description:
              "It takes products of quantized weights too: a base whose F32 copy would not fit trains as it is.",
          }),
        ),
        bf16: Type.Optional(
          Type.Boolean({
            description:
              "It computes the products of a base's non-F32 weights in bf16 (built with oneDNN, on a CPU with " +
              "AVX512-BF16; GGML_BLAS_BF16=0 turns it off): a LoRA base then trains as it is.",
          }),
        ),
        reason: Type.Optional(Type.String({ description: "Why there is none." })),
      },
      { description: "Its BLAS backend, the fast path on the CPU (`npm run setup:trainer`)." },
    ),
  },
  { description: "The embedded llama.cpp trainer." },
);

export const llamaCppTrainer: TrainerBackend<LlamaCppOptions> = {
  name: "llama.cpp",
  setupCommand: null,
  status: () => Promise.resolve({ available: true }),
  health: {
    schema: LlamaCppHealth,
    now: (host) => ({ available: true, blas: blasStatus(host.blas) }),
  } satisfies TrainerHealth<typeof LlamaCppHealth>,
  cannotTrain({ architecture, loraTargets, objective }) {
    if (objective === "dpo")
      return {
        param: "method",
        why:
          'the llama.cpp trainer cannot do preference tuning ("method": "dpo"): its training API optimises ' +
          "next-token cross-entropy only, and DPO needs each answer's summed log-probability under two models",
      };
    const untrainable = LLAMA_CPP_UNTRAINABLE_ARCHITECTURES[architecture];
    if (untrainable !== undefined)
      return {
        param: "baseModelName",
        why: `the llama.cpp trainer cannot train ${architecture} models: ${untrainable}`,
      };
    const kv = (loraTargets ?? []).filter((t) => !(LLAMA_CPP_LORA_TARGETS as readonly string[]).includes(t));
    if (kv.length > 0)
      return {
        param: "loraTargets",
        why:
          `the llama.cpp trainer cannot train ${kv.map((t) => `"${t}"`).join(" and ")}: this llama.cpp release ` +
          "gives the attention K and V weights no gradient (K and V pass through the KV cache)",
      };
    return undefined;
  },
  loraTargets: LLAMA_CPP_LORA_TARGETS,
  // More threads do not pay for ggml's own ops here (bench/README.md); the BLAS backend's products take every core.
  threads: (setting) => (setting === "auto" ? 1 : setting),
  prior: (host) => {
    const blas = blasStatus(host.blas);
    return llamaCppPrior(blasKind(blas), blas.available && blas.bf16);
  },
  memoryNeed(method, model, host) {
    if (method === "full") return Promise.resolve(memoryOf(LLAMA_CPP_MEMORY.full, model.parameters));
    // A LoRA base is trained as it is through a backend with bf16 products, else in F32 when its BLAS backend is
    // there and the F32 copy fits its budget, else as it is through a backend that takes every weight type, else
    // through Q8_0 (`loraBase.ts`).
    const status = blasStatus(host.blas);
    const blas = blasKind(status);
    if (blas === "any" && status.available && status.bf16)
      return Promise.resolve(
        Math.min(
          memoryOf(LLAMA_CPP_MEMORY.loraBf16Small, model.parameters),
          memoryOf(LLAMA_CPP_MEMORY.loraBf16Large, model.parameters),
        ),
      );
    const line =
      blas === "none"
        ? LLAMA_CPP_MEMORY.loraQ8
        : 4 * model.parameters <= F32_BASE_MEMORY_FRACTION * totalMemory()
          ? LLAMA_CPP_MEMORY.loraF32
          : blas === "any"
            ? LLAMA_CPP_MEMORY.loraAsIs
            : LLAMA_CPP_MEMORY.loraQ8;
    return Promise.resolve(memoryOf(line, model.parameters));
  },
  async jobOptions(host) {
    const blas = blasStatus(host.blas);
    const { device, gpuLayers } = await host.accelerator();
    return {
      device,
      gpuLayers: device === "cpu" ? 0 : gpuLayers,
      blasLibrary: blas.available ? blas.library : null,
      // auto: ggml's ops on one thread, OpenBLAS's products on every core (bench/README.md, #26).
      blasThreads: host.threads === "auto" ? os.availableParallelism() : host.threads,
      tuneBlasThreads: host.threads === "auto",
    };
  },
  run: runTraining,
};
