import assert from "node:assert/strict";
import { test } from "node:test";
import SwaggerParser from "@apidevtools/swagger-parser";
import { Ajv2020 } from "ajv/dist/2020.js";
import type { OpenAPI } from "openapi-types";
import { unsupportedJsonSchema } from "../../src/engine/grammars.ts";
import { aliceWorld, asAlice, build, createDataset, as, KEY_A } from "../lib/helper.ts";
import { runScenarios } from "../lib/scenario.ts";

type Operation = {
  parameters?: { name: string; in: string; required?: boolean }[];
  requestBody?: { content: Record<string, { schema: { required?: string[] } }> };
  responses: Record<string, unknown>;
  security?: unknown[];
};
type Document = { openapi: string; paths: Record<string, Record<string, Operation>> };

async function openApi(t: Parameters<typeof build>[0]): Promise<Document> {
  const { app } = await build(t);
  return (await app.inject({ url: "/openapi.json" })).json() as Document;
}

function operations(doc: Document): [string, Operation][] {
  return Object.entries(doc.paths).flatMap(([path, methods]) =>
    Object.entries(methods).map(
      ([method, operation]) => [`${method.toUpperCase()} ${path}`, operation] as [string, Operation],
    ),
  );
}

test("the OpenAPI document is valid for its version (a real validator checks it)", async (t) => {
  const doc = await openApi(t);
  assert.equal(doc.openapi, "3.1.0");
  // Throws, naming every problem, on an invalid document.
  await SwaggerParser.validate(structuredClone(doc) as unknown as OpenAPI.Document);
});

test("fields with a default are not required in the document", async (t) => {
  const doc = await openApi(t);
  for (const path of [
    "/conduit/dataset",
    "/conduit/finetuning",
    "/conduit/finetuning/{finetune_id}/examples",
  ]) {
    const parameters = doc.paths[path]?.get?.parameters ?? [];
    for (const name of ["limit", "offset"]) {
      const parameter = parameters.find((p) => p.name === name);
      assert.ok(parameter, `${path} documents ${name}`);
      assert.notEqual(parameter.required, true, `${path} ${name} has a default, so it is optional`);
    }
  }
  const chat = doc.paths["/conduit/v1/chat"]?.post?.requestBody?.content["application/json"]?.schema;
  assert.deepEqual(chat?.required, ["prompt"], "the sampling fields have defaults");
});

test("every operation lists the error statuses it answers", async (t) => {
  const doc = await openApi(t);
  const expected: Record<string, number[]> = {
    "POST /conduit/dataset": [400, 401, 413, 415, 507],
    "GET /conduit/dataset/{dataset_id}": [400, 401, 404],
    "PATCH /conduit/dataset/{dataset_id}": [400, 401, 404, 413, 415, 507],
    "POST /conduit/dataset/{dataset_id}/upload": [400, 401, 404, 408, 413, 415, 507],
    "POST /conduit/finetuning": [400, 401, 404, 413, 415, 507],
    "POST /conduit/finetuning/{finetune_id}/cancel": [400, 401, 404, 409],
    "GET /conduit/finetuning/{finetune_id}/artifact": [400, 401, 404, 409],
    "GET /conduit/finetuning/{finetune_id}/examples": [400, 401, 404, 409],
    "GET /conduit/finetuning/{finetune_id}/events": [400, 401, 404],
    "POST /conduit/finetuning/{finetune_id}/inference": [400, 401, 404, 409, 413, 415, 429, 503],
    "POST /conduit/v1/chat": [400, 401, 404, 409, 413, 415, 429, 503],
    "POST /conduit/v1/completions": [400, 401, 404, 409, 413, 415, 429, 503],
    "GET /metrics": [401, 403],
  };
  const all = new Map(operations(doc));
  for (const [operation, statuses] of Object.entries(expected)) {
    const documented = Object.keys(all.get(operation)?.responses ?? {});
    for (const status of statuses)
      assert.ok(
        documented.includes(String(status)),
        `${operation} documents ${status}: ${documented.join(" ")}`,
      );
  }
  // And the rules behind the table, for every operation of ours.
  for (const [operation, spec] of all) {
    if (!operation.includes(" /conduit/") && !operation.startsWith("GET /metrics")) continue;
    const documented = Object.keys(spec.responses);
    assert.ok(documented.includes("default"), `${operation}: the framework's errors (408, 414, 503, …)`);
    assert.ok(documented.includes("401"), `${operation} needs a key`);
    if (operation.includes("{")) assert.ok(documented.includes("404"), `${operation} has an id`);
    if (spec.requestBody?.content["application/json"])
      for (const status of ["400", "413", "415"])
        assert.ok(documented.includes(status), `${operation} takes a JSON body: ${status}`);
  }
});

test("uploads document their body: multipart, raw files and JSON", async (t) => {
  const doc = await openApi(t);
  const body = doc.paths["/conduit/dataset/{dataset_id}/upload"]?.post?.requestBody;
  assert.ok(body, "the upload has a request body");
  assert.deepEqual(Object.keys(body.content).sort(), [
    "application/json",
    "application/jsonl",
    "application/octet-stream",
    "application/x-ndjson",
    "multipart/form-data",
    "text/csv",
    "text/plain",
  ]);
  assert.deepEqual(body.content["multipart/form-data"]?.schema.required, ["file"]);
});

test("a Content-Type other than JSON on a JSON endpoint is 415", async (t) => {
  const { app } = await build(t);
  const world = await aliceWorld(app);
  const endpoints = [
    ["POST", "/conduit/dataset"],
    ["PATCH", `/conduit/dataset/${world.ds}`],
    ["POST", "/conduit/finetuning"],
    ["POST", `/conduit/finetuning/${world.run}/inference`],
    ["POST", "/conduit/v1/chat"],
    ["POST", "/conduit/v1/completions"],
    ["POST", "/v1/chat/completions"],
    ["POST", "/v1/completions"],
    ["POST", "/v1/responses"],
  ] as const;
  const contentTypes = [
    "text/plain",
    "application/x-www-form-urlencoded",
    "text/csv",
    // Multipart is read by the upload routes alone (it was parsed everywhere and then failed the schema: 400).
    "multipart/form-data; boundary=X",
  ];
  await runScenarios(
    t,
    app,
    endpoints.flatMap(([method, url]) =>
      contentTypes.map((contentType) => ({
        name: `${method} ${url} as ${contentType}`,
        method,
        url,
        headers: { "content-type": contentType },
        body: '{"name":"x"}',
        status: 415,
        error: { code: "unsupported_media_type" },
      })),
    ),
  );
  // The upload still takes text/plain, as a file.
  const upload = await app.inject({
    method: "POST",
    url: `/conduit/dataset/${world.ds}/upload?name=t.jsonl`,
    headers: { ...asAlice, "content-type": "text/plain" },
    payload: '{"input":"a","output":"b"}\n',
  });
  assert.equal(upload.statusCode, 200, upload.body);
});

test("every answer carries its request id: success, a refused key, an unknown route, a bad body, a framework error", async (t) => {
  const { app } = await build(t);
  const answers = [
    await as(app, KEY_A).get("/conduit/dataset"),
    await as(app, null).get("/conduit/dataset"),
    await as(app, "wrong-key-000000000000").get("/conduit/dataset"),
    await as(app, KEY_A).get("/conduit/nothing-here"),
    await as(app, KEY_A).post("/conduit/dataset", { name: 7 }),
    await app.inject({ method: "GET", url: `/conduit/dataset/${"x".repeat(1025)}`, headers: asAlice }),
  ];
  assert.deepEqual(
    answers.map((a) => a.statusCode),
    [200, 401, 401, 404, 400, 414],
  );
  const ids = answers.map((a) => a.headers["x-request-id"]);
  for (const id of ids) assert.match(String(id), /^[0-9a-f-]{36}$/);
  assert.equal(new Set(ids).size, ids.length, "each answer has its own id");
});

test("a path id over its limit is a 400 naming it; a path segment over 1024 characters a 414", async (t) => {
  const { app } = await build(t);
  const tooLong = await as(app, KEY_A).get(`/conduit/dataset/${"x".repeat(129)}`);
  assert.equal(tooLong.statusCode, 400, tooLong.body);
  assert.equal(tooLong.json().error.param, "dataset_id");
  for (const url of [
    `/conduit/dataset/${"x".repeat(1025)}`,
    `/conduit/finetuning/${"f".repeat(5000)}/cancel`,
  ]) {
    const response = await app.inject({
      method: url.endsWith("cancel") ? "POST" : "GET",
      url,
      headers: asAlice,
    });
    assert.equal(response.statusCode, 414, response.body);
    assert.deepEqual(response.json(), {
      error: {
        message: "a path segment is longer than 1024 characters",
        type: "invalid_request_error",
        param: null,
        code: "uri_too_long",
      },
    });
  }
  // A model name may be 256 characters: an ordinary 404.
  const model = await as(app, KEY_A).get(`/v1/models/${"m".repeat(256)}`);
  assert.equal(model.statusCode, 404, model.body);
});

test("a method a path does not take is a 405 with Allow; an unknown path stays a 404", async (t) => {
  const { app } = await build(t);
  const put = await as(app, KEY_A).put("/conduit/dataset");
  assert.equal(put.statusCode, 405, put.body);
  assert.equal(put.json().error.code, "method_not_allowed");
  assert.deepEqual(put.headers.allow?.toString().split(", ").sort(), ["GET", "HEAD", "POST"]);
  // A method with a body and no Content-Type is still about the method.
  const query = await app.inject({
    method: "QUERY" as "GET",
    url: "/conduit/dataset/ds_x",
    headers: asAlice,
  });
  assert.equal(query.statusCode, 405, query.body);
  assert.deepEqual(query.headers.allow?.toString().split(", ").sort(), ["DELETE", "GET", "HEAD", "PATCH"]);
  const unknown = await as(app, KEY_A).put("/conduit/nothing");
  assert.equal(unknown.statusCode, 404);
  // Without a key, neither says whether the path exists.
  assert.equal((await app.inject({ method: "PUT", url: "/conduit/dataset" })).statusCode, 401);
});

test("an upload without a body is a 400 saying how to send one", async (t) => {
  const { app } = await build(t);
  const ds = await createDataset(app);
  const response = await as(app, KEY_A).post(`/conduit/dataset/${ds.id}/upload`);
  assert.equal(response.statusCode, 400, response.body);
  assert.equal(response.json().error.param, "file");
  assert.match(response.json().error.message, /the upload has no body/);
});

test("the public endpoints say so in the document", async (t) => {
  const doc = await openApi(t);
  assert.deepEqual(doc.paths["/healthz"]?.get?.security, []);
  assert.equal(doc.paths["/conduit/dataset"]?.get?.security, undefined, "the document's default: a key");
});

test("an uploaded file that is not UTF-8 is refused naming the line, and nothing is stored", async (t) => {
  const { app } = await build(t);
  const ds = await createDataset(app);
  const latin1 = (text: string) => Buffer.from(text, "latin1");
  const cases = [
    {
      name: "a.jsonl",
      type: "application/jsonl",
      payload: Buffer.concat([
        Buffer.from('{"input":"a","output":"b"}\n'),
        latin1('{"input":"café","output":"b"}\n'),
      ]),
      line: 2,
    },
    {
      name: "a.csv",
      type: "text/csv",
      payload: Buffer.concat([Buffer.from("input,output\nhi,there\n"), latin1("crème,brûlée\n")]),
      line: 3,
    },
    {
      name: "cut.jsonl",
      type: "application/jsonl",
      // A character cut off after its first byte.
      payload: Buffer.concat([Buffer.from('{"input":"a","output":"'), Buffer.from("é").subarray(0, 1)]),
      line: 1,
    },
  ];
  for (const upload of cases) {
    const response = await app.inject({
      method: "POST",
      url: `/conduit/dataset/${ds.id}/upload?name=${upload.name}`,
      headers: { ...asAlice, "content-type": upload.type },
      payload: upload.payload,
    });
    assert.equal(response.statusCode, 400, `${upload.name} → ${response.body}`);
    assert.equal(response.json().error.code, "invalid_file");
    assert.equal(
      response.json().error.message,
      `${upload.name}: line ${upload.line}: invalid UTF-8 (save the file as UTF-8 text)`,
    );
  }
  const files = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`);
  assert.deepEqual(files.json(), []);
});

test("a JSON body that is not UTF-8 is a 400 invalid_json, and nothing is stored", async (t) => {
  const { app } = await build(t);
  const ds = await createDataset(app, "kept");
  const latin1 = (text: string) => Buffer.from(text, "latin1");
  const cases = [
    ["/conduit/dataset", latin1('{"name":"café"}')],
    [
      `/conduit/dataset/${ds.id}/upload`,
      latin1('{"name":"a.jsonl","content":"{\\"input\\":\\"crème\\",\\"output\\":\\"b\\"}"}'),
    ],
    // A character cut off after its first byte.
    [
      "/v1/chat/completions",
      Buffer.concat([
        Buffer.from('{"messages":[{"role":"user","content":"'),
        Buffer.from("é").subarray(0, 1),
        Buffer.from('"}]}'),
      ]),
    ],
  ] as const;
  for (const [url, payload] of cases)
    for (const contentType of ["application/json", "application/json; charset=utf-8"]) {
      const response = await app.inject({
        method: "POST",
        url,
        headers: { ...asAlice, "content-type": contentType },
        payload,
      });
      assert.equal(response.statusCode, 400, `${url} → ${response.body}`);
      assert.deepEqual(response.json(), {
        error: {
          message: "the body is not valid JSON: it is not UTF-8 text",
          type: "invalid_request_error",
          param: null,
          code: "invalid_json",
        },
      });
    }
  const datasets = await as(app, KEY_A).get("/conduit/dataset");
  assert.deepEqual(
    datasets.json().map((d: { name: string }) => d.name),
    ["kept"],
  );
  const files = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`);
  assert.deepEqual(files.json(), []);
  // Valid UTF-8, multi-byte characters included, is read as it was sent.
  const named = await app.inject({
    method: "POST",
    url: "/conduit/dataset",
    headers: { ...asAlice, "content-type": "application/json" },
    payload: Buffer.from('{"name":"café ☕ 𝄞"}', "utf8"),
  });
  assert.equal(named.statusCode, 200, named.body);
  assert.equal(named.json().name, "café ☕ 𝄞");
  const empty = await app.inject({
    method: "POST",
    url: "/conduit/dataset",
    headers: { ...asAlice, "content-type": "application/json" },
    payload: "",
  });
  // An empty body is no body (OpenAI's clients send one on cancel and delete): here one is needed.
  assert.equal(empty.statusCode, 400, empty.body);
  assert.equal(empty.json().error.code, "invalid_request");
  assert.equal(
    empty.json().error.message,
    'the body is empty; this operation takes a JSON object with "name"',
  );
});

test("a __proto__ key in a JSON body is dropped, not refused, and pollutes nothing", async (t) => {
  const { app } = await build(t);
  const response = await app.inject({
    method: "POST",
    url: "/conduit/dataset",
    headers: { ...asAlice, "content-type": "application/json" },
    payload: '{"name":"p","__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}',
  });
  assert.equal(response.statusCode, 200, response.body);
  assert.equal(response.json().name, "p");
  assert.equal(({} as Record<string, unknown>).polluted, undefined);
});

test("the run body's rules across fields are in the document, and the server keeps the same ones", async (t) => {
  const { app } = await build(t);
  const world = await aliceWorld(app);
  const doc = (await app.inject({ url: "/openapi.json" })).json() as Document;
  const schema = doc.paths["/conduit/finetuning"]?.post?.requestBody?.content["application/json"]?.schema;
  const validate = new Ajv2020({ strict: false }).compile(schema as object);
  const bodies: [Record<string, unknown>, boolean][] = [
    [{ datasetID: world.ds, method: "full", loraRank: 4 }, false],
    [{ datasetID: world.ds, method: "full", loraTargets: ["attn_q"] }, false],
    [{ datasetID: world.ds, method: "full" }, true],
    [{ datasetID: world.ds, loraRank: 4, loraAlpha: 8 }, true],
    [{ datasetId: world.ds, method: "lora", loraRank: 4 }, true],
    [{ datasetID: world.ds, datasetId: world.ds }, true],
    [{ datasetName: "secret" }, true],
    [{ method: "full" }, false],
  ];
  for (const [body, valid] of bodies) {
    const payload = { baseModelName: "tiny", epochs: 1, ...body };
    assert.equal(validate(payload), valid, `the document on ${JSON.stringify(payload)}`);
    const response = await as(app, KEY_A).post("/conduit/finetuning", payload);
    assert.equal(response.statusCode, valid ? 200 : 400, `${JSON.stringify(payload)} → ${response.body}`);
  }
});

test("the eval bodies in the document accept what the server accepts and refuse what it refuses", async (t) => {
  const { app } = await build(t);
  const alice = as(app, KEY_A);
  const doc = (await app.inject({ url: "/openapi.json" })).json() as Document;
  const compile = (path: string) =>
    new Ajv2020({ strict: false }).compile(
      doc.paths[path]?.post?.requestBody?.content["application/json"]?.schema as object,
    );
  const items = { type: "items", items: [{ input: "q", expected: "a" }] };
  const conduit: [unknown[], boolean][] = [
    [[{ type: "exact_match" }], true],
    [[{ type: "" }], false],
    [[{ type: "regex", pattern: "a+" }], true],
    [[{ type: "regex" }], false],
    [[{ type: "contains", value: "" }], false],
    [[{ type: "similarity", metric: "fuzzy_match", passThreshold: 0.7 }], true],
    [[{ type: "similarity", passThreshold: 2 }], false],
    [[{ type: "exact_match", colour: "red" }], false],
    [
      [{ type: "score_model", model: "tiny", input: [{ role: "user", content: "{{sample.output_text}}" }] }],
      true,
    ],
    [[{ type: "score_model", model: "tiny", input: [] }], false],
    [[{ type: "score_model", model: "tiny", input: [{ role: "user", content: "x" }], range: [1] }], false],
    [
      [
        {
          type: "label_model",
          model: "tiny",
          input: [{ role: "user", content: "x" }],
          labels: ["a", "b"],
          passingLabels: ["a"],
        },
      ],
      true,
    ],
    [[{ type: "label_model", model: "tiny", input: [{ role: "user", content: "x" }], labels: ["a"] }], false],
  ];
  const validateEval = compile("/conduit/evals");
  for (const [graders, valid] of conduit) {
    const body = { source: items, graders };
    assert.equal(validateEval(body), valid, `the document on ${JSON.stringify(graders)}`);
    const response = await alice.post("/conduit/evals", body);
    assert.equal(response.statusCode, valid ? 200 : 400, `${JSON.stringify(graders)} → ${response.body}`);
  }
  const check = (type: string, extra: object = {}) => ({
    type,
    name: "c",
    input: "{{sample.output_text}}",
    reference: "{{item.answer}}",
    ...extra,
  });
  const custom = { type: "custom", item_schema: { type: "object" } };
  const openAi: [unknown, unknown[], boolean][] = [
    [custom, [check("string_check", { operation: "eq" })], true],
    [{ type: "" }, [check("string_check", { operation: "eq" })], false],
    [{ type: "custom" }, [check("string_check", { operation: "eq" })], false],
    [custom, [{ type: "" }], false],
    [custom, [check("string_check", { operation: "eq", reference: "Paris" })], false],
    [custom, [check("string_check", { operation: "like", reference: "Paris" })], true],
    [custom, [check("string_check", { operation: "like", reference: "" })], false],
    [custom, [check("string_check", { operation: "ne" })], false],
    [custom, [check("text_similarity", { evaluation_metric: "bleu", pass_threshold: 0.5 })], false],
    [custom, [check("text_similarity", { evaluation_metric: "token_f1", pass_threshold: 0.5 })], true],
    [custom, [check("string_check", { operation: "eq", input: "{{item.answer}}" })], false],
    [
      custom,
      [{ type: "score_model", name: "s", model: "tiny", input: [{ role: "user", content: "x" }] }],
      true,
    ],
    [custom, [{ type: "score_model", name: "s", model: "tiny", input: [] }], false],
    [
      custom,
      [
        {
          type: "label_model",
          name: "l",
          model: "tiny",
          input: [{ role: "developer", content: "x" }],
          labels: ["a"],
          passing_labels: ["a"],
        },
      ],
      true,
    ],
    [
      custom,
      [{ type: "label_model", name: "l", model: "tiny", input: [{ role: "user", content: "x" }] }],
      false,
    ],
  ];
  const validateOpenAi = compile("/v1/evals");
  for (const [config, criteria, valid] of openAi) {
    const body = { data_source_config: config, testing_criteria: criteria };
    assert.equal(validateOpenAi(body), valid, `the document on ${JSON.stringify(body)}`);
    const response = await alice.post("/v1/evals", body);
    assert.equal(response.statusCode, valid ? 200 : 400, `${JSON.stringify(body)} → ${response.body}`);
  }
});

test("the document's schema for response_format's JSON schemas is what the grammar takes", async (t) => {
  const doc = await openApi(t);
  const ajv = new Ajv2020({ strict: false });
  ajv.addSchema(doc, "doc");
  const validate = ajv.compile({ $ref: "doc#/components/schemas/GrammarSchema" });
  const schemas: [unknown, boolean][] = [
    [{ type: "string", maxLength: 8, format: "date" }, true],
    [
      {
        type: "object",
        properties: { a: { type: "integer" } },
        required: ["a"],
        additionalProperties: false,
      },
      true,
    ],
    [{ type: "array", items: { enum: ["x", 1, null] }, minItems: 1, maxItems: 3 }, true],
    [{ anyOf: [{ type: "null" }, { const: "a", title: "A" }] }, true],
    [{ oneOf: [{ type: "boolean" }] }, true],
    [{}, false],
    [{ type: "string", pattern: "^a" }, false],
    [{ type: "integer", minimum: 1 }, true],
    [{ type: "number", exclusiveMinimum: 0, maximum: 2.5 }, true],
    [{ type: "integer", multipleOf: 2 }, false],
    [{ type: "number", minimum: "1" }, false],
    [{ type: "string", format: "uuid" }, true],
    [{ type: "string", format: "uri" }, false],
    [{ const: 1, type: "integer" }, false],
    [{ enum: [] }, false],
    [{ type: "object", properties: { a: { allOf: [] } } }, false],
    [{ type: "array", minItems: -1 }, false],
    [{ type: "string", maxLength: 1000 }, true],
    // The grammar would repeat a rule that often: llama.cpp refuses to parse it.
    [{ type: "string", minLength: 5412 }, false],
    [{ type: "array", items: { type: "boolean" }, maxItems: 2001 }, false],
  ];
  for (const [schema, valid] of schemas) {
    assert.equal(validate(schema), valid, `the document on ${JSON.stringify(schema)}`);
    assert.equal(
      unsupportedJsonSchema(schema) === undefined,
      valid,
      `the grammar on ${JSON.stringify(schema)}`,
    );
  }
});

test("a run on a dataset without pairs is a 409: the dataset's state, not the request, is wrong", async (t) => {
  const { app } = await build(t);
  const ds = await createDataset(app, "empty");
  const payload = { datasetID: ds.id, baseModelName: "tiny" };
  const before = await as(app, KEY_A).post("/conduit/finetuning", payload);
  assert.equal(before.statusCode, 409, before.body);
  assert.equal(before.json().error.code, "conflict");
  assert.match(before.json().error.message, /has no IO pairs; upload a file first/);
  const doc = (await app.inject({ url: "/openapi.json" })).json() as Document;
  assert.ok(doc.paths["/conduit/finetuning"]?.post?.responses["409"], "the 409 is documented");
  await as(app, KEY_A).post(`/conduit/dataset/${ds.id}/upload`, {
    name: "a.jsonl",
    ioPairs: [{ input: "a", output: "b" }],
  });
  const after = await as(app, KEY_A).post("/conduit/finetuning", payload);
  assert.equal(after.statusCode, 200, after.body);
});

test("datasetID and datasetId naming different datasets is a 400; the same one twice is fine", async (t) => {
  const { app } = await build(t);
  const world = await aliceWorld(app);
  const other = await createDataset(app, "other");
  const conflicting = await as(app, KEY_A).post("/conduit/finetuning", {
    datasetID: world.ds,
    datasetId: other.id,
    baseModelName: "tiny",
  });
  assert.equal(conflicting.statusCode, 400, conflicting.body);
  assert.equal(conflicting.json().error.param, "datasetId");
  assert.match(conflicting.json().error.message, /name different datasets/);
  const same = await as(app, KEY_A).post("/conduit/finetuning", {
    datasetID: world.ds,
    datasetId: world.ds,
    baseModelName: "tiny",
  });
  assert.equal(same.statusCode, 200, same.body);
  assert.equal(same.json().datasetId, world.ds);
});

test("a big JSON body (parsed in a worker thread) is held to the same rules as a small one", async (t) => {
  const { app } = await build(t);
  const post = (payload: string | Buffer, url = "/conduit/dataset") =>
    app.inject({ method: "POST", url, headers: { ...asAlice, "content-type": "application/json" }, payload });
  // Over 64 KiB each: padding that the schema refuses or ignores, so what is checked is the parse.
  const padding = "x".repeat(100_000);
  const lone = await post(`{"name":"ok","systemPrompt":"${padding}\\ud800"}`);
  assert.equal(lone.statusCode, 400, lone.body);
  assert.equal(lone.json().error.param, "systemPrompt");
  assert.match(lone.json().error.message, /lone UTF-16 surrogate/);
  const broken = await post(`{"name":"ok","x":"${padding}"`);
  assert.equal(broken.statusCode, 400);
  assert.equal(broken.json().error.code, "invalid_json");
  const latin1 = await post(
    Buffer.concat([Buffer.from(`{"name":"caf`), Buffer.from([0xe9]), Buffer.from(`${padding}"}`)]),
  );
  assert.equal(latin1.statusCode, 400);
  assert.equal(latin1.json().error.code, "invalid_json");
  assert.match(latin1.json().error.message, /not UTF-8/);
  // `__proto__` is dropped, not applied; the rest of the body is read as usual.
  // Whitespace makes it big and is valid JSON.
  const kept = await post(
    `{"name":"big",${" ".repeat(100_000)}"__proto__":{"polluted":true},"constructor":{"prototype":{"polluted":true}}}`,
  );
  assert.equal(kept.statusCode, 200, kept.body);
  assert.equal(kept.json().name, "big");
  assert.equal(({} as Record<string, unknown>).polluted, undefined);
  const named = await post(JSON.stringify({ name: "𝄞".repeat(20), systemPrompt: padding }));
  assert.equal(named.statusCode, 400, "systemPrompt is not a dataset field");
  assert.equal(named.json().error.param, "systemPrompt");
});

test("a JSON body in another charset is a 415, and a lone surrogate a 400 naming its field; nothing is stored", async (t) => {
  const { app } = await build(t);
  const post = (payload: string, type: string) =>
    app.inject({
      method: "POST",
      url: "/conduit/dataset",
      headers: { ...asAlice, "content-type": type },
      payload,
    });
  for (const type of ["application/json; charset=latin1", "application/json; charset=ISO-8859-1"]) {
    const refused = await post('{"name":"caf\u00e9"}', type);
    assert.equal(refused.statusCode, 415, refused.body);
    assert.equal(refused.json().error.code, "unsupported_media_type");
    assert.match(refused.json().error.message, /UTF-8/);
  }
  for (const type of ["application/json; charset=utf-8", 'application/json; charset="UTF8"'])
    assert.equal((await post('{"name":"ok"}', type)).statusCode, 200, type);
  const lone = await post('{"name":"a\\ud800b"}', "application/json");
  assert.equal(lone.statusCode, 400, lone.body);
  assert.equal(lone.json().error.param, "name");
  assert.match(lone.json().error.message, /lone UTF-16 surrogate/);
  const nested = await app.inject({
    method: "POST",
    url: "/conduit/v1/chat",
    headers: { ...asAlice, "content-type": "application/json" },
    payload:
      '{"model":"tiny","messages":[{"role":"user","content":"x"},{"role":"user","content":"\\udc00"}]}',
  });
  assert.equal(nested.statusCode, 400, nested.body);
  assert.equal(nested.json().error.param, "messages[1].content");
  // A pair of surrogates is a character, and is kept.
  const pair = await post('{"name":"\\ud834\\udd1e"}', "application/json");
  assert.equal(pair.statusCode, 200, pair.body);
  assert.equal(pair.json().name, "𝄞");
  const names = (await app.inject({ method: "GET", url: "/conduit/dataset", headers: asAlice })).json();
  assert.deepEqual(names.map((d: { name: string }) => d.name).sort(), ["ok", "ok", "𝄞"]);
});
