import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { readGgufFileInfo } from "node-llama-cpp";
import { gguf, writeGguf, type GgmlTensorType } from "../../src/model/gguf/GgufWriter.ts";
import { float16ToFloat32, float32ToFloat16 } from "../../src/model/gguf/float16.ts";
import { mergeLora, MergeUnsupportedError } from "../../src/model/gguf/mergeLora.ts";
import { ggmlQuants } from "../../src/train/libllama/ggmlQuants.ts";

const IN = 8;
const OUT = 6;
const RANK = 2;
const ALPHA = 3;
const values = (n: number, seed: number) =>
  Float32Array.from({ length: n }, (_, i) => Math.sin(i * 0.7 + seed) / 2);

function tempDir(t: { after(fn: () => void): void }) {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-merge-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  return dir;
}

async function base(file: string, type: GgmlTensorType) {
  await writeGguf(file, { "general.architecture": gguf.str("llama"), "general.name": gguf.str("m") }, [
    { name: "token_embd.weight", dims: [IN, 4], type, data: values(IN * 4, 1) },
    { name: "blk.0.attn_q.weight", dims: [IN, OUT], type, data: values(IN * OUT, 2) },
  ]);
}

async function tensor(file: string, name: string): Promise<Float32Array> {
  const info = await readGgufFileInfo(file, { sourceType: "filesystem", logWarnings: false });
  const t = info.tensorInfo!.find((x) => x.name === name)!;
  const bytes = fs.readFileSync(file);
  const count = t.dimensions.map(Number).reduce((a, b) => a * b, 1);
  const at = Number(t.fileOffset);
  return Float32Array.from({ length: count }, (_, i) =>
    Number(t.ggmlType) === 0
      ? bytes.readFloatLE(at + i * 4)
      : float16ToFloat32(bytes.readUInt16LE(at + i * 2)),
  );
}

for (const type of ["F32", "F16"] as const) {
  test(`a ${type} base's adapted weight becomes W + alpha/rank × B·A in ${type}; every other byte stays`, async (t) => {
    const dir = tempDir(t);
    const [b, a, out] = ["base.gguf", "adapter.gguf", "merged.gguf"].map((f) => path.join(dir, f)) as [
      string,
      string,
      string,
    ];
    await base(b, type);
    await adapterOf(a, IN);
    const result = await mergeLora(b, a, out);
    assert.deepEqual(result, { bytes: fs.statSync(b).size, weights: 1, widened: 0 });
    const w = await tensor(b, "blk.0.attn_q.weight");
    const merged = await tensor(out, "blk.0.attn_q.weight");
    const la = values(IN * RANK, 3);
    const lb = values(RANK * OUT, 4);
    let changed = 0;
    for (let o = 0; o < OUT; o++)
      for (let i = 0; i < IN; i++) {
        let delta = 0;
        for (let k = 0; k < RANK; k++) delta += lb[o * RANK + k]! * la[k * IN + i]!;
        const expected = w[o * IN + i]! + (ALPHA / RANK) * delta;
        const got = merged[o * IN + i]!;
        assert.ok(
          Math.abs(got - expected) <= (type === "F32" ? 1e-6 : 2e-3),
          `[${o}][${i}]: ${got} vs ${expected}`,
        );
        if (Math.abs(got - w[o * IN + i]!) > 1e-3) changed++;
      }
    assert.ok(changed > OUT * IN * 0.8, "the merge changed the weight");
    assert.deepEqual(await tensor(out, "token_embd.weight"), await tensor(b, "token_embd.weight"));
    const before = fs.readFileSync(b);
    const after = fs.readFileSync(out);
    const info = await readGgufFileInfo(b, { sourceType: "filesystem", logWarnings: false });
    const q = info.tensorInfo!.find((x) => x.name === "blk.0.attn_q.weight")!;
    const start = Number(q.fileOffset);
    const end = start + IN * OUT * (type === "F32" ? 4 : 2);
    assert.ok(
      before.subarray(0, start).equals(after.subarray(0, start)),
      "the header and other tensors are the base's",
    );
    assert.ok(before.subarray(end).equals(after.subarray(end)));
  });
}

/** Block layouts of ggml's legacy quantizations: bytes per 32 values, and one block's values. */
const BLOCKS = {
  Q8_0: { type: 8, size: 34 },
  Q4_0: { type: 2, size: 18 },
  Q4_1: { type: 3, size: 20 },
} as const;

/** Decodes one block as ggml's `dequantize_row_*` does. */
function decodeBlock(kind: keyof typeof BLOCKS, bytes: Buffer, at: number): number[] {
  const d = float16ToFloat32(bytes.readUInt16LE(at));
  if (kind === "Q8_0") return Array.from({ length: 32 }, (_, j) => bytes.readInt8(at + 2 + j) * d);
  const m = kind === "Q4_1" ? float16ToFloat32(bytes.readUInt16LE(at + 2)) : 0;
  const qs = at + (kind === "Q4_1" ? 4 : 2);
  const nibble = (j: number) => (j < 16 ? bytes[qs + j]! & 15 : bytes[qs + j - 16]! >> 4);
  return Array.from({ length: 32 }, (_, j) => (kind === "Q4_1" ? nibble(j) * d + m : (nibble(j) - 8) * d));
}

/**
 * A base whose last tensor, `blk.0.attn_q.weight` `[64, 6]`, is `kind`: written F32, then its tensor info retyped
 * and its data replaced by blocks of known values (the bytes left over past them are ignored).
 */
async function quantizedBase(file: string, kind: keyof typeof BLOCKS): Promise<number[]> {
  const inputs = 64;
  await writeGguf(file, { "general.architecture": gguf.str("llama") }, [
    { name: "token_embd.weight", dims: [inputs, 4], type: "F32", data: values(inputs * 4, 1) },
    { name: "blk.0.attn_q.weight", dims: [inputs, OUT], type: "F32", data: values(inputs * OUT, 2) },
  ]);
  const bytes = fs.readFileSync(file);
  const name = Buffer.from("blk.0.attn_q.weight");
  bytes.writeUInt32LE(BLOCKS[kind].type, bytes.indexOf(name) + name.length + 4 + 2 * 8);
  fs.writeFileSync(file, bytes);
  const info = await readGgufFileInfo(file, { sourceType: "filesystem", logWarnings: false });
  const at = Number(info.tensorInfo!.find((x) => x.name === "blk.0.attn_q.weight")!.fileOffset);
  const w: number[] = [];
  for (let block = 0; block < (inputs * OUT) / 32; block++) {
    const start = at + block * BLOCKS[kind].size;
    bytes.writeUInt16LE(0x2000 + block, start); // a small positive scale, different in each block
    if (kind === "Q4_1") bytes.writeUInt16LE(0xa000 + block, start + 2); // a small negative minimum
    for (let j = 2; j < BLOCKS[kind].size; j++)
      if (!(kind === "Q4_1" && j < 4)) bytes[start + j] = (block * 31 + j * 17) & 0xff;
    w.push(...decodeBlock(kind, bytes, start));
  }
  fs.writeFileSync(file, bytes);
  return w;
}

/** The F16 bits of W + alpha/rank × B·A, summed in the merge's order (a rank at a time), `w` `[inputs, OUT]`. */
function mergedF16(w: Float32Array | number[], inputs: number): number[] {
  const la = values(inputs * RANK, 3);
  const lb = values(RANK * OUT, 4);
  const sum = Float32Array.from(w);
  for (let o = 0; o < OUT; o++)
    for (let k = 0; k < RANK; k++) {
      const coefficient = (ALPHA / RANK) * lb[o * RANK + k]!;
      for (let i = 0; i < inputs; i++)
        sum[o * inputs + i] = sum[o * inputs + i]! + coefficient * la[k * inputs + i]!;
    }
  return [...sum].map(float32ToFloat16);
}

/** A rank-2 adapter of `blk.0.attn_q.weight` `[inputs, OUT]`, alpha 3. */
async function adapterOf(file: string, inputs: number) {
  await writeGguf(
    file,
    {
      "general.architecture": gguf.str("llama"),
      "general.type": gguf.str("adapter"),
      "adapter.type": gguf.str("lora"),
      "adapter.lora.alpha": gguf.f32(ALPHA),
    },
    [
      {
        name: "blk.0.attn_q.weight.lora_a",
        dims: [inputs, RANK],
        type: "F32",
        data: values(inputs * RANK, 3),
      },
      { name: "blk.0.attn_q.weight.lora_b", dims: [RANK, OUT], type: "F32", data: values(RANK * OUT, 4) },
    ],
  );
}

/**
 * The merged file of a base whose `blk.0.attn_q.weight` `[inputs, OUT]` is quantized: that weight in F16, exactly
 * W + alpha/rank × B·A rounded to F16 (`w`: W decoded); the header and the other tensor as the base has them, the
 * file laid out again (the weight is bigger) and read back by node-llama-cpp's parser.
 */
async function assertWidened(base: string, merged: string, w: Float32Array | number[], inputs: number) {
  const info = await readGgufFileInfo(merged, { sourceType: "filesystem", logWarnings: false });
  const q = info.tensorInfo!.find((x) => x.name === "blk.0.attn_q.weight")!;
  assert.equal(Number(q.ggmlType), 1, "the adapted weight is F16");
  assert.deepEqual(q.dimensions.map(Number), [inputs, OUT]);
  const bytes = fs.readFileSync(merged);
  const at = Number(q.fileOffset);
  const got = Array.from({ length: inputs * OUT }, (_, i) => bytes.readUInt16LE(at + i * 2));
  const expected = mergedF16(w, inputs);
  assert.deepEqual(got, expected, "F16 of W + alpha/rank × B·A");
  assert.ok(
    expected.some((bits, i) => Math.abs(float16ToFloat32(bits) - w[i]!) > 1e-3),
    "the merge changed the weight",
  );
  assert.deepEqual(await tensor(merged, "token_embd.weight"), await tensor(base, "token_embd.weight"));
  assert.equal(
    fs.statSync(merged).size,
    Number(info.infoEndOffset) + Math.ceil((at - Number(info.infoEndOffset) + inputs * OUT * 2) / 32) * 32,
  );
  const baseInfo = await readGgufFileInfo(base, { sourceType: "filesystem", logWarnings: false });
  assert.ok(
    fs.readFileSync(base).subarray(0, baseInfo.metadataSize).equals(bytes.subarray(0, baseInfo.metadataSize)),
    "the header and metadata are the base's",
  );
}

for (const kind of Object.keys(BLOCKS) as (keyof typeof BLOCKS)[])
  test(`a ${kind} weight is merged into F16: exactly W + alpha/rank × B·A rounded to F16, the file laid out again`, async (t) => {
    const dir = tempDir(t);
    const b = path.join(dir, "base.gguf");
    const w = await quantizedBase(b, kind);
    const a = path.join(dir, "adapter.gguf");
    await adapterOf(a, 64);
    const out = path.join(dir, "merged.gguf");
    const result = await mergeLora(b, a, out);
    assert.deepEqual(result, { bytes: fs.statSync(out).size, weights: 1, widened: 1 });
    await assertWidened(b, out, w, 64);
  });

test("a K-quant weight is refused, naming its type, and nothing is written", async (t) => {
  const dir = tempDir(t);
  const b = path.join(dir, "base.gguf");
  await base(b, "F32");
  // Mark the adapted weight Q4_K (type 12) in its tensor info: the file still parses (its data is bigger than needed).
  const bytes = fs.readFileSync(b);
  const name = Buffer.from("blk.0.attn_q.weight");
  const at = bytes.indexOf(name) + name.length + 4 + 2 * 8;
  assert.equal(bytes.readUInt32LE(at), 0);
  bytes.writeUInt32LE(12, at);
  fs.writeFileSync(b, bytes);
  const a = path.join(dir, "adapter.gguf");
  await adapterOf(a, IN);
  const out = path.join(dir, "merged.gguf");
  await assert.rejects(mergeLora(b, a, out), (error: unknown) => {
    assert.ok(error instanceof MergeUnsupportedError);
    assert.match(error.message, /blk\.0\.attn_q\.weight is of ggml type 12.*llama-export-lora/);
    return true;
  });
  assert.deepEqual(fs.readdirSync(dir).sort(), ["adapter.gguf", "base.gguf"]);
});

/** Bytes of one block of 256 values, and where its F16 scales are (the rest: any bits decode to finite values). */
const K_BLOCKS = {
  Q4_K: { type: 12, size: 144, scales: [0, 2] },
  Q6_K: { type: 14, size: 210, scales: [208] },
};

test("a K-quant weight is decoded by ggml's own code and merged into F16", async (t) => {
  const codec = ggmlQuants();
  if (codec === undefined) return t.skip("node-llama-cpp's libggml-base is not here");
  const dir = tempDir(t);
  const inputs = 256;
  for (const [kind, { type, size, scales }] of Object.entries(K_BLOCKS)) {
    // An F32 base retyped, its weight's data replaced by blocks of pseudo-random bits with small scales.
    const b = path.join(dir, `${kind}.gguf`);
    await writeGguf(b, { "general.architecture": gguf.str("llama") }, [
      { name: "token_embd.weight", dims: [inputs, 4], type: "F32", data: values(inputs * 4, 1) },
      { name: "blk.0.attn_q.weight", dims: [inputs, OUT], type: "F32", data: values(inputs * OUT, 2) },
    ]);
    const bytes = fs.readFileSync(b);
    const name = Buffer.from("blk.0.attn_q.weight");
    bytes.writeUInt32LE(type, bytes.indexOf(name) + name.length + 4 + 2 * 8);
    fs.writeFileSync(b, bytes);
    const info = await readGgufFileInfo(b, { sourceType: "filesystem", logWarnings: false });
    const at = Number(info.tensorInfo!.find((x) => x.name === "blk.0.attn_q.weight")!.fileOffset);
    const blocks = Buffer.alloc(OUT * size);
    for (let i = 0; i < blocks.length; i++) blocks[i] = (i * 131 + 7) & 0xff;
    for (let block = 0; block < OUT; block++)
      for (const offset of scales) blocks.writeUInt16LE(0x1800 + block, block * size + offset);
    blocks.copy(bytes, at);
    fs.writeFileSync(b, bytes);
    const w = codec.decode(blocks, type, inputs * OUT);
    assert.ok(w.every(Number.isFinite));
    const a = path.join(dir, "adapter.gguf");
    await adapterOf(a, inputs);
    const out = path.join(dir, `${kind}-merged.gguf`);
    await assert.rejects(mergeLora(b, a, out), MergeUnsupportedError, "without ggml's code it is refused");
    assert.deepEqual(await mergeLora(b, a, out, undefined, codec), {
      bytes: fs.statSync(out).size,
      weights: 1,
      widened: 1,
    });
    await assertWidened(b, out, w, inputs);
  }
});
