/**
 * Room in llama.cpp's training graphs for deep models.
 *
 * This llama.cpp release sizes every graph of a context, the training graphs included, like an inference
 * graph: `max(1024, 8 × model tensors)` nodes, plus 6 nodes per tensor pair of every LoRA adapter loaded on
 * the model (`llama_context::graph_max_nodes`). ggml-opt copies the forward graph at that size and adds the
 * backward pass and the optimizer steps to it, so a model of more than a handful of blocks overflows it and
 * the process aborts (`GGML_ASSERT(cgraph->n_nodes < cgraph->size)`; `llama-finetune` dies the same way on
 * SmolLM2-135M's 30 blocks). The API offers one lever: adapters loaded on the model before its context is
 * created. So the trainer writes a rank-1 all-zero LoRA adapter for the model and loads it as many times as
 * the training graphs need; it is never attached to a context, so it changes no computation, and it costs
 * (rows + columns) × 4 bytes per weight matrix.
 */
import { gguf, writeGguf, type GgufTensor } from "../../model/gguf/GgufWriter.ts";
import type { ModelFileInfo } from "../core/modelFile.ts";

/** Graph nodes llama.cpp gives a context of this model with no adapter loaded. */
export function baseGraphNodes(modelTensors: number): number {
  return Math.max(1024, 8 * modelTensors);
}

/**
 * Graph nodes a full training step (forward, backward, AdamW) needs, with margin. Measured on this release
 * with SmolLM2-135M (30 blocks, 273 tensors, every block trained): 3,084 nodes abort, 3,174 train. That is
 * about 11.6 per model tensor; this asks for 14 per tensor plus 256, which leaves small models (up to ~55
 * tensors: stories260K, the test models) on llama.cpp's own 1,024.
 */
export function trainingGraphNodes(modelTensors: number): number {
  return 14 * modelTensors + 256;
}

/**
 * Extra graph nodes a LoRA training step needs per adapted weight (pair of adapter tensors), on top of
 * {@link trainingGraphNodes}: forward (2 MUL_MAT, SCALE, ADD), their backward, gradient accumulation and two
 * AdamW steps. Measured on this release by counting the nodes the scheduler evaluates in one LoRA training
 * step (every target, rank 8, 256-token window): stories260K 822 nodes (48 model tensors, 26 pairs),
 * SmolLM2-135M 4,779 (272 tensors, 150 pairs). This formula gives 1,552 and 7,664: a margin for other
 * architectures, paid for in headroom-adapter loads that cost kilobytes to a few MB.
 */
export const LORA_NODES_PER_PAIR = 24;

/** Graph nodes a LoRA training step with `loraPairs` adapted weights needs, with margin. */
export function loraTrainingGraphNodes(modelTensors: number, loraPairs: number): number {
  return trainingGraphNodes(modelTensors) + LORA_NODES_PER_PAIR * loraPairs;
}

export interface HeadroomAdapter {
  /** Tensor pairs in the adapter (each loaded copy adds 6 graph nodes per pair). */
  pairs: number;
  /** How many times to load it. */
  loads: number;
}

/**
 * Writes the headroom adapter for `modelPath` to `adapterPath` when the model's graphs are too small for
 * training, and says how often to load it; `undefined` when no adapter is needed.
 */
export async function writeHeadroomAdapter(
  model: ModelFileInfo,
  adapterPath: string,
  loraPairs = 0,
): Promise<HeadroomAdapter | undefined> {
  const tensors = model.tensors;
  // A LoRA run's own adapter is loaded on the model too, and llama.cpp gives it 6 nodes per pair.
  const missing =
    loraTrainingGraphNodes(tensors.length, loraPairs) - baseGraphNodes(tensors.length) - 6 * loraPairs;
  if (missing <= 0) return undefined;

  // Every 2-D weight of a block can carry a LoRA pair: lora_a is [columns, 1], lora_b [1, rows].
  const pairs: GgufTensor[] = [];
  for (const tensor of tensors) {
    const [columns, rows, ...rest] = tensor.dims;
    if (!/^blk\.\d+\..*\.weight$/.test(tensor.name) || rows === undefined || rest.some((d) => d !== 1))
      continue;
    const base = tensor.name;
    pairs.push(
      { name: `${base}.lora_a`, dims: [columns!, 1], type: "F32", data: new Float32Array(columns!) },
      { name: `${base}.lora_b`, dims: [1, rows], type: "F32", data: new Float32Array(rows) },
    );
  }
  const pairCount = pairs.length / 2;
  if (pairCount === 0) return undefined;
  await writeGguf(
    adapterPath,
    {
      "general.architecture": gguf.str(model.architecture),
      "general.type": gguf.str("adapter"),
      "adapter.type": gguf.str("lora"),
      "adapter.lora.alpha": gguf.f32(1),
    },
    pairs,
  );
  return { pairs: pairCount, loads: Math.ceil(missing / (6 * pairCount)) };
}
