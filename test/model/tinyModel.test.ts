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
import { loadLlamaLib } from "../../src/train/libllama/llamaLib.ts";
import { readModelFile } from "../../src/train/core/modelFile.ts";
import { buildTinyVocab, createTinyModel, type TinyModelInfo } from "../../src/model/tinyModel.ts";

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-tinymodel-"));
after(() => fs.rmSync(dir, { recursive: true, force: true }));

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
