/**
 * A LoRA adapter merged into its base: one GGUF that loads anywhere without `--lora`. Every adapted weight `W`
 * (ggml `[in, out]`) becomes `W + alpha/rank × B·A` (what llama.cpp adds at run time, `B·(A·x)` with the adapter's
 * `lora_a` `[in, rank]` and `lora_b` `[rank, out]`), in `W`'s own type; every other byte of the base (its metadata,
 * tokenizer, chat template and the other tensors) is copied as it is. Adapted weights in F32, F16, BF16 or the
 * block quantizations Q8_0, Q4_0 and Q4_1 are merged (a quantized weight is dequantized, merged and quantized
 * again as ggml's reference quantizer does); other types (the K-quants: Q4_K, Q6_K, …) through a {@link WeightCodec}
 * when the caller has one (ggml's own code: `train/libllama/ggmlQuants.ts`), else refused by
 * {@link MergeUnsupportedError}.
 */
import fs from "node:fs/promises";
import { readGgufFileInfo } from "node-llama-cpp";
import { float16ToFloat32, float32ToFloat16 } from "./float16.ts";

/** A base whose adapted weights are in a type this merge does not write. */
export class MergeUnsupportedError extends Error {}

/** Decodes and encodes weights of the types this merge does not know itself (rows of `perRow` values). */
export interface WeightCodec {
  /** Bytes of `rows` rows of `perRow` values of `type`; undefined for a type it cannot code. */
  bytes(type: number, rows: number, perRow: number): number | undefined;
  decode(bytes: Buffer, type: number, count: number): Float32Array;
  encode(values: Float32Array, type: number, rows: number, perRow: number): Buffer;
}

const IGNORED_KEYS = [
  "tokenizer.ggml.tokens",
  "tokenizer.ggml.scores",
  "tokenizer.ggml.token_type",
  "tokenizer.ggml.merges",
];

const GGML_F32 = 0;
const GGML_F16 = 1;
const GGML_BF16 = 30;
const GGML_Q4_0 = 2;
const GGML_Q4_1 = 3;
const GGML_Q8_0 = 8;
const WIDTH: Record<number, number> = { [GGML_F32]: 4, [GGML_F16]: 2, [GGML_BF16]: 2 };
/** Bytes of a block of 32 values of each block quantization. */
const BLOCK_BYTES: Record<number, number> = { [GGML_Q8_0]: 34, [GGML_Q4_0]: 18, [GGML_Q4_1]: 20 };
const QK = 32;

/** Bytes of `count` values of `type`; `undefined` for a type the merge does not write. */
function bytesOf(type: number, count: number): number | undefined {
  if (WIDTH[type] !== undefined) return count * WIDTH[type];
  if (BLOCK_BYTES[type] !== undefined && count % QK === 0) return (count / QK) * BLOCK_BYTES[type];
  return undefined;
}

/** ggml's block quantizations, decoded and encoded as its reference code does (`ggml-quants.c`, `*_ref`). */
function decodeBlocks(bytes: Buffer, type: number): Float32Array {
  const size = BLOCK_BYTES[type]!;
  const out = new Float32Array((bytes.length / size) * QK);
  for (let block = 0; block * size < bytes.length; block++) {
    const at = block * size;
    const x = out.subarray(block * QK, (block + 1) * QK);
    const d = float16ToFloat32(bytes.readUInt16LE(at));
    if (type === GGML_Q8_0) for (let j = 0; j < QK; j++) x[j] = bytes.readInt8(at + 2 + j) * d;
    else {
      const m = type === GGML_Q4_1 ? float16ToFloat32(bytes.readUInt16LE(at + 2)) : 0;
      const qs = at + (type === GGML_Q4_1 ? 4 : 2);
      for (let j = 0; j < QK / 2; j++) {
        const byte = bytes[qs + j]!;
        x[j] = type === GGML_Q4_1 ? (byte & 0x0f) * d + m : ((byte & 0x0f) - 8) * d;
        x[j + QK / 2] = type === GGML_Q4_1 ? (byte >> 4) * d + m : ((byte >> 4) - 8) * d;
      }
    }
  }
  return out;
}

function encodeBlocks(values: Float32Array, type: number, into: Buffer): void {
  const size = BLOCK_BYTES[type]!;
  // C's (int8_t) cast of a value in range truncates toward zero.
  const trunc = (v: number) => Math.trunc(v);
  for (let block = 0; block * QK < values.length; block++) {
    const at = block * size;
    const x = values.subarray(block * QK, (block + 1) * QK);
    if (type === GGML_Q8_0) {
      let amax = 0;
      for (const v of x) amax = Math.max(amax, Math.abs(v));
      const d = amax / 127;
      const id = d ? 1 / d : 0;
      into.writeUInt16LE(float32ToFloat16(d), at);
      // roundf: halves away from zero.
      for (let j = 0; j < QK; j++)
        into.writeInt8(Math.sign(x[j]! * id) * Math.round(Math.abs(x[j]! * id)), at + 2 + j);
    } else if (type === GGML_Q4_0) {
      let amax = 0;
      let max = 0;
      for (const v of x)
        if (amax < Math.abs(v)) {
          amax = Math.abs(v);
          max = v;
        }
      const d = max / -8;
      const id = d ? 1 / d : 0;
      into.writeUInt16LE(float32ToFloat16(d), at);
      for (let j = 0; j < QK / 2; j++) {
        const lo = Math.min(15, trunc(x[j]! * id + 8.5));
        const hi = Math.min(15, trunc(x[j + QK / 2]! * id + 8.5));
        into[at + 2 + j] = lo | (hi << 4);
      }
    } else {
      let min = Infinity;
      let max = -Infinity;
      for (const v of x) {
        min = Math.min(min, v);
        max = Math.max(max, v);
      }
      const d = (max - min) / 15;
      const id = d ? 1 / d : 0;
      into.writeUInt16LE(float32ToFloat16(d), at);
      into.writeUInt16LE(float32ToFloat16(min), at + 2);
      for (let j = 0; j < QK / 2; j++) {
        const lo = Math.min(15, trunc((x[j]! - min) * id + 0.5));
        const hi = Math.min(15, trunc((x[j + QK / 2]! - min) * id + 0.5));
        into[at + 4 + j] = lo | (hi << 4);
      }
    }
  }
}

interface TensorAt {
  dims: number[];
  type: number;
  offset: number;
}

async function tensorsOf(file: string) {
  const info = await readGgufFileInfo(file, {
    readTensorInfo: true,
    sourceType: "filesystem",
    ignoreKeys: IGNORED_KEYS,
    logWarnings: false,
    spliceSplitFiles: false,
  });
  const tensors = new Map<string, TensorAt>();
  for (const t of info.tensorInfo ?? [])
    tensors.set(t.name, {
      dims: t.dimensions.map(Number),
      type: Number(t.ggmlType),
      offset: Number(t.fileOffset),
    });
  return { info, tensors };
}

function decode(bytes: Buffer, type: number): Float32Array {
  if (BLOCK_BYTES[type] !== undefined) return decodeBlocks(bytes, type);
  const width = WIDTH[type]!;
  const out = new Float32Array(bytes.length / width);
  if (type === GGML_F32) for (let i = 0; i < out.length; i++) out[i] = bytes.readFloatLE(i * 4);
  else if (type === GGML_F16)
    for (let i = 0; i < out.length; i++) out[i] = float16ToFloat32(bytes.readUInt16LE(i * 2));
  else {
    const word = new Uint32Array(1);
    const asFloat = new Float32Array(word.buffer);
    for (let i = 0; i < out.length; i++) {
      word[0] = bytes.readUInt16LE(i * 2) << 16;
      out[i] = asFloat[0]!;
    }
  }
  return out;
}

function encode(values: Float32Array, type: number, into: Buffer): void {
  if (BLOCK_BYTES[type] !== undefined) encodeBlocks(values, type, into);
  else if (type === GGML_F32) for (let i = 0; i < values.length; i++) into.writeFloatLE(values[i]!, i * 4);
  else if (type === GGML_F16)
    for (let i = 0; i < values.length; i++) into.writeUInt16LE(float32ToFloat16(values[i]!), i * 2);
  else {
    const asFloat = new Float32Array(1);
    const word = new Uint32Array(asFloat.buffer);
    for (let i = 0; i < values.length; i++) {
      asFloat[0] = values[i]!;
      const bits = word[0]!;
      // Round to nearest, ties to even (NaN stays NaN: its top bits are kept).
      const rounded = Number.isNaN(values[i]!) ? bits : bits + 0x7fff + ((bits >>> 16) & 1);
      into.writeUInt16LE((rounded >>> 16) & 0xffff, i * 2);
    }
  }
}

async function readAt(handle: fs.FileHandle, offset: number, length: number): Promise<Buffer> {
  const buffer = Buffer.alloc(length);
  for (let done = 0; done < length;) {
    const { bytesRead } = await handle.read(buffer, done, length - done, offset + done);
    if (bytesRead === 0) throw new Error(`unexpected end of file at byte ${offset + done}`);
    done += bytesRead;
  }
  return buffer;
}

export interface MergeResult {
  /** Bytes of the merged file. */
  bytes: number;
  /** Weights merged. */
  weights: number;
}

/**
 * Writes `basePath` with the adapter at `adapterPath` merged in to `outPath` (through a temp file beside it,
 * fsynced, then renamed). `yieldEvery` lets a long merge give the event loop a turn between weights.
 */
export async function mergeLora(
  basePath: string,
  adapterPath: string,
  outPath: string,
  yieldEvery: () => Promise<void> = () => new Promise((resolve) => setImmediate(resolve)),
  codec?: WeightCodec,
): Promise<MergeResult> {
  // A weight's bytes, by this file's own code or the codec's; undefined when neither writes its type.
  const sizeOf = (type: number, rows: number, perRow: number) =>
    bytesOf(type, rows * perRow) ?? codec?.bytes(type, rows, perRow);
  const base = await tensorsOf(basePath);
  const adapter = await tensorsOf(adapterPath);
  const alpha = (adapter.info.metadata as { adapter?: { lora?: { alpha?: unknown } } }).adapter?.lora?.alpha;
  const pairs: { name: string; weight: TensorAt; a: TensorAt; b: TensorAt }[] = [];
  for (const [name, a] of adapter.tensors) {
    if (!name.endsWith(".lora_a")) continue;
    const weightName = name.slice(0, -".lora_a".length);
    const b = adapter.tensors.get(`${weightName}.lora_b`);
    const weight = base.tensors.get(weightName);
    if (!b || !weight)
      throw new Error(`the adapter's ${weightName} has no lora_b, or the base has no such weight`);
    if (weight.dims.length !== 2 || sizeOf(weight.type, weight.dims[1]!, weight.dims[0]!) === undefined)
      throw new MergeUnsupportedError(
        `the base's ${weightName} is of ggml type ${weight.type}: a merge writes F32, F16, BF16, Q8_0, Q4_0 and ` +
          `Q4_1 weights${codec ? ", and the K-quants through ggml" : ""}; a base quantized otherwise needs ` +
          "llama.cpp's llama-export-lora",
      );
    const adapterType = (t: TensorAt) => WIDTH[t.type] !== undefined || t.type === GGML_Q8_0;
    if (!adapterType(a) || !adapterType(b))
      throw new MergeUnsupportedError(`the adapter's ${weightName} is not F32, F16, BF16 or Q8_0`);
    pairs.push({ name: weightName, weight, a, b });
  }
  const temp = `${outPath}.${process.pid}.part`;
  await fs.copyFile(basePath, temp);
  try {
    const baseFile = await fs.open(basePath, "r");
    const adapterFile = await fs.open(adapterPath, "r");
    const out = await fs.open(temp, "r+");
    try {
      for (const { weight, a, b } of pairs) {
        const [inputs, outputs] = weight.dims as [number, number];
        const rank = a.dims[1]!;
        const scale = typeof alpha === "number" && alpha > 0 ? alpha / rank : 1;
        const size = sizeOf(weight.type, outputs, inputs)!;
        const own = bytesOf(weight.type, inputs * outputs) !== undefined;
        const raw = await readAt(baseFile, weight.offset, size);
        const w = own ? decode(raw, weight.type) : codec!.decode(raw, weight.type, inputs * outputs);
        const av = decode(await readAt(adapterFile, a.offset, bytesOf(a.type, inputs * rank)!), a.type);
        const bv = decode(await readAt(adapterFile, b.offset, bytesOf(b.type, rank * outputs)!), b.type);
        // W[o][i] += scale × Σk B[o][k]·A[k][i]: a row of W at a time, as a sum of rows of A.
        for (let o = 0; o < outputs; o++) {
          const row = w.subarray(o * inputs, (o + 1) * inputs);
          for (let k = 0; k < rank; k++) {
            const coefficient = scale * bv[o * rank + k]!;
            if (coefficient === 0) continue;
            const aRow = av.subarray(k * inputs, (k + 1) * inputs);
            for (let i = 0; i < inputs; i++) row[i] = row[i]! + coefficient * aRow[i]!;
          }
        }
        let bytes: Buffer;
        if (own) {
          bytes = Buffer.alloc(size);
          encode(w, weight.type, bytes);
        } else bytes = codec!.encode(w, weight.type, outputs, inputs);
        await out.write(bytes, 0, bytes.length, weight.offset);
        await yieldEvery();
      }
      await out.sync();
    } finally {
      await out.close();
      await adapterFile.close();
      await baseFile.close();
    }
    await fs.rename(temp, outPath);
  } catch (error) {
    await fs.rm(temp, { force: true });
    throw error;
  }
  return { bytes: (await fs.stat(outPath)).size, weights: pairs.length };
}
