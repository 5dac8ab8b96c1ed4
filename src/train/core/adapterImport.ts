/**
 * Adapters trained elsewhere, checked against the base model they are for before anything keeps them: a GGUF
 * LoRA (llama.cpp's layout, `loraAdapter.ts`) is checked as llama.cpp would load it, and a PEFT adapter
 * (`adapter_model.safetensors` + `adapter_config.json`) is read, checked and turned into that layout, written
 * by the trainers' own adapter writer. Every refusal is an {@link AdapterFileError} naming the upload field
 * and the mismatch; nothing here reads more of a file than its header promises, and no name in a file reaches
 * a path.
 */
import fs from "node:fs/promises";
import { readGgufFileInfo } from "node-llama-cpp";
import { loraLimits } from "../../contract/runs.ts";
import { float16ToFloat32 } from "../../model/gguf/float16.ts";
import type { LoraWeight } from "./loraAdapter.ts";
import type { ModelFileInfo } from "./modelFile.ts";

/** A file that cannot be imported: `field` is the upload field it came in (`file`, `adapter_model`, `adapter_config`, `base_model`). */
export class AdapterFileError extends Error {
  constructor(
    readonly field: string,
    message: string,
  ) {
    super(message);
  }
}

/** The base model as an adapter must match it: its tensors, and the head counts the Q/K row order depends on. */
export interface BaseModelShape extends ModelFileInfo {
  /** `<architecture>.attention.head_count`; 0 when the header has none. */
  headCount: number;
  /** `<architecture>.attention.head_count_kv`; the head count when the header has none. */
  headCountKv: number;
}

/** What an accepted adapter is. */
export interface CheckedAdapter {
  rank: number;
  alpha: number;
  /** The base weights it adapts, in the file's order. */
  weights: LoraWeight[];
}

/** The big header arrays none of the checks need. */
const IGNORED_KEYS = [
  "tokenizer.ggml.tokens",
  "tokenizer.ggml.scores",
  "tokenizer.ggml.token_type",
  "tokenizer.ggml.merges",
];

/** Longest tensor name looked at (GGUF allows 63 bytes; PEFT's names are longer but not this long). */
const MAX_NAME_LENGTH = 512;

/** Reads the base model's header: architecture, tensors and head counts. */
export async function readBaseShape(path: string): Promise<BaseModelShape> {
  const info = await readGgufFileInfo(path, {
    readTensorInfo: true,
    sourceType: "filesystem",
    ignoreKeys: IGNORED_KEYS,
    logWarnings: false,
    spliceSplitFiles: false,
  });
  const architecture = String(info.metadata.general?.architecture ?? "");
  const arch = info.architectureMetadata as {
    block_count?: unknown;
    attention?: { head_count?: unknown; head_count_kv?: unknown };
  };
  const tensors = (info.tensorInfo ?? []).map((t) => ({
    name: t.name,
    dims: trimDims(t.dimensions.map(Number)),
    type: Number(t.ggmlType),
  }));
  const headCount = typeof arch.attention?.head_count === "number" ? arch.attention.head_count : 0;
  const headCountKv =
    typeof arch.attention?.head_count_kv === "number" ? arch.attention.head_count_kv : headCount;
  return {
    path,
    architecture,
    blockCount: typeof arch.block_count === "number" ? arch.block_count : 0,
    tensors,
    headCount,
    headCountKv,
  };
}

/** ggml drops no dims, but writers pad with 1s: `[64, 1]` is a 1-D tensor. */
function trimDims(dims: number[]): number[] {
  const out = [...dims];
  while (out.length > 1 && out.at(-1) === 1) out.pop();
  return out;
}

/** Bytes of `count` elements of ggml type `type`, for the types an adapter may hold; `undefined` for others. */
function tensorBytes(type: number, dims: readonly number[]): number | undefined {
  const count = dims.reduce((a, b) => a * b, 1);
  switch (type) {
    case 0: // F32
      return count * 4;
    case 1: // F16
    case 30: // BF16
      return count * 2;
    case 8: // Q8_0: blocks of 32 values, 34 bytes each
      return (dims[0] ?? 0) % 32 === 0 ? (count / 32) * 34 : undefined;
    default:
      return undefined;
  }
}

const ADAPTER_TYPES = "F32, F16, BF16 or Q8_0";

/** The base's 2-D weight `name` as `[inputs, outputs]`, or `undefined` when it has no such weight. */
function baseWeight(base: BaseModelShape, name: string): [number, number] | undefined {
  const tensor = base.tensors.find((t) => t.name === name);
  if (!tensor || tensor.dims.length !== 2) return undefined;
  return [tensor.dims[0]!, tensor.dims[1]!];
}

function checkRankAndAlpha(field: string, rank: number, alpha: number, alphaField: string): void {
  if (!Number.isInteger(rank) || rank < loraLimits.minRank || rank > loraLimits.maxRank)
    throw new AdapterFileError(
      field,
      `the adapter's rank is ${rank}; Conduit serves ranks ${loraLimits.minRank} to ${loraLimits.maxRank}`,
    );
  if (!Number.isFinite(alpha) || alpha <= 0 || alpha > loraLimits.maxAlpha)
    throw new AdapterFileError(
      field,
      `${alphaField} is ${alpha}; it must be a number in (0, ${loraLimits.maxAlpha}]`,
    );
}

/**
 * Checks a GGUF LoRA adapter against `base` as llama.cpp's loader does, and more: a LoRA adapter for the base's
 * architecture, every tensor a `.lora_a`/`.lora_b` of a 2-D base weight, both halves present with shapes
 * `[in, rank]` and `[rank, out]`, one rank, an alpha, tensor types llama.cpp applies, and every tensor's bytes
 * inside the file (a truncated upload is refused here, not when a chat loads it).
 */
export async function checkGgufAdapter(
  file: string,
  base: BaseModelShape,
  baseName: string,
): Promise<CheckedAdapter> {
  const size = (await fs.stat(file)).size;
  const head = Buffer.alloc(4);
  const handle = await fs.open(file, "r");
  try {
    await handle.read(head, 0, 4, 0);
  } finally {
    await handle.close();
  }
  if (head.toString("latin1") !== "GGUF")
    throw new AdapterFileError("file", "the file is not a GGUF file (it does not start with `GGUF`)");
  let info;
  try {
    info = await readGgufFileInfo(file, {
      readTensorInfo: true,
      sourceType: "filesystem",
      ignoreKeys: IGNORED_KEYS,
      logWarnings: false,
      spliceSplitFiles: false,
    });
  } catch (error) {
    throw new AdapterFileError(
      "file",
      `the file's GGUF header cannot be read (${(error as Error).message.slice(0, 200)}): is it truncated?`,
    );
  }
  // The parser reads past the end of a short file as zeros: a header longer than the file is a cut one.
  if (info.infoEndOffset === undefined || info.infoEndOffset > size)
    throw new AdapterFileError(
      "file",
      `the file's GGUF header cannot be read: it is truncated (its header needs ${info.infoEndOffset ?? "more"} bytes, ` +
        `the file has ${size})`,
    );
  const general = (info.metadata.general ?? {}) as { type?: unknown; architecture?: unknown };
  const adapterMeta = (info.metadata as { adapter?: { type?: unknown; lora?: { alpha?: unknown } } }).adapter;
  if (general.type !== "adapter" || adapterMeta?.type !== "lora")
    throw new AdapterFileError(
      "file",
      `the file is not a LoRA adapter (general.type is ${JSON.stringify(general.type ?? null)}, adapter.type ` +
        `${JSON.stringify(adapterMeta?.type ?? null)}; a LoRA adapter has "adapter" and "lora")`,
    );
  if (general.architecture !== base.architecture)
    throw new AdapterFileError(
      "base_model",
      `the adapter is for architecture ${JSON.stringify(general.architecture ?? null)}, and base model ` +
        `"${baseName}" is ${JSON.stringify(base.architecture)}`,
    );
  const alpha = typeof adapterMeta.lora?.alpha === "number" ? adapterMeta.lora.alpha : Number.NaN;
  const tensors = info.tensorInfo ?? [];
  if (tensors.length === 0) throw new AdapterFileError("file", "the adapter holds no tensors");
  const alignment = (info.metadata.general as { alignment?: unknown } | undefined)?.alignment ?? 32;
  if (
    typeof alignment !== "number" ||
    !Number.isInteger(alignment) ||
    alignment <= 0 ||
    (alignment & (alignment - 1)) !== 0
  )
    throw new AdapterFileError(
      "file",
      `general.alignment is ${JSON.stringify(alignment)}; GGUF needs a power of two`,
    );
  // ggml's reader wants every tensor's data right after the previous one's, padded to the alignment.
  let expectedOffset = 0;
  const halves = new Map<string, { a?: number[]; b?: number[] }>();
  for (const tensor of tensors) {
    const name = tensor.name.slice(0, MAX_NAME_LENGTH);
    const half = name.endsWith(".lora_a") ? "a" : name.endsWith(".lora_b") ? "b" : undefined;
    if (half === undefined)
      throw new AdapterFileError(
        "file",
        `tensor "${name}" is not a LoRA tensor (a LoRA adapter holds only <weight>.lora_a and <weight>.lora_b)`,
      );
    const weight = name.slice(0, -".lora_a".length);
    if (!baseWeight(base, weight))
      throw new AdapterFileError(
        "base_model",
        `tensor "${name}" adapts "${weight}", which base model "${baseName}" does not have`,
      );
    const dims = trimDims(tensor.dimensions.map(Number));
    while (dims.length < 2) dims.push(1);
    const bytes = tensorBytes(Number(tensor.ggmlType), dims);
    if (bytes === undefined)
      throw new AdapterFileError(
        "file",
        `tensor "${name}" is of ggml type ${Number(tensor.ggmlType)}; an adapter's tensors are ${ADAPTER_TYPES}`,
      );
    if (Number(tensor.offset) !== expectedOffset)
      throw new AdapterFileError(
        "file",
        `tensor "${name}"'s data is at offset ${Number(tensor.offset)} of the data section, where GGUF puts it at ` +
          `${expectedOffset}`,
      );
    expectedOffset += Math.ceil(bytes / alignment) * alignment;
    const end = Number(tensor.fileOffset) + bytes;
    if (end > size)
      throw new AdapterFileError(
        "file",
        `the file is truncated: tensor "${name}" ends at byte ${end}, and the file has ${size} bytes`,
      );
    const pair = halves.get(weight) ?? {};
    if (pair[half]) throw new AdapterFileError("file", `tensor "${name}" appears twice`);
    pair[half] = dims;
    halves.set(weight, pair);
  }
  let rank: number | undefined;
  const weights: LoraWeight[] = [];
  for (const [name, { a, b }] of halves) {
    if (!a || !b)
      throw new AdapterFileError(
        "file",
        `"${name}" has ${a ? "a lora_a but no lora_b" : "a lora_b but no lora_a"} tensor`,
      );
    const [inputs, outputs] = baseWeight(base, name)!;
    if (a.length !== 2 || b.length !== 2 || a[0] !== inputs || b[1] !== outputs || a[1] !== b[0])
      throw new AdapterFileError(
        "base_model",
        `"${name}" is [${inputs}, ${outputs}] in base model "${baseName}", so its lora_a must be [${inputs}, rank] ` +
          `and its lora_b [rank, ${outputs}]; the adapter's are [${a.join(", ")}] and [${b.join(", ")}]`,
      );
    if (rank !== undefined && a[1] !== rank)
      throw new AdapterFileError(
        "file",
        `"${name}" has rank ${a[1]} and other weights rank ${rank}; Conduit imports adapters of one rank`,
      );
    rank = a[1]!;
    weights.push({ name, inputs, outputs });
  }
  checkRankAndAlpha("file", rank!, alpha, "adapter.lora.alpha");
  return { rank: rank!, alpha, weights };
}

/** What a PEFT adapter turns into: an accepted adapter and its tensors in llama.cpp's layout (F32). */
export interface ConvertedPeftAdapter extends CheckedAdapter {
  values: Map<string, Float32Array>;
}

/** Largest `adapter_config.json` read. */
const MAX_CONFIG_BYTES = 1 << 20;
/** Largest safetensors header read. */
const MAX_SAFETENSORS_HEADER_BYTES = 16 << 20;

/** PEFT's module names (Hugging Face Llama-style layouts) → llama.cpp's weight names. */
const PEFT_MODULES: Record<string, string> = {
  "self_attn.q_proj": "attn_q",
  "self_attn.k_proj": "attn_k",
  "self_attn.v_proj": "attn_v",
  "self_attn.o_proj": "attn_output",
  "mlp.gate_proj": "ffn_gate",
  "mlp.up_proj": "ffn_up",
  "mlp.down_proj": "ffn_down",
};

/** `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` → `{ weight: "blk.3.attn_q.weight", half: "a" }`. */
function peftTensorTarget(name: string): { weight: string; half: "a" | "b" } | undefined {
  const match =
    /^base_model\.model\.(?:model\.)?(?:layers\.(\d{1,5})\.([a-z_]{1,16}\.[a-z_]{1,16})|(lm_head))\.lora_([AB])(?:\.default)?\.weight$/.exec(
      name,
    );
  if (!match) return undefined;
  const half = match[4] === "A" ? "a" : "b";
  if (match[3] === "lm_head") return { weight: "output.weight", half };
  const target = PEFT_MODULES[match[2]!];
  return target ? { weight: `blk.${Number(match[1])}.${target}.weight`, half } : undefined;
}

interface SafetensorsEntry {
  dtype: string;
  shape: number[];
  start: number;
  end: number;
}

/** The config fields the conversion reads, checked. */
function peftConfig(text: string): { rank: number; alpha: number } {
  let config: Record<string, unknown>;
  try {
    config = JSON.parse(text) as Record<string, unknown>;
  } catch (error) {
    throw new AdapterFileError(
      "adapter_config",
      `adapter_config.json is not JSON (${(error as Error).message})`,
    );
  }
  if (typeof config !== "object" || config === null || Array.isArray(config))
    throw new AdapterFileError("adapter_config", "adapter_config.json is not a JSON object");
  if (config.peft_type !== "LORA")
    throw new AdapterFileError(
      "adapter_config",
      `adapter_config.json's peft_type is ${JSON.stringify(config.peft_type ?? null)}; Conduit imports "LORA" adapters`,
    );
  const refuse = (field: string, why: string): never => {
    throw new AdapterFileError("adapter_config", `adapter_config.json's ${field} ${why}`);
  };
  if (config.use_dora === true) refuse("use_dora", "is true; DoRA adapters cannot be served by llama.cpp");
  if (config.fan_in_fan_out === true)
    refuse("fan_in_fan_out", "is true; only Linear layers' adapters are imported");
  if (config.bias !== undefined && config.bias !== "none")
    refuse("bias", `is ${JSON.stringify(config.bias)}; adapters that train biases are not imported`);
  for (const field of ["rank_pattern", "alpha_pattern"])
    if (
      config[field] !== undefined &&
      config[field] !== null &&
      Object.keys(config[field] as object).length > 0
    )
      refuse(field, "is set; Conduit imports adapters of one rank and one alpha");
  if (Array.isArray(config.modules_to_save) && config.modules_to_save.length > 0)
    refuse("modules_to_save", "is set; an adapter with whole trained modules is not a LoRA adapter alone");
  const rank = typeof config.r === "number" ? config.r : Number.NaN;
  const loraAlpha = typeof config.lora_alpha === "number" ? config.lora_alpha : Number.NaN;
  // rsLoRA scales by alpha / √rank; llama.cpp by alpha / rank: the same scale is alpha·√rank there.
  const alpha = config.use_rslora === true ? loraAlpha * Math.sqrt(rank) : loraAlpha;
  if (!Number.isInteger(rank) || rank < loraLimits.minRank || rank > loraLimits.maxRank)
    refuse(
      "r",
      `is ${JSON.stringify(config.r ?? null)}; Conduit serves ranks ${loraLimits.minRank} to ${loraLimits.maxRank}`,
    );
  checkRankAndAlpha("adapter_config", rank, alpha, "adapter_config.json's lora_alpha");
  return { rank, alpha };
}

/** The safetensors header: every tensor's dtype, shape and bytes, each checked to lie inside the file. */
function safetensorsEntries(bytes: Buffer): Map<string, SafetensorsEntry> {
  if (bytes.length < 8)
    throw new AdapterFileError(
      "adapter_model",
      "adapter_model.safetensors is truncated (shorter than its header)",
    );
  const headerLength = Number(bytes.readBigUInt64LE(0));
  if (headerLength > MAX_SAFETENSORS_HEADER_BYTES)
    throw new AdapterFileError(
      "adapter_model",
      `adapter_model.safetensors' header says it is ${headerLength} bytes; is it a safetensors file?`,
    );
  if (8 + headerLength > bytes.length)
    throw new AdapterFileError(
      "adapter_model",
      `adapter_model.safetensors is truncated: its header needs ${8 + headerLength} bytes, the file has ${bytes.length}`,
    );
  let header: Record<string, unknown>;
  try {
    header = JSON.parse(bytes.subarray(8, 8 + headerLength).toString("utf8")) as Record<string, unknown>;
  } catch {
    throw new AdapterFileError(
      "adapter_model",
      "adapter_model.safetensors' header is not JSON: is it a safetensors file?",
    );
  }
  const dataStart = 8 + headerLength;
  const entries = new Map<string, SafetensorsEntry>();
  for (const [rawName, value] of Object.entries(header)) {
    if (rawName === "__metadata__") continue;
    const name = rawName.slice(0, MAX_NAME_LENGTH);
    const entry = value as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const shape = entry.shape;
    const offsets = entry.data_offsets;
    if (
      typeof entry.dtype !== "string" ||
      !Array.isArray(shape) ||
      !shape.every((d) => Number.isInteger(d) && d >= 0) ||
      !Array.isArray(offsets) ||
      offsets.length !== 2 ||
      !offsets.every((o) => Number.isInteger(o) && o >= 0)
    )
      throw new AdapterFileError(
        "adapter_model",
        `adapter_model.safetensors' entry for "${name}" is malformed`,
      );
    const [start, end] = offsets as [number, number];
    const width = { F32: 4, F16: 2, BF16: 2 }[entry.dtype];
    if (width === undefined)
      throw new AdapterFileError(
        "adapter_model",
        `tensor "${name}" is ${entry.dtype}; an adapter's tensors are F32, F16 or BF16`,
      );
    const count = (shape as number[]).reduce((a, b) => a * b, 1);
    if (end - start !== count * width)
      throw new AdapterFileError("adapter_model", `tensor "${name}"'s byte range does not fit its shape`);
    if (dataStart + end > bytes.length)
      throw new AdapterFileError(
        "adapter_model",
        `adapter_model.safetensors is truncated: tensor "${name}" ends at byte ${dataStart + end}, ` +
          `and the file has ${bytes.length} bytes`,
      );
    entries.set(name, {
      dtype: entry.dtype,
      shape: shape as number[],
      start: dataStart + start,
      end: dataStart + end,
    });
  }
  return entries;
}

function floats(bytes: Buffer, entry: SafetensorsEntry): Float32Array {
  const count = (entry.end - entry.start) / (entry.dtype === "F32" ? 4 : 2);
  const out = new Float32Array(count);
  const view = bytes.subarray(entry.start, entry.end);
  if (entry.dtype === "F32") for (let i = 0; i < count; i++) out[i] = view.readFloatLE(i * 4);
  else if (entry.dtype === "F16")
    for (let i = 0; i < count; i++) out[i] = float16ToFloat32(view.readUInt16LE(i * 2));
  else {
    // BF16 is the top half of an F32.
    const word = new Uint32Array(1);
    const asFloat = new Float32Array(word.buffer);
    for (let i = 0; i < count; i++) {
      word[0] = view.readUInt16LE(i * 2) << 16;
      out[i] = asFloat[0]!;
    }
  }
  return out;
}

/**
 * llama.cpp's Q/K row order for llama-architecture models (`convert_hf_to_gguf.py`'s `permute`, the torch worker's
 * `permute_rows`): the rows of each head, `[first half, second half]`, interleaved. `rows` is row-major
 * `[outputs, rank]`; returns a new array.
 */
export function permuteRows(rows: Float32Array, outputs: number, rank: number, heads: number): Float32Array {
  const out = new Float32Array(rows.length);
  const perHead = outputs / heads;
  const half = perHead / 2;
  for (let h = 0; h < heads; h++)
    for (let s = 0; s < 2; s++)
      for (let j = 0; j < half; j++) {
        const from = h * perHead + s * half + j;
        const to = h * perHead + j * 2 + s;
        out.set(rows.subarray(from * rank, (from + 1) * rank), to * rank);
      }
  return out;
}

/**
 * Reads a PEFT LoRA adapter (`adapter_model.safetensors` + `adapter_config.json`) for `base`: every tensor a
 * `lora_A`/`lora_B` of a module the base has (attention and MLP projections, `lm_head`), shaped `[rank, in]` and
 * `[out, rank]`, the config's rank. Returns the tensors in llama.cpp's layout (PEFT's row-major `[rank, in]` is
 * ggml's `[in, rank]` as it is; a llama model's Q and K output rows are reordered as llama.cpp stores them).
 */
export async function convertPeftAdapter(
  modelFile: string,
  configFile: string,
  base: BaseModelShape,
  baseName: string,
): Promise<ConvertedPeftAdapter> {
  const configSize = (await fs.stat(configFile)).size;
  if (configSize > MAX_CONFIG_BYTES)
    throw new AdapterFileError("adapter_config", `adapter_config.json is over ${MAX_CONFIG_BYTES} bytes`);
  const { rank, alpha } = peftConfig(await fs.readFile(configFile, "utf8"));
  const bytes = await fs.readFile(modelFile);
  const entries = safetensorsEntries(bytes);
  if (entries.size === 0)
    throw new AdapterFileError("adapter_model", "adapter_model.safetensors holds no tensors");
  const halves = new Map<string, { a?: SafetensorsEntry; b?: SafetensorsEntry }>();
  for (const [name, entry] of entries) {
    const target = peftTensorTarget(name);
    if (!target)
      throw new AdapterFileError(
        "adapter_model",
        `tensor "${name}" is not a LoRA tensor of a module Conduit maps to llama.cpp (q/k/v/o_proj, ` +
          "gate/up/down_proj, lm_head)",
      );
    if (!baseWeight(base, target.weight))
      throw new AdapterFileError(
        "base_model",
        `tensor "${name}" adapts "${target.weight}", which base model "${baseName}" does not have`,
      );
    const pair = halves.get(target.weight) ?? {};
    pair[target.half] = entry;
    halves.set(target.weight, pair);
  }
  const weights: LoraWeight[] = [];
  const values = new Map<string, Float32Array>();
  for (const [name, { a, b }] of halves) {
    if (!a || !b)
      throw new AdapterFileError(
        "adapter_model",
        `"${name}" has ${a ? "a lora_A but no lora_B" : "a lora_B but no lora_A"} tensor`,
      );
    const [inputs, outputs] = baseWeight(base, name)!;
    const shapeOk =
      a.shape.length === 2 && b.shape.length === 2 && a.shape[1] === inputs && b.shape[0] === outputs;
    if (!shapeOk)
      throw new AdapterFileError(
        "base_model",
        `"${name}" is ${outputs}×${inputs} (out × in) in base model "${baseName}", so its lora_A must be ` +
          `[rank, ${inputs}] and its lora_B [${outputs}, rank]; the adapter's are [${a.shape.join(", ")}] and ` +
          `[${b.shape.join(", ")}]`,
      );
    if (a.shape[0] !== rank || b.shape[1] !== rank)
      throw new AdapterFileError(
        "adapter_model",
        `"${name}"'s tensors have rank ${a.shape[0]}/${b.shape[1]}, and adapter_config.json's r is ${rank}`,
      );
    let bValues = floats(bytes, b);
    const target = /^blk\.\d+\.(attn_q|attn_k)\.weight$/.exec(name)?.[1];
    if (base.architecture === "llama" && target !== undefined) {
      const heads = target === "attn_q" ? base.headCount : base.headCountKv;
      if (heads <= 0 || outputs % (heads * 2) !== 0)
        throw new AdapterFileError(
          "base_model",
          `base model "${baseName}" names no head count that fits "${name}"`,
        );
      bValues = permuteRows(bValues, outputs, rank, heads);
    }
    weights.push({ name, inputs, outputs });
    values.set(`${name}.lora_a`, floats(bytes, a));
    values.set(`${name}.lora_b`, bValues);
  }
  return { rank, alpha, weights, values };
}
