import assert from "node:assert/strict";
import { test } from "node:test";
import OpenAI from "openai";
import { ConduitClient } from "../../src/client/ConduitClient.ts";
import { MAX_EMBEDDING_INPUTS } from "../../src/contract/generation.ts";
import { as, build, KEY_A, KEY_B } from "../lib/helper.ts";
import { runScenarios, type ApiScenario } from "../lib/scenario.ts";

/** `POST /v1/embeddings` through the official openai client, and its Conduit twin, on the tiny model. */

test("the official openai client: embeddings.create, float and base64 alike, usage, identical inputs", async (t) => {
  const { app } = await build(t);
  const address = await app.listen({ port: 0, host: "127.0.0.1" });
  const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_A, maxRetries: 0 });
  const input = ["Once upon a time", "a little robot", "Once upon a time"];

  const floats = await client.embeddings.create({ model: "tiny", input, encoding_format: "float" });
  assert.equal(floats.object, "list");
  assert.equal(floats.model, "tiny");
  assert.deepEqual(
    floats.data.map((d) => [d.object, d.index]),
    input.map((_, i) => ["embedding", i]),
  );
  const dimensions = floats.data[0]!.embedding.length;
  // The tiny model's embedding length (src/model/tinyModel.ts).
  assert.equal(dimensions, 64);
  for (const d of floats.data) {
    assert.equal(d.embedding.length, dimensions);
    assert.ok(d.embedding.every(Number.isFinite));
  }
  assert.deepEqual(
    floats.data[2]!.embedding,
    floats.data[0]!.embedding,
    "identical inputs, identical vectors",
  );
  assert.notDeepEqual(floats.data[1]!.embedding, floats.data[0]!.embedding);
  assert.ok(floats.usage.prompt_tokens > input.length, JSON.stringify(floats.usage));
  assert.equal(floats.usage.total_tokens, floats.usage.prompt_tokens);

  // Without encoding_format the client asks for base64 and decodes it itself.
  const decoded = await client.embeddings.create({ model: "tiny", input });
  assert.deepEqual(
    decoded.data.map((d) => d.embedding),
    floats.data.map((d) => d.embedding.map((x) => Math.fround(x))),
  );
  assert.deepEqual(decoded.usage, floats.usage);

  // base64 as it comes over the wire: little-endian float32 bytes.
  const raw = await client.embeddings.create({ model: "tiny", input: input[1]!, encoding_format: "base64" });
  const text = raw.data[0]!.embedding as unknown as string;
  assert.equal(typeof text, "string");
  const bytes = Buffer.from(text, "base64");
  assert.equal(bytes.length, dimensions * 4);
  const vector = Array.from({ length: dimensions }, (_, i) => bytes.readFloatLE(i * 4));
  assert.deepEqual(
    vector,
    floats.data[1]!.embedding.map((x) => Math.fround(x)),
  );

  // The model's own length is accepted; another is refused, naming the field.
  const same = await client.embeddings.create({
    model: "tiny",
    input: "hi",
    dimensions,
    encoding_format: "float",
  });
  assert.equal(same.data[0]!.embedding.length, dimensions);
  await assert.rejects(
    client.embeddings.create({ model: "tiny", input: "hi", dimensions: 32 }),
    (e: InstanceType<typeof OpenAI.BadRequestError>) => {
      assert.equal(e.status, 400);
      assert.equal(e.param, "dimensions");
      assert.match(e.message, /64/);
      return true;
    },
  );
  await assert.rejects(
    client.embeddings.create({ model: "nope", input: "hi" }),
    (e: InstanceType<typeof OpenAI.NotFoundError>) => e.status === 404 && e.code === "model_not_found",
  );

  // Conduit's own client, on the Conduit twin: the same vectors.
  const conduit = new ConduitClient({ baseUrl: address, key: KEY_A });
  const twin = await conduit.embed({ model: "tiny", input, encoding_format: "float" });
  assert.deepEqual(twin, floats);
});

test("token ids embed like their text; the Conduit twin answers the same vectors", async (t) => {
  const { app, core } = await build(t);
  const text = "Once upon a time";
  const viaOpenAi = await as(app, KEY_A).post("/v1/embeddings", { model: "tiny", input: text });
  assert.equal(viaOpenAi.statusCode, 200, viaOpenAi.body);
  const vector = viaOpenAi.json().data[0].embedding as number[];

  const model = await core.inference.resolve("u", "tiny", "model");
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.error,
    logger: () => {},
  });
  t.after(() => llama.dispose());
  const vocabulary = await llama.loadModel({ modelPath: model.path, vocabOnly: true });
  const tokens = Array.from(vocabulary.tokenize(text, false));

  const viaTokens = await as(app, KEY_A).post("/v1/embeddings", { model: "tiny", input: tokens });
  assert.equal(viaTokens.statusCode, 200, viaTokens.body);
  assert.deepEqual(viaTokens.json().data[0].embedding, vector);
  const lists = await as(app, KEY_A).post("/v1/embeddings", { model: "tiny", input: [tokens, tokens] });
  assert.equal(lists.statusCode, 200, lists.body);
  assert.deepEqual(
    lists.json().data.map((d: { embedding: number[] }) => d.embedding),
    [vector, vector],
  );

  // The Conduit twin: the same answer; `model` defaults to CONDUIT_DEFAULT_MODEL (none here: a 400 naming it),
  // other fields are ignored.
  const twin = await as(app, KEY_A).post("/conduit/v1/embeddings", {
    model: "tiny",
    input: [text],
    extra: 1,
  });
  assert.equal(twin.statusCode, 200, twin.body);
  assert.deepEqual(twin.json(), { ...viaOpenAi.json() });
});

test("a list of inputs of different lengths answers each input's vector alone, in order", async (t) => {
  const { app } = await build(t);
  // More inputs than a decode takes (the engine's parallel sequences), of lengths from 1 token to a sentence.
  const texts = [
    "Once",
    "Once upon a time there was a little robot who liked to sing",
    "a cat",
    "The end came soon after the robot met its friend in the park",
    "Lily",
    "She said hello, and the sun came out over the hill",
    "Tim had a red ball",
  ];
  const embed = async (input: string | string[]) => {
    const response = await as(app, KEY_A).post("/v1/embeddings", { model: "tiny", input });
    assert.equal(response.statusCode, 200, response.body);
    return response.json<{ data: { index: number; embedding: number[] }[] }>().data;
  };
  const together = await embed(texts);
  assert.deepEqual(
    together.map((d) => d.index),
    texts.map((_, i) => i),
  );
  for (const [i, text] of texts.entries()) {
    const [alone] = await embed(text);
    const a = together[i]!.embedding;
    const b = alone!.embedding;
    assert.equal(a.length, b.length);
    // The same vector up to float rounding (a decode of several sequences sums in another order).
    const norm = Math.sqrt(b.reduce((sum, x) => sum + x * x, 0));
    const furthest = Math.max(...a.map((x, j) => Math.abs(x - b[j]!)));
    assert.ok(furthest <= 1e-4 * norm, `input ${i}: ${furthest} apart (norm ${norm})`);
  }
});

test("embeddings: bad requests are 400s naming the field, on both faces", async (t) => {
  const { app } = await build(t);
  const long = "Once upon a time there was a robot. ".repeat(400);
  const scenarios: ApiScenario[] = [];
  for (const url of ["/v1/embeddings", "/conduit/v1/embeddings"]) {
    const post = (body: unknown, status: number, param: string | null, code = "invalid_request") =>
      scenarios.push({ method: "POST", url, body, status, error: { code, param } });
    post({ model: "tiny" }, 400, "input");
    post({ model: "tiny", input: "" }, 400, "input");
    post({ model: "tiny", input: [] }, 400, "input");
    post({ model: "tiny", input: ["a", ""] }, 400, "input");
    post({ model: "tiny", input: [[]] }, 400, "input");
    post({ model: "tiny", input: [1, -2] }, 400, "input");
    post({ model: "tiny", input: { text: "a" } }, 400, "input");
    post({ model: "tiny", input: Array.from({ length: MAX_EMBEDDING_INPUTS + 1 }, () => "a") }, 400, "input");
    post({ model: "tiny", input: long }, 400, "input");
    post({ model: "tiny", input: ["short", long] }, 400, "input");
    post({ model: "tiny", input: [[1, 2], [999_999]] }, 400, "input");
    post({ model: "tiny", input: "a", encoding_format: "int8" }, 400, "encoding_format");
    post({ model: "tiny", input: "a", dimensions: 0 }, 400, "dimensions");
    post({ model: "tiny", input: "a", dimensions: 65 }, 400, "dimensions");
    post({ input: "a" }, 400, "model");
    post({ model: "nope", input: "a" }, 404, "model", "model_not_found");
    scenarios.push({ method: "POST", url, key: null, body: { model: "tiny", input: "a" }, status: 401 });
    scenarios.push({ method: "POST", url, key: KEY_B, body: { model: "tiny", input: "a" }, status: 200 });
  }
  // The OpenAI face refuses a field OpenAI does not have and takes `null` as the default.
  scenarios.push(
    {
      method: "POST",
      url: "/v1/embeddings",
      body: { model: "tiny", input: "a", pooling: "mean" },
      status: 400,
      error: { param: "pooling" },
    },
    {
      method: "POST",
      url: "/v1/embeddings",
      body: { model: "tiny", input: "a", encoding_format: null, dimensions: null, user: null },
      status: 200,
      contains: ['"object":"embedding"'],
    },
  );
  await runScenarios(t, app, scenarios);
  // The error says which input and why.
  const which = await as(app, KEY_A).post("/v1/embeddings", { model: "tiny", input: ["short", long] });
  assert.match(which.json().error.message, /input\[1\] is \d+ (bytes|tokens)/);
});
