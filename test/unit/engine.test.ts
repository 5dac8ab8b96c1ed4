import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, test } from "node:test";
import { ConduitError } from "../../src/errors.ts";
import { CHATML_TEMPLATE, compileChatTemplate } from "../../src/model/chatTemplate.ts";
import { promptTokens } from "../../src/engine/promptTokens.ts";
import { isValidModelId, ModelRegistry } from "../../src/model/ModelRegistry.ts";
import { TextOutput } from "../../src/engine/TextOutput.ts";

/** The engine's parts that need no model: text output, chat templates, prompt bounds, the model registry. */

function isCode(code: string) {
  return (error: unknown) => error instanceof ConduitError && error.code === code;
}

describe("TextOutput", () => {
  // A fake byte-level detokenizer: token = one byte, decoded as UTF-8 the way llama.cpp's strings are.
  const bytes = (tokens: readonly number[]) => Buffer.from(tokens).toString("utf8");

  test("never splits a multi-byte character across pieces", () => {
    const out = new TextOutput((tokens) => bytes(tokens));
    const pieces = [...Buffer.from("aé€😀b")].map((b) => out.push(b)).concat(out.finish());
    assert.equal(pieces.join(""), "aé€😀b");
    for (const piece of pieces) assert.ok(!piece.includes("\uFFFD"), JSON.stringify(pieces));
    assert.deepEqual(
      pieces.filter((p) => p !== ""),
      ["a", "é", "€", "😀", "b"],
    );
  });

  test("holds back a possible stop string and cuts at the first one", () => {
    const out = new TextOutput((tokens) => bytes(tokens), ["END", "xyz"]);
    const streamed = [...Buffer.from("abcENxENDmore")].map((b) => out.push(b)).join("");
    assert.equal(streamed, "abcENx");
    assert.equal(out.text, "abcENx");
    assert.ok(out.stopped);
    assert.equal(out.finish(), "");
  });

  test("trimEnd (grammar output): trailing whitespace is held back, then dropped", () => {
    const stream = (text: string, stops: string[]) => {
      const out = new TextOutput((tokens) => bytes(tokens), stops, true);
      const pieces = [...Buffer.from(text)].map((b) => out.push(b)).concat(out.finish());
      assert.equal(pieces.join(""), out.text);
      return out.text;
    };
    assert.equal(stream('{"a": 1} \n  ', []), '{"a": 1}');
    assert.equal(stream('{ "a" : 1 }', []), '{ "a" : 1 }');
    assert.equal(stream('{"a": 1} \n\n\n\n\n', ["\n\n\n\n"]), '{"a": 1}');
  });
});

describe("chat template", () => {
  const messages = [
    { role: "system" as const, content: "Be brief." },
    { role: "user" as const, content: "Hi" },
  ];

  test("ChatML fallback renders the standard format; the prompt is a prefix of the training text", () => {
    const chatml = compileChatTemplate(CHATML_TEMPLATE, { isFallback: true });
    const prompt = chatml.render(messages, { addGenerationPrompt: true });
    assert.equal(
      prompt,
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    );
    const training = chatml.render([...messages, { role: "assistant", content: "Hello!" }], {
      addGenerationPrompt: false,
    });
    assert.equal(training, `${prompt}Hello!<|im_end|>\n`);
  });

  test("a template's raise_exception is an invalid_request on messages", () => {
    const strict = compileChatTemplate("{{ raise_exception('roles must alternate') }}");
    assert.throws(
      () => strict.render(messages, { addGenerationPrompt: true }),
      (error: unknown) => isCode("invalid_request")(error) && (error as ConduitError).param === "messages",
    );
  });
});

test("a prompt with more bytes than the context's tokens can stand for is refused without tokenizing it", async () => {
  const never = {
    tokenize() {
      throw new Error("tokenized");
    },
  };
  const prompt = {
    model: never,
    contextSize: 100,
    bos: undefined,
    maxTokenBytes: 4,
  } as unknown as Parameters<typeof promptTokens>[0];
  const sampling = {} as Parameters<typeof promptTokens>[1]["sampling"];
  const request = (text: string) => ({ model: { id: "m", path: "m" }, prompt: text, sampling });
  await assert.rejects(
    () => promptTokens(prompt, request("é".repeat(200))),
    (error: unknown) =>
      error instanceof ConduitError &&
      error.param === "prompt" &&
      /^The prompt is 400 bytes, at least 100 tokens; this model's context holds 100\.$/.test(error.message),
  );
  // One byte less could still fit: it is tokenized.
  await assert.rejects(() => promptTokens(prompt, request("x".repeat(396))), /tokenized/);
});

describe("ModelRegistry", () => {
  test("lists *.gguf files by id and never resolves outside the directory", (t) => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-registry-"));
    t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
    const modelsDir = path.join(dir, "models");
    fs.mkdirSync(modelsDir);
    fs.writeFileSync(path.join(modelsDir, "b-model.gguf"), "x");
    fs.writeFileSync(path.join(modelsDir, "a.Q8_0.gguf"), "xy");
    fs.writeFileSync(path.join(modelsDir, "notes.txt"), "");
    fs.writeFileSync(path.join(dir, "outside.gguf"), "");
    const registry = new ModelRegistry({ modelsDir });

    assert.deepEqual(
      registry.list().map((m) => [m.id, m.sizeBytes]),
      [
        ["a.Q8_0", 2],
        ["b-model", 1],
      ],
    );
    assert.equal(registry.resolve("b-model")?.path, path.join(modelsDir, "b-model.gguf"));
    for (const id of [
      "../outside",
      "..",
      "../models/b-model",
      "sub/b-model",
      "/etc/passwd",
      "b-model\0",
      "",
      ".x",
      "b-model.gguf",
    ])
      assert.equal(registry.resolve(id), undefined, id);
    assert.equal(isValidModelId("..%2foutside"), false);
    assert.throws(() => registry.require("../outside", "model"), isCode("model_not_found"));
  });
});
