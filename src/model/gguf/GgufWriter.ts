import { createHash, randomBytes } from "node:crypto";
import fs from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import { float32ToFloat16 } from "./float16.ts";

/**
 * A small GGUF v3 writer: metadata key/values and F32/F16/Q8_0 tensors, little-endian, written atomically.
 * Format reference: ggml's `docs/gguf.md` and `ggml/src/gguf.cpp` (llama.cpp v0.5.0, the one node-llama-cpp ships).
 */

export const GGUF_MAGIC = "GGUF";
export const GGUF_VERSION = 3;
/** Tensor data alignment when the metadata has no `general.alignment`. */
export const GGUF_DEFAULT_ALIGNMENT = 32;

/** GGUF metadata value types, numbered as in the file format. */
export const GgufValueType = {
  uint8: 0,
  int8: 1,
  uint16: 2,
  int16: 3,
  uint32: 4,
  int32: 5,
  float32: 6,
  bool: 7,
  string: 8,
  array: 9,
  uint64: 10,
  int64: 11,
  float64: 12,
} as const;

export type GgufNumberType =
  "uint8" | "int8" | "uint16" | "int16" | "uint32" | "int32" | "float32" | "float64";
export type GgufBigIntType = "uint64" | "int64";
export type GgufScalarType = GgufNumberType | GgufBigIntType | "bool" | "string";

/** One metadata value, tagged with its GGUF type (a JS number alone cannot say whether it is a u32 or an f32). */
export type GgufMetadataValue =
  | { type: GgufNumberType; value: number }
  | { type: GgufBigIntType; value: bigint }
  | { type: "bool"; value: boolean }
  | { type: "string"; value: string }
  | { type: "array"; itemType: GgufNumberType; value: ArrayLike<number> }
  | { type: "array"; itemType: GgufBigIntType; value: readonly bigint[] }
  | { type: "array"; itemType: "bool"; value: readonly boolean[] }
  | { type: "array"; itemType: "string"; value: readonly string[] };

/** Shorthands for building metadata values. */
export const gguf = {
  u32: (value: number): GgufMetadataValue => ({ type: "uint32", value }),
  i32: (value: number): GgufMetadataValue => ({ type: "int32", value }),
  u64: (value: bigint | number): GgufMetadataValue => ({ type: "uint64", value: BigInt(value) }),
  f32: (value: number): GgufMetadataValue => ({ type: "float32", value }),
  bool: (value: boolean): GgufMetadataValue => ({ type: "bool", value }),
  str: (value: string): GgufMetadataValue => ({ type: "string", value }),
  strings: (value: readonly string[]): GgufMetadataValue => ({ type: "array", itemType: "string", value }),
  i32s: (value: ArrayLike<number>): GgufMetadataValue => ({ type: "array", itemType: "int32", value }),
  f32s: (value: ArrayLike<number>): GgufMetadataValue => ({ type: "array", itemType: "float32", value }),
};

/** Tensor element types this writer can encode, numbered as `enum ggml_type`. */
export const GgmlType = { F32: 0, F16: 1, Q8_0: 8 } as const;
export type GgmlTensorType = keyof typeof GgmlType;

/** Q8_0: blocks of 32 values, each an F16 scale and 32 signed bytes (ggml's `block_q8_0`). */
export const Q8_0_BLOCK = 32;
const Q8_0_BLOCK_BYTES = 2 + Q8_0_BLOCK;

/** Bytes of `elements` values of `type` (for Q8_0 a multiple of its block). */
export function tensorBytes(type: GgmlTensorType, elements: number): number {
  if (type === "Q8_0") return (elements / Q8_0_BLOCK) * Q8_0_BLOCK_BYTES;
  return elements * (type === "F32" ? 4 : 2);
}
// GGML_MAX_NAME includes the terminating NUL.
const MAX_TENSOR_NAME_BYTES = 63;
const MAX_DIMS = 4;

/** Tensor values in chunks of any size, in ggml order (`dims[0]` varies fastest). */
export type TensorValues = Iterable<Float32Array> | AsyncIterable<Float32Array>;

export interface GgufTensor {
  /** Tensor name as llama.cpp looks it up, e.g. `blk.0.attn_q.weight`; at most 63 bytes. */
  name: string;
  /** Shape in ggml order: `dims[0]` is the row length (a weight's input size); 1 to 4 dims. */
  dims: readonly number[];
  /** Element type in the file; values are always given as float32 and converted. */
  type: GgmlTensorType;
  /**
   * The values, or a function producing them when the tensor is written. A function lets a caller
   * generate or read a tensor chunk by chunk, so no file needs to be in memory at once.
   */
  data: Float32Array | (() => TensorValues);
}

/** What was written. */
export interface GgufWriteResult {
  /** Size of the file in bytes. */
  bytes: number;
  /** SHA-256 of the file, hex. */
  sha256: string;
}

export interface WriteGgufOptions {
  /** Bytes buffered before each write to the file. Defaults to `1048576` (1 MiB). */
  bufferSize?: number;
}

/**
 * Writes a GGUF v3 file to `outPath`: header, `metadata` in insertion order, tensor infos, then tensor data,
 * each tensor aligned to `general.alignment` (taken from `metadata`, else 32). The file appears atomically:
 * it is written to a temp file in the same directory, fsynced and renamed over `outPath`, so a reader never
 * sees a half-written model and a crash leaves the old file in place.
 */
export async function writeGguf(
  outPath: string,
  metadata: Readonly<Record<string, GgufMetadataValue>>,
  tensors: readonly GgufTensor[],
  options: WriteGgufOptions = {},
): Promise<GgufWriteResult> {
  const alignment = alignmentOf(metadata);
  const layout = layoutTensors(tensors, alignment);
  const header = encodeHeader(metadata, layout);

  const dir = path.dirname(path.resolve(outPath));
  await fs.mkdir(dir, { recursive: true });
  const tempPath = path.join(dir, `.${path.basename(outPath)}.${randomBytes(6).toString("hex")}.tmp`);
  const file = await fs.open(tempPath, "wx");
  const out = new BufferedFile(file, options.bufferSize ?? 1 << 20);
  try {
    await out.write(header);
    await out.pad(alignment);
    const dataStart = out.position;
    for (const { tensor, offset, elements } of layout) {
      await out.pad(alignment);
      if (out.position - dataStart !== offset) throw new Error(`gguf: ${tensor.name} is misplaced`);
      let written = 0;
      for await (const chunk of valuesOf(tensor)) {
        written += chunk.length;
        if (written > elements) break;
        await out.write(encodeValues(chunk, tensor.type));
      }
      if (written !== elements) {
        throw new Error(
          `gguf: tensor ${tensor.name} has ${elements} elements but ${written} values were given`,
        );
      }
    }
    // llama.cpp checks the file size covers the last tensor's padded size.
    await out.pad(alignment);
    await out.flush();
    await file.sync();
    await file.close();
    await fs.rename(tempPath, outPath);
  } catch (error) {
    await file.close().catch(() => {});
    await fs.rm(tempPath, { force: true });
    throw error;
  }
  await syncDirectory(dir);
  return { bytes: out.position, sha256: out.digest() };
}

interface TensorLayout {
  tensor: GgufTensor;
  /** Offset of the data from the start of the data section. */
  offset: number;
  elements: number;
}

function alignmentOf(metadata: Readonly<Record<string, GgufMetadataValue>>): number {
  const value = metadata["general.alignment"];
  if (value === undefined) return GGUF_DEFAULT_ALIGNMENT;
  if (value.type !== "uint32") throw new Error("gguf: general.alignment must be a uint32");
  const alignment = value.value;
  if (!Number.isInteger(alignment) || alignment <= 0 || (alignment & (alignment - 1)) !== 0) {
    throw new Error(`gguf: general.alignment must be a power of two, got ${alignment}`);
  }
  return alignment;
}

function layoutTensors(tensors: readonly GgufTensor[], alignment: number): TensorLayout[] {
  const names = new Set<string>();
  let offset = 0;
  return tensors.map((tensor) => {
    const nameBytes = Buffer.byteLength(tensor.name, "utf8");
    if (nameBytes === 0 || nameBytes > MAX_TENSOR_NAME_BYTES) {
      throw new Error(`gguf: tensor name "${tensor.name}" must be 1 to ${MAX_TENSOR_NAME_BYTES} bytes`);
    }
    if (names.has(tensor.name)) throw new Error(`gguf: duplicate tensor name "${tensor.name}"`);
    names.add(tensor.name);
    if (tensor.dims.length < 1 || tensor.dims.length > MAX_DIMS) {
      throw new Error(`gguf: tensor ${tensor.name} must have 1 to ${MAX_DIMS} dims`);
    }
    let elements = 1;
    for (const dim of tensor.dims) {
      if (!Number.isSafeInteger(dim) || dim <= 0)
        throw new Error(`gguf: tensor ${tensor.name} has a bad dim ${dim}`);
      elements *= dim;
    }
    if (!Number.isSafeInteger(elements)) throw new Error(`gguf: tensor ${tensor.name} is too large`);
    if (!(tensor.type in GgmlType)) throw new Error(`gguf: unsupported tensor type ${tensor.type}`);
    if (tensor.type === "Q8_0" && (tensor.dims[0] as number) % Q8_0_BLOCK !== 0) {
      throw new Error(`gguf: tensor ${tensor.name} is Q8_0, so its rows must be a multiple of ${Q8_0_BLOCK} long`);
    }
    offset = alignUp(offset, alignment);
    const entry = { tensor, offset, elements };
    offset += tensorBytes(tensor.type, elements);
    return entry;
  });
}

function encodeHeader(
  metadata: Readonly<Record<string, GgufMetadataValue>>,
  layout: readonly TensorLayout[],
): Buffer {
  const w = new ByteWriter();
  w.bytes(Buffer.from(GGUF_MAGIC, "ascii"));
  w.u32(GGUF_VERSION);
  w.u64(BigInt(layout.length));
  const entries = Object.entries(metadata);
  w.u64(BigInt(entries.length));
  for (const [key, value] of entries) {
    w.string(key);
    if (value.type === "array") {
      w.u32(GgufValueType.array);
      w.u32(GgufValueType[value.itemType]);
      w.u64(BigInt(value.value.length));
      for (let i = 0; i < value.value.length; i++) writeScalar(w, value.itemType, value.value[i], key);
    } else {
      w.u32(GgufValueType[value.type]);
      writeScalar(w, value.type, value.value, key);
    }
  }
  for (const { tensor, offset } of layout) {
    w.string(tensor.name);
    w.u32(tensor.dims.length);
    for (const dim of tensor.dims) w.u64(BigInt(dim));
    w.u32(GgmlType[tensor.type]);
    w.u64(BigInt(offset));
  }
  return w.toBuffer();
}

function writeScalar(w: ByteWriter, type: GgufScalarType, value: unknown, key: string): void {
  const fail = (): never => {
    throw new Error(`gguf: metadata ${key} has a value that is not a valid ${type}: ${String(value)}`);
  };
  switch (type) {
    case "string":
      if (typeof value !== "string") fail();
      w.string(value as string);
      return;
    case "bool":
      if (typeof value !== "boolean") fail();
      w.u8(value ? 1 : 0);
      return;
    case "uint64":
    case "int64": {
      if (typeof value !== "bigint") fail();
      const v = value as bigint;
      if (type === "uint64" ? BigInt.asUintN(64, v) !== v : BigInt.asIntN(64, v) !== v) fail();
      if (type === "uint64") w.u64(v);
      else w.i64(v);
      return;
    }
    case "float32":
    case "float64":
      if (typeof value !== "number") fail();
      if (type === "float32") w.f32(value as number);
      else w.f64(value as number);
      return;
    default: {
      if (typeof value !== "number" || !Number.isInteger(value)) fail();
      const v = value as number;
      const [min, max] = INTEGER_RANGES[type];
      if (v < min || v > max) fail();
      w.int(type, v);
    }
  }
}

const INTEGER_RANGES: Record<"uint8" | "int8" | "uint16" | "int16" | "uint32" | "int32", [number, number]> = {
  uint8: [0, 0xff],
  int8: [-0x80, 0x7f],
  uint16: [0, 0xffff],
  int16: [-0x8000, 0x7fff],
  uint32: [0, 0xffffffff],
  int32: [-0x80000000, 0x7fffffff],
};

async function* valuesOf(tensor: GgufTensor): AsyncIterable<Float32Array> {
  if (tensor.data instanceof Float32Array) yield tensor.data;
  else yield* tensor.data();
}

const LITTLE_ENDIAN = os.endianness() === "LE";

function encodeValues(values: Float32Array, type: GgmlTensorType): Buffer {
  if (type === "F32") {
    // The in-memory bytes already are the file's bytes on little-endian hosts (nearly all of them).
    if (LITTLE_ENDIAN) return Buffer.from(values.buffer, values.byteOffset, values.byteLength);
    const buf = Buffer.allocUnsafe(values.length * 4);
    for (let i = 0; i < values.length; i++) buf.writeFloatLE(values[i] as number, i * 4);
    return buf;
  }
  if (type === "Q8_0") return encodeQ8_0(values);
  const buf = Buffer.allocUnsafe(values.length * 2);
  for (let i = 0; i < values.length; i++) buf.writeUInt16LE(float32ToFloat16(values[i] as number), i * 2);
  return buf;
}

/**
 * Q8_0 blocks as ggml's reference quantizer writes them (`quantize_row_q8_0_ref`): the scale is the block's
 * largest magnitude over 127, each value its rounded quotient (halves away from zero, as `roundf`).
 */
function encodeQ8_0(values: Float32Array): Buffer {
  if (values.length % Q8_0_BLOCK !== 0) {
    throw new Error(`gguf: Q8_0 values must come in whole blocks of ${Q8_0_BLOCK}, got ${values.length}`);
  }
  const buf = Buffer.allocUnsafe(tensorBytes("Q8_0", values.length));
  for (let block = 0; block * Q8_0_BLOCK < values.length; block++) {
    const start = block * Q8_0_BLOCK;
    let amax = 0;
    for (let i = start; i < start + Q8_0_BLOCK; i++) amax = Math.max(amax, Math.abs(values[i] as number));
    const d = Math.fround(amax / 127);
    const id = d !== 0 ? Math.fround(1 / d) : 0;
    const at = block * Q8_0_BLOCK_BYTES;
    buf.writeUInt16LE(float32ToFloat16(d), at);
    for (let i = 0; i < Q8_0_BLOCK; i++) {
      const x = Math.fround((values[start + i] as number) * id);
      buf.writeInt8(Math.sign(x) * Math.round(Math.abs(x)), at + 2 + i);
    }
  }
  return buf;
}

function alignUp(n: number, alignment: number): number {
  return Math.ceil(n / alignment) * alignment;
}

/** Makes the rename durable: without it a power loss can forget the new directory entry. */
async function syncDirectory(dir: string): Promise<void> {
  let handle: fs.FileHandle | undefined;
  try {
    handle = await fs.open(dir, "r");
    await handle.sync();
  } catch {
    // Some platforms and file systems cannot open or fsync a directory; the file itself is synced.
  } finally {
    await handle?.close();
  }
}

/** Growable little-endian byte buffer for the (small) header. */
class ByteWriter {
  private buf = Buffer.alloc(1 << 16);
  private length = 0;

  private reserve(n: number): void {
    if (this.length + n <= this.buf.length) return;
    const next = Buffer.alloc(Math.max(this.buf.length * 2, this.length + n));
    this.buf.copy(next, 0, 0, this.length);
    this.buf = next;
  }

  bytes(data: Uint8Array): void {
    this.reserve(data.length);
    this.buf.set(data, this.length);
    this.length += data.length;
  }

  u8(v: number): void {
    this.reserve(1);
    this.length = this.buf.writeUInt8(v, this.length);
  }

  u32(v: number): void {
    this.reserve(4);
    this.length = this.buf.writeUInt32LE(v, this.length);
  }

  u64(v: bigint): void {
    this.reserve(8);
    this.length = this.buf.writeBigUInt64LE(v, this.length);
  }

  i64(v: bigint): void {
    this.reserve(8);
    this.length = this.buf.writeBigInt64LE(v, this.length);
  }

  f32(v: number): void {
    this.reserve(4);
    this.length = this.buf.writeFloatLE(v, this.length);
  }

  f64(v: number): void {
    this.reserve(8);
    this.length = this.buf.writeDoubleLE(v, this.length);
  }

  int(type: "uint8" | "int8" | "uint16" | "int16" | "uint32" | "int32", v: number): void {
    const size = type.endsWith("8") ? 1 : type.endsWith("16") ? 2 : 4;
    this.reserve(size);
    if (type.startsWith("u")) this.length = this.buf.writeUIntLE(v, this.length, size);
    else this.length = this.buf.writeIntLE(v, this.length, size);
  }

  /** GGUF string: u64 byte length, then UTF-8 without a terminator. */
  string(s: string): void {
    const data = Buffer.from(s, "utf8");
    this.u64(BigInt(data.length));
    this.bytes(data);
  }

  toBuffer(): Buffer {
    return this.buf.subarray(0, this.length);
  }
}

/** Appends to a file through a fixed buffer, hashing what it writes. */
class BufferedFile {
  position = 0;
  private readonly buf: Buffer;
  private used = 0;
  private readonly hash = createHash("sha256");

  constructor(
    private readonly file: fs.FileHandle,
    size: number,
  ) {
    this.buf = Buffer.alloc(Math.max(4096, size));
  }

  async write(data: Uint8Array): Promise<void> {
    let from = 0;
    while (from < data.length) {
      const n = Math.min(data.length - from, this.buf.length - this.used);
      this.buf.set(data.subarray(from, from + n), this.used);
      this.used += n;
      from += n;
      if (this.used === this.buf.length) await this.flush();
    }
    this.position += data.length;
  }

  async pad(alignment: number): Promise<void> {
    const n = alignUp(this.position, alignment) - this.position;
    if (n > 0) await this.write(new Uint8Array(n));
  }

  async flush(): Promise<void> {
    let done = 0;
    while (done < this.used) {
      const { bytesWritten } = await this.file.write(this.buf, done, this.used - done);
      done += bytesWritten;
    }
    this.hash.update(this.buf.subarray(0, this.used));
    this.used = 0;
  }

  digest(): string {
    return this.hash.digest("hex");
  }
}
