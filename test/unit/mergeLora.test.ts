import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { readGgufFileInfo } from "node-llama-cpp";
import { gguf, writeGguf, type GgmlTensorType } from "../../src/model/gguf/GgufWriter.ts";
import { float16ToFloat32 } from "../../src/model/gguf/float16.ts";
import { mergeLora, MergeUnsupportedError } from "../../src/model/gguf/mergeLora.ts";

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

test("a quantized adapted weight is refused, naming its type, and nothing is written", async (t) => {
  const dir = tempDir(t);
  const b = path.join(dir, "base.gguf");
  await base(b, "F32");
  // Mark the adapted weight Q8_0 (type 8) in its tensor info: the file still parses (its data is bigger than needed).
  const bytes = fs.readFileSync(b);
  const name = Buffer.from("blk.0.attn_q.weight");
  const at = bytes.indexOf(name) + name.length + 4 + 2 * 8;
  assert.equal(bytes.readUInt32LE(at), 0);
  bytes.writeUInt32LE(8, at);
  fs.writeFileSync(b, bytes);
  const a = path.join(dir, "adapter.gguf");
  await adapter(a);
  const out = path.join(dir, "merged.gguf");
  await assert.rejects(mergeLora(b, a, out), (error: unknown) => {
    assert.ok(error instanceof MergeUnsupportedError);
    assert.match(error.message, /blk\.0\.attn_q\.weight is of ggml type 8.*llama-export-lora/);
    return true;
  });
  assert.deepEqual(fs.readdirSync(dir).sort(), ["adapter.gguf", "base.gguf"]);
});
