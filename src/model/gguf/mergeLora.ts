/**
 * A LoRA adapter merged into its base: one GGUF that loads anywhere without `--lora`. Every adapted weight `W`
 * (ggml `[in, out]`) becomes `W + alpha/rank × B·A` (what llama.cpp adds at run time, `B·(A·x)` with the adapter's
 * `lora_a` `[in, rank]` and `lora_b` `[rank, out]`), in `W`'s own type; every other byte of the base (its metadata,
 * tokenizer, chat template and the other tensors) is copied as it is. Bases whose adapted weights are F32, F16
 * or BF16 are merged; a quantized one is refused by {@link MergeUnsupportedError} (requantizing is
 * llama.cpp's `llama-export-lora` and `llama-quantize` work).
 */
import fs from "node:fs/promises";
import { readGgufFileInfo } from "node-llama-cpp";
import { float16ToFloat32, float32ToFloat16 } from "./float16.ts";

/** A base whose adapted weights are in a type this merge does not write. */
export class MergeUnsupportedError extends Error {}

const IGNORED_KEYS = [
  "tokenizer.ggml.tokens",
  "tokenizer.ggml.scores",
  "tokenizer.ggml.token_type",
  "tokenizer.ggml.merges",
];

const GGML_F32 = 0;
const GGML_F16 = 1;
const GGML_BF16 = 30;
const WIDTH: Record<number, number> = { [GGML_F32]: 4, [GGML_F16]: 2, [GGML_BF16]: 2 };

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
): Promise<MergeResult> {
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
    if (WIDTH[weight.type] === undefined)
      throw new MergeUnsupportedError(
        `the base's ${weightName} is of ggml type ${weight.type}: a merge writes F32, F16 or BF16 weights; ` +
          "a quantized base needs llama.cpp's llama-export-lora",
      );
    if (WIDTH[a.type] === undefined || WIDTH[b.type] === undefined)
      throw new MergeUnsupportedError(`the adapter's ${weightName} is not F32, F16 or BF16`);
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
        const width = WIDTH[weight.type]!;
        const w = decode(await readAt(baseFile, weight.offset, inputs * outputs * width), weight.type);
        const av = decode(await readAt(adapterFile, a.offset, inputs * rank * WIDTH[a.type]!), a.type);
        const bv = decode(await readAt(adapterFile, b.offset, rank * outputs * WIDTH[b.type]!), b.type);
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
        const bytes = Buffer.alloc(w.length * width);
        encode(w, weight.type, bytes);
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
