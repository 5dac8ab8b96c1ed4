/**
 * A LoRA adapter merged into its base: one GGUF that loads anywhere without `--lora`. Every adapted weight `W`
 * (ggml `[in, out]`) becomes `W + alpha/rank × B·A` (what llama.cpp adds at run time, `B·(A·x)` with the adapter's
 * `lora_a` `[in, rank]` and `lora_b` `[rank, out]`); every other byte of the base (its metadata, tokenizer, chat
 * template and the other tensors) is copied as it is. An adapted weight in F32, F16 or BF16 keeps its type; a
 * quantized one (Q8_0, Q4_0 and Q4_1 decoded here, the K-quants — Q4_K, Q6_K, … — through a {@link WeightCodec}
 * when the caller has one: ggml's own `to_float`, `train/libllama/ggmlQuants.ts`) is written in F16, as llama.cpp's
 * `llama-export-lora` does: quantized again, `W + ΔW` falls back onto the quantization grid `W` came from and most
 * of the fine-tune is gone (bench/README.md#exporting-a-fine-tune-exportts). A type neither decodes is refused by
 * {@link MergeUnsupportedError}.
 */
import fs from "node:fs/promises";
import { readGgufFileInfo } from "node-llama-cpp";
import { float16ToFloat32, float32ToFloat16 } from "./float16.ts";

/** A base whose adapted weights are in a type this merge does not write. */
export class MergeUnsupportedError extends Error {}

/** Decodes weights of the types this merge does not know itself (rows of `perRow` values). */
export interface WeightCodec {
  /** Bytes of `rows` rows of `perRow` values of `type`; undefined for a type it cannot decode. */
  bytes(type: number, rows: number, perRow: number): number | undefined;
  decode(bytes: Buffer, type: number, count: number): Float32Array;
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

/** `values` in a float type (F32, F16 or BF16) into `into`. */
function encode(values: Float32Array, type: number, into: Buffer): void {
  if (type === GGML_F32) for (let i = 0; i < values.length; i++) into.writeFloatLE(values[i]!, i * 4);
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
  /** Of them, quantized weights written in F16. */
  widened: number;
}

/** Bytes copied at a time for the tensors the merge does not change. */
const COPY_CHUNK = 16 * 2 ** 20;

const align = (offset: number, alignment: number) => Math.ceil(offset / alignment) * alignment;

/** A GGUF tensor info record: name, dimensions, type and data offset (relative to the data section). */
function tensorInfoRecord(name: string, dims: number[], type: number, offset: number): Buffer {
  const nameBytes = Buffer.from(name, "utf8");
  const record = Buffer.alloc(8 + nameBytes.length + 4 + 8 * dims.length + 4 + 8);
  let at = record.writeBigUInt64LE(BigInt(nameBytes.length), 0);
  at += nameBytes.copy(record, at);
  at = record.writeUInt32LE(dims.length, at);
  for (const d of dims) at = record.writeBigUInt64LE(BigInt(d), at);
  at = record.writeUInt32LE(type, at);
  record.writeBigUInt64LE(BigInt(offset), at);
  return record;
}

/**
 * Writes `basePath` with the adapter at `adapterPath` merged in to `outPath` (through a temp file beside it,
 * fsynced, then renamed): the base's header and metadata as they are, its tensor infos with the widened weights'
 * new type and the offsets that follow, then every tensor's data, merged or copied. `yieldEvery` lets a long merge
 * give the event loop a turn between weights.
 */
export async function mergeLora(
  basePath: string,
  adapterPath: string,
  outPath: string,
  yieldEvery: () => Promise<void> = () => new Promise((resolve) => setImmediate(resolve)),
  codec?: WeightCodec,
): Promise<MergeResult> {
  // A weight's bytes, by this file's own code or the codec's; undefined when neither decodes its type.
  const sizeOf = (type: number, rows: number, perRow: number) =>
    bytesOf(type, rows * perRow) ?? codec?.bytes(type, rows, perRow);
  const base = await tensorsOf(basePath);
  const adapter = await tensorsOf(adapterPath);
  const alpha = (adapter.info.metadata as { adapter?: { lora?: { alpha?: unknown } } }).adapter?.lora?.alpha;
  const pairs = new Map<string, { a: TensorAt; b: TensorAt }>();
  for (const [name, a] of adapter.tensors) {
    if (!name.endsWith(".lora_a")) continue;
    const weightName = name.slice(0, -".lora_a".length);
    const b = adapter.tensors.get(`${weightName}.lora_b`);
    const weight = base.tensors.get(weightName);
    if (!b || !weight)
      throw new Error(`the adapter's ${weightName} has no lora_b, or the base has no such weight`);
    if (weight.dims.length !== 2 || sizeOf(weight.type, weight.dims[1]!, weight.dims[0]!) === undefined)
      throw new MergeUnsupportedError(
        `the base's ${weightName} is of ggml type ${weight.type}: a merge reads F32, F16, BF16, Q8_0, Q4_0 and ` +
          `Q4_1 weights${codec ? ", and the K-quants through ggml" : ""}; a base quantized otherwise needs ` +
          "llama.cpp's llama-export-lora",
      );
    const adapterType = (t: TensorAt) => WIDTH[t.type] !== undefined || t.type === GGML_Q8_0;
    if (!adapterType(a) || !adapterType(b))
      throw new MergeUnsupportedError(`the adapter's ${weightName} is not F32, F16, BF16 or Q8_0`);
    pairs.set(weightName, { a, b });
  }

  // The new layout: each tensor where the one before it ends, aligned; a widened weight takes its F16 bytes.
  const { info } = base;
  const alignment = Number((info.metadata.general as { alignment?: unknown } | undefined)?.alignment ?? 32);
  const dataStart = info.infoEndOffset;
  if (dataStart === undefined) throw new Error(`${basePath}: no tensor data`);
  const fileSize = (await fs.stat(basePath)).size;
  const order = [...base.tensors.entries()].sort(([, x], [, y]) => x.offset - y.offset);
  const layout: { name: string; at: TensorAt; span: number; type: number; offset: number }[] = [];
  let next = 0;
  order.forEach(([name, at], i) => {
    // An untouched tensor keeps its bytes up to the next one (its padding included); the last, up to the file's end.
    const span = (i + 1 < order.length ? order[i + 1]![1].offset : fileSize) - at.offset;
    const widen = pairs.has(name) && WIDTH[at.type] === undefined;
    const type = widen ? GGML_F16 : at.type;
    const size = widen ? at.dims[0]! * at.dims[1]! * 2 : span;
    layout.push({ name, at, span, type, offset: next });
    next = align(next + size, alignment);
  });
  const byName = new Map(layout.map((entry) => [entry.name, entry]));
  const records = (info.tensorInfo ?? []).map((t) => {
    const entry = byName.get(t.name)!;
    return tensorInfoRecord(t.name, entry.at.dims, entry.type, entry.offset);
  });
  // The header and metadata end where the tensor infos start (node-llama-cpp's `metadataSize`).
  const head = Buffer.concat(records);
  const newDataStart = align(info.metadataSize + head.length, alignment);

  const temp = `${outPath}.${process.pid}.part`;
  let widened = 0;
  const baseFile = await fs.open(basePath, "r");
  try {
    // The base's own first tensor info must be where the metadata ends: else this file is not laid out as read.
    const first = info.tensorInfo?.[0];
    if (first) {
      const expected = tensorInfoRecord(
        first.name,
        first.dimensions.map(Number),
        Number(first.ggmlType),
        Number(first.fileOffset) - dataStart,
      );
      if (!(await readAt(baseFile, info.metadataSize, expected.length)).equals(expected))
        throw new Error(`${basePath}: its tensor infos do not start where its metadata ends`);
    }
    const adapterFile = await fs.open(adapterPath, "r");
    const out = await fs.open(temp, "w");
    try {
      await out.write(await readAt(baseFile, 0, info.metadataSize), 0, info.metadataSize, 0);
      await out.write(head, 0, head.length, info.metadataSize);
      for (const { name, at, span, type, offset } of layout) {
        const target = newDataStart + offset;
        const pair = pairs.get(name);
        if (!pair) {
          for (let done = 0; done < span; done += COPY_CHUNK) {
            const chunk = await readAt(baseFile, at.offset + done, Math.min(COPY_CHUNK, span - done));
            await out.write(chunk, 0, chunk.length, target + done);
          }
          continue;
        }
        const [inputs, outputs] = at.dims as [number, number];
        const { a, b } = pair;
        const rank = a.dims[1]!;
        const scale = typeof alpha === "number" && alpha > 0 ? alpha / rank : 1;
        const raw = await readAt(baseFile, at.offset, sizeOf(at.type, outputs, inputs)!);
        const w =
          bytesOf(at.type, inputs * outputs) !== undefined
            ? decode(raw, at.type)
            : codec!.decode(raw, at.type, inputs * outputs);
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
        const bytes = Buffer.alloc(bytesOf(type, inputs * outputs)!);
        encode(w, type, bytes);
        await out.write(bytes, 0, bytes.length, target);
        if (type !== at.type) widened++;
        await yieldEvery();
      }
      // The file ends with the last tensor's data, padded as the base's is.
      await out.truncate(newDataStart + next);
      await out.sync();
    } finally {
      await out.close();
      await adapterFile.close();
    }
    await fs.rename(temp, outPath);
  } catch (error) {
    await fs.rm(temp, { force: true });
    throw error;
  } finally {
    await baseFile.close();
  }
  return { bytes: (await fs.stat(outPath)).size, weights: pairs.size, widened };
}
