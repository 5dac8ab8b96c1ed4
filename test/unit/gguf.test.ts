import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, describe, test } from "node:test";
import { readGgufFileInfo } from "node-llama-cpp";
import { writeGguf, type GgufTensor } from "../../src/model/gguf/GgufWriter.ts";
import { float16ToFloat32, float32ToFloat16 } from "../../src/model/gguf/float16.ts";
import { writeGgufUint32 } from "../../src/model/gguf/GgufPatch.ts";
import { createTinyModel } from "../../src/model/tinyModel.ts";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-tinymodel-"));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

describe("GgufWriter", () => {
  test("writes every metadata type so that a GGUF reader reads the same values back", async () => {
    const file = path.join(dir, "types.gguf");
    await writeGguf(
      file,
      {
        "general.architecture": { type: "string", value: "llama" },
        "general.alignment": { type: "uint32", value: 64 },
        "t.u8": { type: "uint8", value: 255 },
        "t.i8": { type: "int8", value: -128 },
        "t.u16": { type: "uint16", value: 65535 },
        "t.i16": { type: "int16", value: -32768 },
        "t.i32": { type: "int32", value: -5 },
        "t.f32": { type: "float32", value: 0.5 },
        "t.f64": { type: "float64", value: 0.1 },
        "t.u64": { type: "uint64", value: 2n ** 40n },
        "t.i64": { type: "int64", value: -(2n ** 40n) },
        "t.bool": { type: "bool", value: true },
        "t.str": { type: "string", value: "héllo 東京 🙂" },
        "t.strs": { type: "array", itemType: "string", value: ["a", "", "▁b"] },
        "t.ints": { type: "array", itemType: "int32", value: [1, -2, 3] },
        "t.floats": { type: "array", itemType: "float32", value: new Float32Array([0.25, -1]) },
      },
      [
        { name: "a", dims: [3], type: "F32", data: new Float32Array([1, 2, 3]) },
        {
          name: "b",
          dims: [2, 2],
          type: "F16",
          data: () => [new Float32Array([1, -2]), new Float32Array([0.5, 65504])],
        },
      ],
    );
    const info = await readGgufFileInfo(file, { readTensorInfo: true });
    assert.equal(info.version, 3);
    const t = (info.metadata as unknown as { t: Record<string, unknown> }).t;
    assert.deepEqual(
      { ...t },
      {
        u8: 255,
        i8: -128,
        u16: 65535,
        i16: -32768,
        i32: -5,
        f32: 0.5,
        f64: 0.1,
        u64: 2n ** 40n,
        i64: -(2n ** 40n),
        bool: true,
        str: "héllo 東京 🙂",
        strs: ["a", "", "▁b"],
        ints: [1, -2, 3],
        floats: [0.25, -1],
      },
    );
    assert.deepEqual(
      info.tensorInfo?.map((x) => [x.name, x.dimensions.map(Number), x.ggmlType, Number(x.offset)]),
      [
        ["a", [3], 0, 0],
        // 12 bytes of F32 padded to the 64-byte alignment the metadata asked for.
        ["b", [2, 2], 1, 64],
      ],
    );
    const bytes = fs.readFileSync(file);
    const dataStart = bytes.length - 128;
    assert.equal(dataStart % 64, 0);
    assert.deepEqual(
      [0, 1, 2].map((i) => bytes.readFloatLE(dataStart + i * 4)),
      [1, 2, 3],
    );
    assert.deepEqual(
      [0, 1, 2, 3].map((i) => float16ToFloat32(bytes.readUInt16LE(dataStart + 64 + i * 2))),
      [1, -2, 0.5, 65504],
    );
  });

  test("converts to F16 with round-to-nearest-even, infinities and subnormals", () => {
    assert.equal(float32ToFloat16(1), 0x3c00);
    assert.equal(float32ToFloat16(-0), 0x8000);
    assert.equal(float32ToFloat16(65520), 0x7c00);
    assert.equal(float32ToFloat16(-Infinity), 0xfc00);
    assert.ok(Number.isNaN(float16ToFloat32(float32ToFloat16(NaN))));
    assert.equal(float32ToFloat16(2 ** -24), 0x0001);
    assert.equal(float32ToFloat16(2 ** -26), 0);
    // 1 + 2^-11 is halfway between 1 and the next half; ties go to the even mantissa.
    assert.equal(float32ToFloat16(1 + 2 ** -11), 0x3c00);
    assert.equal(float32ToFloat16(1 + 3 * 2 ** -11), 0x3c02);
  });

  test("writes Q8_0 blocks as ggml's reference quantizer does: a scale of the largest magnitude / 127, rounded quotients", async () => {
    const file = path.join(dir, "q8.gguf");
    const values = new Float32Array(64);
    for (let i = 0; i < 32; i++) values[i] = (i - 16) / 8; // -2 … 1.875: the scale is 2/127
    values[32 + 3] = -0.5; // a block with one value: it becomes -127
    await writeGguf(file, { "general.architecture": { type: "string", value: "llama" } }, [
      { name: "q", dims: [32, 2], type: "Q8_0", data: values },
    ]);
    const info = await readGgufFileInfo(file, { readTensorInfo: true });
    assert.equal(info.fullTensorInfo?.[0]?.ggmlType, 8);
    const bytes = fs.readFileSync(file);
    const data = bytes.length - 2 * 34 - ((32 - ((2 * 34) % 32)) % 32);
    const scale0 = float16ToFloat32(bytes.readUInt16LE(data));
    assert.equal(scale0, float16ToFloat32(float32ToFloat16(2 / 127)));
    const q0 = [...bytes.subarray(data + 2, data + 34)].map((b) => (b << 24) >> 24);
    assert.equal(q0[0], -127);
    assert.equal(q0[16], 0);
    // 0.125 · 127/2 = 7.94 → 8; every value comes back within half a step
    assert.equal(q0[17], 8);
    q0.forEach((q, i) => assert.ok(Math.abs(q * scale0 - (values[i] as number)) <= scale0 / 2 + 1e-6));
    const q1 = [...bytes.subarray(data + 36, data + 68)].map((b) => (b << 24) >> 24);
    assert.deepEqual(q1, Array.from({ length: 32 }, (_, i) => (i === 3 ? -127 : 0)));
    await assert.rejects(
      writeGguf(path.join(dir, "q8-bad.gguf"), {}, [
        { name: "q", dims: [48, 1], type: "Q8_0", data: new Float32Array(48) },
      ]),
      /multiple of 32/,
    );
  });

  test("leaves no file behind, and the old file intact, when a tensor fails", async () => {
    const file = path.join(dir, "atomic", "model.gguf");
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, "old");
    const meta = { "general.architecture": { type: "string", value: "llama" } } as const;
    const short: GgufTensor = { name: "w", dims: [4], type: "F32", data: new Float32Array(3) };
    await assert.rejects(writeGguf(file, meta, [short]), /4 elements but 3 values/);
    const failing: GgufTensor = {
      name: "w",
      dims: [4],
      type: "F32",
      data: function* () {
        yield new Float32Array(2);
        throw new Error("disk on fire");
      },
    };
    await assert.rejects(writeGguf(file, meta, [failing]), /disk on fire/);
    assert.deepEqual(fs.readdirSync(path.dirname(file)), ["model.gguf"]);
    assert.equal(fs.readFileSync(file, "utf8"), "old");
  });

  test("rejects what llama.cpp would reject", async () => {
    const file = path.join(dir, "bad.gguf");
    const w = (name: string, dims: number[]): GgufTensor => ({
      name,
      dims,
      type: "F32",
      data: new Float32Array(1),
    });
    await assert.rejects(writeGguf(file, {}, [w("x".repeat(64), [1])]), /1 to 63 bytes/);
    await assert.rejects(writeGguf(file, {}, [w("x", [1]), w("x", [1])]), /duplicate/);
    await assert.rejects(writeGguf(file, {}, [w("x", [1, 1, 1, 1, 1])]), /dims/);
    await assert.rejects(
      writeGguf(file, { "general.alignment": { type: "uint32", value: 24 } }, []),
      /power of two/,
    );
    await assert.rejects(writeGguf(file, { k: { type: "uint8", value: 256 } }, []), /not a valid uint8/);
    assert.equal(fs.existsSync(file), false);
  });
});

test("a uint32 GGUF metadata value is patched in place", async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-patch-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, "m.gguf");
  await createTinyModel(file, { contextLength: 512 });
  const size = fs.statSync(file).size;
  const contextLength = async () =>
    (await readGgufFileInfo(file, { readTensorInfo: false, logWarnings: false })).metadata.llama
      ?.context_length;
  assert.equal(await contextLength(), 512);
  assert.equal(await writeGgufUint32(file, "llama.context_length", 2048), true);
  assert.equal(await contextLength(), 2048);
  assert.equal(fs.statSync(file).size, size);
  assert.equal(await writeGgufUint32(file, "no.such.key", 1), false);
});
