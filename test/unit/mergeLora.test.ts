import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { readGgufFileInfo } from "node-llama-cpp";
import { gguf, writeGguf, type GgmlTensorType } from "../../src/model/gguf/GgufWriter.ts";
import { float16ToFloat32 } from "../../src/model/gguf/float16.ts";
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

async function adapter(file: string) {
  await writeGguf(
    file,
    {
      "general.architecture": gguf.str("llama"),
      "general.type": gguf.str("adapter"),
      "adapter.type": gguf.str("lora"),
      "adapter.lora.alpha": gguf.f32(ALPHA),
    },
    [
      { name: "blk.0.attn_q.weight.lora_a", dims: [IN, RANK], type: "F32", data: values(IN * RANK, 3) },
      { name: "blk.0.attn_q.weight.lora_b", dims: [RANK, OUT], type: "F32", data: values(RANK * OUT, 4) },
    ],
  );
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
    await adapter(a);
    const result = await mergeLora(b, a, out);
    assert.deepEqual(result, { bytes: fs.statSync(b).size, weights: 1 });
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

for (const kind of Object.keys(BLOCKS) as (keyof typeof BLOCKS)[])
  test(`a ${kind} weight is merged and quantized again as ${kind}: within half a step of W + alpha/rank × B·A`, async (t) => {
    const dir = tempDir(t);
    const b = path.join(dir, "base.gguf");
    const w = await quantizedBase(b, kind);
    const a = path.join(dir, "adapter.gguf");
    const inputs = 64;
    const la = values(inputs * RANK, 3);
    const lb = values(RANK * OUT, 4);
    await writeGguf(
      a,
      {
        "general.architecture": gguf.str("llama"),
        "general.type": gguf.str("adapter"),
        "adapter.type": gguf.str("lora"),
        "adapter.lora.alpha": gguf.f32(ALPHA),
      },
      [
        { name: "blk.0.attn_q.weight.lora_a", dims: [inputs, RANK], type: "F32", data: la },
        { name: "blk.0.attn_q.weight.lora_b", dims: [RANK, OUT], type: "F32", data: lb },
      ],
    );
    const out = path.join(dir, "merged.gguf");
    assert.deepEqual(await mergeLora(b, a, out), { bytes: fs.statSync(b).size, weights: 1 });
    const merged = fs.readFileSync(out);
    const info = await readGgufFileInfo(out, { sourceType: "filesystem", logWarnings: false });
    const q = info.tensorInfo!.find((x) => x.name === "blk.0.attn_q.weight")!;
    assert.equal(Number(q.ggmlType), BLOCKS[kind].type, "the weight keeps its type");
    let changed = 0;
    for (let block = 0; block < (inputs * OUT) / 32; block++) {
      const start = Number(q.fileOffset) + block * BLOCKS[kind].size;
      const got = decodeBlock(kind, merged, start);
      const step = Math.abs(float16ToFloat32(merged.readUInt16LE(start)));
      for (let j = 0; j < 32; j++) {
        const e = block * 32 + j;
        const [o, i] = [Math.floor(e / inputs), e % inputs];
        let delta = 0;
        for (let k = 0; k < RANK; k++) delta += lb[o * RANK + k]! * la[k * inputs + i]!;
        const expected = w[e]! + (ALPHA / RANK) * delta;
        // Half a step, and the scale's own F16 rounding; Q4_0 holds -8 to 7 steps from the block's largest value
        // (-8 steps), so a value near its opposite clamps to 7, a step off (as in ggml).
        const bound = kind === "Q4_0" ? step * 1.01 : step * 0.51;
        assert.ok(
          Math.abs(got[j]! - expected) <= bound + 1e-3 * Math.abs(expected),
          `[${o}][${i}]: ${got[j]} vs ${expected}`,
        );
        if (Math.abs(got[j]! - w[e]!) > 1e-6) changed++;
      }
    }
    assert.ok(changed > (inputs * OUT) / 2, "the merge changed the weight");
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
  await adapter(a);
  const out = path.join(dir, "merged.gguf");
  await assert.rejects(mergeLora(b, a, out), (error: unknown) => {
    assert.ok(error instanceof MergeUnsupportedError);
    assert.match(error.message, /blk\.0\.attn_q\.weight is of ggml type 12.*llama-export-lora/);
    return true;
  });
  assert.deepEqual(fs.readdirSync(dir).sort(), ["adapter.gguf", "base.gguf"]);
});

test("a K-quant weight is merged through ggml's own code: the bytes ggml writes for W + alpha/rank × B·A", async (t) => {
  const codec = ggmlQuants();
  if (codec === undefined) return t.skip("node-llama-cpp's libggml-base is not here");
  const dir = tempDir(t);
  const inputs = 256;
  const b = path.join(dir, "base.gguf");
  await writeGguf(b, { "general.architecture": gguf.str("llama") }, [
    { name: "token_embd.weight", dims: [inputs, 4], type: "F32", data: values(inputs * 4, 1) },
    { name: "blk.0.attn_q.weight", dims: [inputs, OUT], type: "F32", data: values(inputs * OUT, 2) },
  ]);
  for (const [kind, type] of [
    ["Q4_K", 12],
    ["Q6_K", 14],
  ] as const) {
    // Retype the weight and put ggml's blocks of its values where its data starts.
    const bytes = fs.readFileSync(b);
    const name = Buffer.from("blk.0.attn_q.weight");
    bytes.writeUInt32LE(type, bytes.indexOf(name) + name.length + 4 + 2 * 8);
    const typed = path.join(dir, `${kind}.gguf`);
    fs.writeFileSync(typed, bytes);
    const info = await readGgufFileInfo(typed, { sourceType: "filesystem", logWarnings: false });
    const at = Number(info.tensorInfo!.find((x) => x.name === "blk.0.attn_q.weight")!.fileOffset);
    const blocks = codec.encode(values(inputs * OUT, 2), type, OUT, inputs);
    blocks.copy(bytes, at);
    fs.writeFileSync(typed, bytes);
    const la = values(inputs * RANK, 3);
    const lb = values(RANK * OUT, 4);
    const a = path.join(dir, "adapter.gguf");
    await writeGguf(
      a,
      {
        "general.architecture": gguf.str("llama"),
        "general.type": gguf.str("adapter"),
        "adapter.type": gguf.str("lora"),
        "adapter.lora.alpha": gguf.f32(ALPHA),
      },
      [
        { name: "blk.0.attn_q.weight.lora_a", dims: [inputs, RANK], type: "F32", data: la },
        { name: "blk.0.attn_q.weight.lora_b", dims: [RANK, OUT], type: "F32", data: lb },
      ],
    );
    const out = path.join(dir, `${kind}-merged.gguf`);
    await assert.rejects(
      mergeLora(typed, a, out),
      MergeUnsupportedError,
      "without ggml's code it is refused",
    );
    assert.deepEqual(await mergeLora(typed, a, out, undefined, codec), {
      bytes: fs.statSync(typed).size,
      weights: 1,
    });
    // W + alpha/rank × B·A in F32, summed in the merge's order (a rank at a time: the K-quants' scale search may
    // round a last-bit difference into another block).
    const w = codec.decode(blocks, type, inputs * OUT);
    for (let o = 0; o < OUT; o++)
      for (let k = 0; k < RANK; k++) {
        const coefficient = (ALPHA / RANK) * lb[o * RANK + k]!;
        for (let i = 0; i < inputs; i++)
          w[o * inputs + i] = w[o * inputs + i]! + coefficient * la[k * inputs + i]!;
      }
    const expected = codec.encode(w, type, OUT, inputs);
    const merged = fs.readFileSync(out);
    assert.ok(
      merged.subarray(at, at + expected.length).equals(expected),
      `${kind}: ggml's blocks of the merged values`,
    );
    assert.ok(!expected.equals(blocks), `${kind}: the merge changed the weight`);
    assert.ok(
      merged.subarray(0, at).equals(bytes.subarray(0, at)),
      `${kind}: the header and the other tensors stay`,
    );
  }
});
