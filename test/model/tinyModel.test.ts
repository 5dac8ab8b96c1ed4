import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import {
  getLlama,
  JinjaTemplateChatWrapper,
  LlamaLogLevel,
  readGgufFileInfo,
  resolveChatWrapper,
  type Llama,
  type LlamaModel,
  type Token,
} from "node-llama-cpp";
import { writeGguf, type GgufTensor } from "../../src/model/gguf/GgufWriter.ts";
import { float16ToFloat32, float32ToFloat16 } from "../../src/model/gguf/float16.ts";
import { writeGgufUint32 } from "../../src/model/gguf/GgufPatch.ts";
import { loadLlamaLib } from "../../src/train/native/llamaLib.ts";
import { readModelFile } from "../../src/train/native/modelFile.ts";
import { buildTinyVocab, createTinyModel, type TinyModelInfo } from "../../src/model/tinyModel.ts";

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

describe("createTinyModel", () => {
  let llama: Llama;
  let model: LlamaModel;
  let info: TinyModelInfo;
  const file = path.join(dir, "tiny.gguf");

  before(async () => {
    info = await createTinyModel(file, { seed: 7 });
    llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {} });
    model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  });
  after(async () => {
    await model?.dispose();
    await llama?.dispose();
  });

  test("the same seed gives a byte-identical file, another seed a different one", async () => {
    const again = await createTinyModel(path.join(dir, "again.gguf"), { seed: 7 });
    const other = await createTinyModel(path.join(dir, "other.gguf"), { seed: 8 });
    assert.ok(fs.readFileSync(file).equals(fs.readFileSync(again.path)));
    assert.equal(again.sha256, info.sha256);
    assert.notEqual(other.sha256, info.sha256);
    assert.equal(fs.statSync(file).size, info.bytes);
  });

  test("is an all-F32 llama model with the documented shape", async () => {
    const gguf = await readGgufFileInfo(file, { readTensorInfo: true });
    const meta = gguf.metadata;
    assert.equal(meta.general.architecture, "llama");
    assert.equal(meta.general.file_type, 0);
    assert.equal(meta.tokenizer.ggml.model, "llama");
    assert.equal(typeof meta.tokenizer.chat_template, "string");
    assert.ok(gguf.tensorInfo?.every((t) => t.ggmlType === 0));
    assert.equal(gguf.tensorInfo?.length, 3 + 9 * info.blockCount);
    assert.equal(model.trainContextSize, info.contextLength);
    assert.equal(model.fileInsights.totalLayers, info.blockCount + 1);
    assert.ok(info.vocabSize < 600, `vocab of ${info.vocabSize} tokens`);
  });

  test("tokenizes any text and detokenizes it back exactly", () => {
    for (const text of [
      "héllo wörld — 東京 🙂",
      'The quick brown fox, said: "hello world"!\n\tIndented\r\n  two  spaces ',
      " leading space",
      "<|im_start|> is only text unless special tokens are parsed",
      "\u0000\u007f\ufeff𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    ]) {
      const tokens = model.tokenize(text);
      assert.ok(!tokens.includes(model.tokens.bos!), "BOS is added by the caller, not by tokenize");
      assert.equal(model.detokenize(tokens), text);
    }
  });

  test("every multi-character piece is reachable: it is what its own text tokenizes to", () => {
    const vocab = buildTinyVocab();
    const unreachable = vocab.tokens
      .map((piece, id) => ({ piece, id }))
      .filter(({ piece, id }) => vocab.types[id] === 1 && [...piece].length > 1)
      .filter(({ piece, id }) => {
        const tokens = model.tokenize(piece.replaceAll("\u2581", " "));
        return tokens.length !== 1 || tokens[0] !== id;
      });
    assert.deepEqual(unreachable, []);
  });

  test("ChatML control tokens: <|im_start|> parses to one token, <|im_end|> ends generation", () => {
    const imStart = model.tokenize("<|im_start|>", true);
    assert.equal(imStart.length, 1);
    assert.equal(model.detokenize(imStart, true), "<|im_start|>");
    assert.equal(model.detokenize(imStart, false), "");
    const imEnd = info.endOfTurnTokenId as Token;
    assert.deepEqual(model.tokenize("<|im_end|>", true), [imEnd]);
    assert.equal(model.tokens.eot, imEnd);
    assert.equal(model.isEogToken(imEnd), true);
    assert.equal(model.isEogToken(model.tokens.eos!), true);
    assert.equal(model.isEogToken(imStart[0]!), false);
    assert.equal(model.tokens.shouldPrependBosToken, true);
  });

  test("greedy generation is deterministic, and the next-token distribution is finite", async () => {
    const context = await model.createContext({ contextSize: 512, threads: 1 });
    try {
      const prompt = [model.tokens.bos!, ...model.tokenize("<|im_start|>user\nhello<|im_end|>\n", true)];
      const generate = async () => {
        const sequence = context.getSequence();
        try {
          const out: Token[] = [];
          for await (const token of sequence.evaluate(prompt, { temperature: 0 })) {
            out.push(token);
            if (out.length === 20) break;
          }
          return out;
        } finally {
          sequence.dispose();
        }
      };
      const first = await generate();
      assert.ok(first.length > 0);
      assert.deepEqual(await generate(), first);
      model.detokenize(first, true);

      const sequence = context.getSequence();
      try {
        const results = await sequence.controlledEvaluate([
          ...prompt.slice(0, -1),
          [prompt.at(-1)!, { generateNext: { probabilities: true } }],
        ]);
        // Outputs are indexed like the input: only the last item asked for one.
        const probabilities = [...(results[prompt.length - 1]?.next.probabilities?.values() ?? [])];
        assert.equal(probabilities.length, info.vocabSize);
        assert.ok(probabilities.every((p) => Number.isFinite(p) && p >= 0));
        assert.ok(Math.abs(probabilities.reduce((a, b) => a + b, 0) - 1) < 1e-3);
      } finally {
        sequence.dispose();
      }
    } finally {
      await context.dispose();
    }
  });

  test("node-llama-cpp reads the chat template as ChatML", () => {
    const template = String(model.fileInfo.metadata.tokenizer.chat_template);
    const jinja = new JinjaTemplateChatWrapper({ template });
    const rendered = jinja.generateContextState({
      chatHistory: [
        { type: "system", text: "Be brief." },
        { type: "user", text: "Hi" },
        { type: "model", response: [""] },
      ],
    });
    assert.equal(
      rendered.contextText.toString(),
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    );
    // node-llama-cpp's own detection (about 1 s: it renders the template against its known formats).
    assert.equal(resolveChatWrapper(model)?.wrapperName, "ChatML");
  });

  test("rejects shapes llama.cpp cannot run", async () => {
    const out = path.join(dir, "invalid.gguf");
    await assert.rejects(createTinyModel(out, { contextLength: 256 }), RangeError);
    await assert.rejects(createTinyModel(out, { embeddingLength: 64, headCount: 5 }), RangeError);
    await assert.rejects(createTinyModel(out, { headCount: 4, headCountKv: 3 }), RangeError);
    assert.equal(fs.existsSync(out), false);
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

test("the trainer's GGUF reader (ggml's gguf_* API) reads tensor infos back as written", async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gguf-tensors-"));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, "m.gguf");
  const info = await createTinyModel(file, { embeddingLength: 32, blockCount: 3, headCount: 2 });
  const model = readModelFile(loadLlamaLib(), file);
  assert.equal(model.architecture, "llama");
  assert.equal(model.blockCount, 3);
  assert.ok(
    model.tensors.every((x) => x.type === 0),
    "all F32",
  );
  const tensors = model.tensors;
  // token_embd, output_norm, output and 9 tensors per block.
  assert.equal(tensors.length, 3 + 9 * info.blockCount);
  const byName = new Map(tensors.map((x) => [x.name, x.dims]));
  assert.deepEqual(byName.get("token_embd.weight"), [32, info.vocabSize]);
  assert.deepEqual(byName.get("blk.2.ffn_down.weight"), [info.feedForwardLength, 32]);
  assert.deepEqual(byName.get("blk.0.attn_norm.weight"), [32]);
});
