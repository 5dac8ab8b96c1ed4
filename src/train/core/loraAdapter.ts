/**
 * LoRA adapter files as llama.cpp reads them (`llama_adapter_lora_init`): a GGUF with
 * `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, and for every adapted weight
 * `W` (ggml shape `[in, out]`) a pair `W.lora_a` `[in, rank]` and `W.lora_b` `[rank, out]`. llama.cpp adds
 * `scale × alpha / rank × B·(A·x)` to `W·x`, so an adapter whose B is zero changes nothing: training starts
 * exactly at the base model (as PEFT does: A random, B zero).
 */
import { gguf, Q8_0_BLOCK, writeGguf, type GgufTensor } from "../../model/gguf/GgufWriter.ts";
import { type LoraTarget } from "../../contract/runs.ts";
import type { TrainerOutputType } from "../../domain/runs.ts";
import { trainableBlocks, type ModelFileInfo } from "./modelFile.ts";
import { seededRandom } from "../../random.ts";

export interface LoraSpec {
  rank: number;
  alpha: number;
  targets: readonly LoraTarget[];
  /** Fraction of the top blocks that get adapters, in (0, 1]. */
  complexity: number;
}

/** One adapted weight: its name and ggml shape `[in, out]`. */
export interface LoraWeight {
  name: string;
  inputs: number;
  outputs: number;
}

/**
 * The weights of `modelPath` that get adapters: `blk.N.<target>.weight` of the top blocks. Throws when none
 * match (a model whose tensors are named differently, or targets it does not have).
 */
export function loraWeights(model: ModelFileInfo, spec: LoraSpec): LoraWeight[] {
  const tensors = model.tensors;
  const nLayers = model.blockCount;
  const firstTrained = nLayers - trainableBlocks(nLayers, spec.complexity);
  const targets = new Set<string>(spec.targets);
  const weights: LoraWeight[] = [];
  for (const tensor of tensors) {
    const match = /^blk\.(\d+)\.([a-z_]+)\.weight$/.exec(tensor.name);
    // The output head (absent when tied to the embeddings, which no adapter can train) sits above every block.
    const wanted =
      tensor.name === "output.weight"
        ? targets.has("output")
        : match !== null && Number(match[1]) >= firstTrained && targets.has(match[2]!);
    if (!wanted) continue;
    const [inputs, outputs, ...rest] = tensor.dims;
    if (inputs === undefined || outputs === undefined || rest.some((d) => d !== 1)) continue;
    weights.push({ name: tensor.name, inputs, outputs });
  }
  if (weights.length === 0)
    throw new Error(
      `trainer: ${model.path} has no ${[...targets].join("/")} weights in its top blocks to adapt ` +
        "(is it a llama.cpp model with blk.N.* tensors?)",
    );
  return weights;
}

/** Adapter metadata: what llama.cpp checks before it loads an adapter on a model. */
function adapterMetadata(model: ModelFileInfo, alpha: number) {
  return {
    "general.architecture": gguf.str(model.architecture),
    "general.type": gguf.str("adapter"),
    "general.name": gguf.str("conduit-lora"),
    "adapter.type": gguf.str("lora"),
    "adapter.lora.alpha": gguf.f32(alpha),
  };
}

/**
 * How an adapter's tensors are stored: the trainer trains F32 tensors (only those train) and keeps the
 * checkpoint it resumes from in F32; the adapter it hands to serving (and each kept epoch-end checkpoint) is F16, half the size on disk and in memory, or Q8_0,
 * a quarter (`CONDUIT_ADAPTER_TYPE`), which llama.cpp loads as they are (bench/README.md §Serving many
 * adapters). Q8_0 stores rows in blocks of 32, so a tensor whose rows are not (B at a rank below 32, or not a
 * multiple of it) stays F16.
 */
export type AdapterTensorType = "F32" | "F16" | "Q8_0";

/**
 * The type a LoRA run's adapter is written as, from its `outputType`: F32, F16 and Q8_0 as they are; runs
 * stored with another type (none is created so) get F16, what every adapter was before Q8_0.
 */
export function servedAdapterType(outputType: TrainerOutputType): AdapterTensorType {
  return outputType === "F32" || outputType === "Q8_0" ? outputType : "F16";
}

/** The type a tensor of rows `rowLength` long is written as, for an adapter of `type`. */
export function adapterTensorType(type: AdapterTensorType, rowLength: number): AdapterTensorType {
  return type === "Q8_0" && rowLength % Q8_0_BLOCK !== 0 ? "F16" : type;
}

/** A weight's A (`[inputs, rank]`) and B (`[rank, outputs]`) as GGUF tensors of an adapter of `type`. */
function loraPair(
  weight: LoraWeight,
  rank: number,
  type: AdapterTensorType,
  a: Float32Array,
  b: Float32Array,
): GgufTensor[] {
  return [
    {
      name: `${weight.name}.lora_a`,
      dims: [weight.inputs, rank],
      type: adapterTensorType(type, weight.inputs),
      data: a,
    },
    {
      name: `${weight.name}.lora_b`,
      dims: [rank, weight.outputs],
      type: adapterTensorType(type, rank),
      data: b,
    },
  ];
}

/**
 * Writes the starting adapter: A uniform in ±1/√in (PEFT's Kaiming-uniform default), B zero. Seeded, so a
 * run's retry starts from the same point. `type` defaults to `"F32"` (what the trainer trains).
 */
export async function writeInitialAdapter(
  model: ModelFileInfo,
  adapterPath: string,
  weights: readonly LoraWeight[],
  spec: LoraSpec,
  seed: number,
  type: AdapterTensorType = "F32",
): Promise<void> {
  const random = seededRandom(seed ^ 0x10ea);
  const tensors: GgufTensor[] = [];
  for (const weight of weights) {
    const a = new Float32Array(weight.inputs * spec.rank);
    const bound = 1 / Math.sqrt(weight.inputs);
    for (let i = 0; i < a.length; i++) a[i] = (random() * 2 - 1) * bound;
    tensors.push(...loraPair(weight, spec.rank, type, a, new Float32Array(spec.rank * weight.outputs)));
  }
  await writeGguf(adapterPath, adapterMetadata(model, spec.alpha), tensors);
}

/**
 * Writes the trained adapter (atomically): the same layout with the trained values, as `type` (the run's
 * `servedAdapterType` for the adapter it serves, `"F32"` for a checkpoint training resumes from).
 */
export async function writeTrainedAdapter(
  model: ModelFileInfo,
  adapterPath: string,
  weights: readonly LoraWeight[],
  spec: LoraSpec,
  values: ReadonlyMap<string, Float32Array>,
  type: AdapterTensorType,
): Promise<number> {
  const tensors: GgufTensor[] = [];
  for (const weight of weights) {
    const a = values.get(`${weight.name}.lora_a`);
    const b = values.get(`${weight.name}.lora_b`);
    if (!a || !b) throw new Error(`trainer: the trained adapter has no tensors for ${weight.name}`);
    tensors.push(...loraPair(weight, spec.rank, type, a, b));
  }
  const result = await writeGguf(adapterPath, adapterMetadata(model, spec.alpha), tensors);
  return result.bytes;
}
