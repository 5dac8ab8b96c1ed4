import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { describe, test } from "node:test";
import { asAlice, asBob, backends, build, createDataset, KEY_A, as } from "../lib/helper.ts";
import { runScenarios, type ApiScenario } from "../lib/scenario.ts";

const jsonl = '{"input":"hi","output":"hello"}\n{"input":"bye","output":"goodbye"}\n';
const boundary = "----conduit";

for (const backend of backends()) {
  describe(`datasets: create, list, rename, delete and bad bodies (${backend})`, () => {
    test("create, read, list, rename, delete", async (t) => {
      const { app } = await build(t, backend);
      const created = await as(app, KEY_A).post("/conduit/dataset", { name: "greetings" });
      assert.equal(created.statusCode, 200);
      const dataset = created.json();
      assert.match(dataset.id, /^ds_/);
      assert.equal(dataset.userId, "alice");
      assert.equal(dataset.name, "greetings");
      assert.equal(dataset.ioPairsCount, 0);
      assert.equal(dataset.status, "READY");
      assert.match(dataset.createdAt, /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}$/);
      assert.equal(dataset.createdAt, dataset.updatedAt);

      const read = await as(app, KEY_A).get(`/conduit/dataset/${dataset.id}`);
      assert.deepEqual(read.json(), dataset);

      const renamed = await app.inject({
        method: "PATCH",
        url: `/conduit/dataset/${dataset.id}`,
        headers: { authorization: `Token ${KEY_A}` },
        payload: { name: "salutations" },
      });
      assert.equal(renamed.statusCode, 200);
      assert.deepEqual(renamed.json(), { message: "SUCCESS" });

      const list = await as(app, KEY_A).get("/conduit/dataset");
      assert.equal(list.statusCode, 200);
      assert.equal(list.json().length, 1);
      assert.equal(list.json()[0].name, "salutations");

      const deleted = await as(app, KEY_A).delete(`/conduit/dataset/${dataset.id}`);
      assert.deepEqual(deleted.json(), { message: "SUCCESS" });
      const gone = await as(app, KEY_A).get(`/conduit/dataset/${dataset.id}`);
      assert.equal(gone.statusCode, 404);
      assert.equal(gone.json().error.code, "not_found");
    });

    test("lists page with limit and offset, newest first", async (t) => {
      const { app } = await build(t, backend);
      for (const name of ["a", "b", "c"]) await as(app, KEY_A).post("/conduit/dataset", { name });
      const page1 = await as(app, KEY_A).get("/conduit/dataset?limit=2");
      assert.deepEqual(
        page1.json().map((d: { name: string }) => d.name),
        ["c", "b"],
      );
      const page2 = await as(app, KEY_A).get("/conduit/dataset?limit=2&offset=2");
      assert.deepEqual(
        page2.json().map((d: { name: string }) => d.name),
        ["a"],
      );
      const bad = await as(app, KEY_A).get("/conduit/dataset?limit=0");
      assert.equal(bad.statusCode, 400);
      assert.equal(bad.json().error.param, "limit");
      const unknown = await as(app, KEY_A).get("/conduit/dataset?page=2");
      assert.equal(unknown.statusCode, 400);
    });

    test("bad bodies are 4xx naming the field", async (t) => {
      const { app } = await build(t, backend);
      const post = (
        payload: string,
        status: number,
        error: { param?: string | null; code?: string },
        contentType = "application/json",
      ): ApiScenario => ({
        name: `${contentType} ${payload.slice(0, 40)} → ${status}`,
        method: "POST",
        url: "/conduit/dataset",
        headers: { "content-type": contentType },
        body: payload,
        status,
        error,
        check: (res) => assert.equal(typeof res.json().error.message, "string"),
      });
      await runScenarios(t, app, [
        post("{}", 400, { param: "name" }),
        post('{"name":""}', 400, { param: "name" }),
        post('{"name":42}', 400, { param: "name" }),
        post('{"name":"x","color":"red"}', 400, { param: "color" }),
        post('{"name":', 400, { code: "invalid_json" }),
        post("[1,2]", 400, { param: null }),
        post("name=x", 415, { code: "unsupported_media_type" }, "application/x-www-form-urlencoded"),
        post(JSON.stringify({ name: "x".repeat(2_000_000) }), 413, { code: "payload_too_large" }),
      ]);
      const badRename = await as(app, KEY_A).patch("/conduit/dataset/ds_nope", { name: "" });
      assert.equal(badRename.statusCode, 400);
    });
  });

  describe(`dataset uploads: formats, files and what is refused (${backend})`, () => {
    test("upload JSONL, JSON, CSV, ioPairs, raw and multipart; counts pairs", async (t) => {
      const { app } = await build(t, backend);
      const ds = await createDataset(app);
      const url = `/conduit/dataset/${ds.id}/upload`;

      const a = await as(app, KEY_A).post(url, { name: "a.jsonl", content: jsonl });
      assert.equal(a.statusCode, 200, a.body);
      const file = a.json();
      assert.match(file.id, /^file_/);
      assert.equal(file.datasetId, ds.id);
      assert.equal(file.datasetID, ds.id);
      assert.equal(file.name, "a.jsonl");
      assert.equal(file.size, Buffer.byteLength(jsonl));
      assert.equal(file.type, "IO");
      assert.equal(file.format, "jsonl");
      assert.equal(file.ioPairsCount, 2);

      const json = JSON.stringify([
        { prompt: "p1", completion: "c1" },
        { input: "i2", output: "o2" },
        { input: "i3", output: "o3" },
      ]);
      const b = await as(app, KEY_A).post(url, { name: "b.json", content: json });
      assert.equal(b.json().format, "json");
      assert.equal(b.json().ioPairsCount, 3);

      const csv = 'input,output\n"a, with comma","x"\nb,"multi\nline"\n';
      const c = await as(app, KEY_A).post(url, { name: "c.csv", content: csv });
      assert.equal(c.statusCode, 200, c.body);
      assert.equal(c.json().ioPairsCount, 2);

      const d = await as(app, KEY_A).post(url, { name: "direct", ioPairs: [{ input: "x", output: "y" }] });
      assert.equal(d.json().ioPairsCount, 1);

      const raw = await app.inject({
        method: "POST",
        url: `${url}?name=raw.jsonl`,
        headers: { ...asAlice, "content-type": "application/jsonl" },
        payload: jsonl,
      });
      assert.equal(raw.statusCode, 200, raw.body);
      assert.equal(raw.json().name, "raw.jsonl");
      // Without ?name=, a raw upload is named after its media type.
      const rawNoName = await app.inject({
        method: "POST",
        url,
        headers: { ...asAlice, "content-type": "text/csv" },
        payload: "input,output\na,b\n",
      });
      assert.equal(rawNoName.statusCode, 200, rawNoName.body);
      assert.deepEqual([rawNoName.json().name, rawNoName.json().format], ["upload.csv", "csv"]);

      const multipartBody =
        `--${boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nfrom-form.jsonl\r\n` +
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="../../etc/passwd"\r\nContent-Type: application/octet-stream\r\n\r\n${jsonl}\r\n--${boundary}--\r\n`;
      const m = await app.inject({
        method: "POST",
        url,
        headers: { ...asAlice, "content-type": `multipart/form-data; boundary=${boundary}` },
        payload: multipartBody,
      });
      assert.equal(m.statusCode, 200, m.body);
      assert.equal(m.json().name, "from-form.jsonl");
      assert.equal(m.json().ioPairsCount, 2);

      const m2 = await app.inject({
        method: "POST",
        url,
        headers: { ...asAlice, "content-type": `multipart/form-data; boundary=${boundary}` },
        payload: `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="../../x.jsonl"\r\n\r\n${jsonl}\r\n--${boundary}--\r\n`,
      });
      assert.equal(m2.statusCode, 200, m2.body);
      assert.equal(m2.json().name, "x.jsonl", "directories are stripped; the name is metadata only");

      const dataset = (await as(app, KEY_A).get(`/conduit/dataset/${ds.id}`)).json();
      assert.equal(dataset.ioPairsCount, 2 + 3 + 2 + 1 + 2 + 1 + 2 + 2);

      const files = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`);
      assert.equal(files.json().length, 8);

      const preview = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/file/${c.json().id}/pairs`);
      assert.deepEqual(preview.json(), [
        { input: "a, with comma", output: "x", line: 2 },
        { input: "b", output: "multi\nline", line: 4 },
      ]);

      const del = await as(app, KEY_A).delete(`/conduit/dataset/${ds.id}/file/${b.json().id}`);
      assert.deepEqual(del.json(), { message: "SUCCESS" });
      const after = (await as(app, KEY_A).get(`/conduit/dataset/${ds.id}`)).json();
      assert.equal(after.ioPairsCount, dataset.ioPairsCount - 3);
      const again = await as(app, KEY_A).delete(`/conduit/dataset/${ds.id}/file/${b.json().id}`);
      assert.equal(again.statusCode, 404);
    });

    test("a file's record; deleting a file or its dataset removes the files from disk", async (t) => {
      const { app, config } = await build(t, backend);
      const ds = await createDataset(app);
      const upload = async (name: string) =>
        (await as(app, KEY_A).post(`/conduit/dataset/${ds.id}/upload`, { name, content: jsonl })).json();
      const a = await upload("a.jsonl");
      const b = await upload("b.jsonl");
      const read = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/file/${a.id}`);
      assert.equal(read.statusCode, 200);
      assert.deepEqual(read.json(), a);

      const dir = path.join(config.dataDir, "blobs", "files", ds.id);
      assert.deepEqual(fs.readdirSync(dir).sort(), [a.id, b.id].sort());
      assert.equal(fs.readFileSync(path.join(dir, a.id), "utf8"), jsonl);
      await as(app, KEY_A).delete(`/conduit/dataset/${ds.id}/file/${a.id}`);
      assert.deepEqual(fs.readdirSync(dir), [b.id]);
      await as(app, KEY_A).delete(`/conduit/dataset/${ds.id}`);
      assert.equal(fs.existsSync(dir), false);
    });

    test("bad files are 400 naming the line, and nothing is stored", async (t) => {
      const { app } = await build(t, backend);
      const ds = await createDataset(app);
      const url = `/conduit/dataset/${ds.id}/upload`;
      const cases: [string, string, RegExp][] = [
        ["a.jsonl", '{"input":"a","output":"b"}\n{"input":"a"}\n', /line 2: missing "output"/],
        [
          "a.jsonl",
          '{"input":"a","output":"b"}\n\n{"input":"a","output":5}\n',
          /line 3: "output" must be a string/,
        ],
        ["a.jsonl", '{"input":"a","output":"b"}\nnot json\n', /line 2: invalid JSON/],
        ["a.jsonl", '["x"]\n', /line 1: expected an object/],
        ["a.jsonl", '{"input":"","output":"b"}\n', /line 1: "input" is empty/],
        ["a.json", '[\n  {"input":"a","output":"b"},\n  {"input":"a"}\n]', /line 3: missing "output"/],
        ["a.json", '[\n  {"input":"a",\n', /line \d: invalid JSON/],
        ["a.json", '{"input":"a","output":"b"}', /line 1: expected an object|array/],
        ["a.csv", "question,answer\nq,a\n", /line 1: the CSV header must have "input" and "output"/],
        ["a.csv", 'input,output\na,b\n"c,d\n', /line \d: invalid CSV/],
        ["a.csv", "input,output\na,b\nc,d,e\n", /line 3: invalid CSV/],
        ["a.jsonl", "\n\n", /no IO pairs/],
        [
          "a.jsonl",
          '{"input":"a","output":"b"}\n{"input":"x\\u0000y","output":"b"}\n',
          /line 2: "input" contains a NUL character/,
        ],
        ["a.csv", "input,output\na,b\nc,d\u0000\n", /line 3: "output" contains a NUL character/],
      ];
      for (const [name, content, expected] of cases) {
        const res = await as(app, KEY_A).post(url, { name, content });
        assert.equal(res.statusCode, 400, `${name} ${JSON.stringify(content)} → ${res.body}`);
        assert.equal(res.json().error.code, "invalid_file");
        assert.match(res.json().error.message, expected);
      }
      const empty = await as(app, KEY_A).post(url, { name: "e.jsonl", content: "" });
      assert.equal(empty.statusCode, 400);
      const both = await as(app, KEY_A).post(url, { name: "x", content: "a", ioPairs: [] });
      assert.equal(both.statusCode, 400);
      const neither = await as(app, KEY_A).post(url, { name: "x" });
      assert.equal(neither.statusCode, 400);
      const badPairs = await as(app, KEY_A).post(url, { name: "x", ioPairs: [{ input: "a" }] });
      assert.equal(badPairs.statusCode, 400);
      assert.equal(badPairs.json().error.param, "ioPairs.0.output");
      const nulPair = await as(app, KEY_A).post(url, {
        name: "x",
        ioPairs: [
          { input: "a", output: "b" },
          { input: "a", output: "\u0000" },
        ],
      });
      assert.equal(nulPair.statusCode, 400);
      assert.equal(nulPair.json().error.code, "invalid_file");
      assert.match(nulPair.json().error.message, /line 2: "output" contains a NUL character/);
      const wrongType = await app.inject({
        method: "POST",
        url,
        headers: { ...asAlice, "content-type": "image/png" },
        payload: "x",
      });
      assert.equal(wrongType.statusCode, 415);

      const files = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`);
      assert.deepEqual(files.json(), []);
      const dataset = (await as(app, KEY_A).get(`/conduit/dataset/${ds.id}`)).json();
      assert.equal(dataset.ioPairsCount, 0);
    });

    test("multipart: name and format fields before or after the file, checked like any name", async (t) => {
      const { app, config } = await build(t, backend);
      const ds = await createDataset(app);
      const url = `/conduit/dataset/${ds.id}/upload`;
      const filePart = (filename: string, content = jsonl) =>
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${filename}"\r\n\r\n${content}\r\n`;
      const field = (name: string, value: string) =>
        `--${boundary}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`;
      const end = `--${boundary}--\r\n`;
      // Part by part, as a client on a network sends it: the parser sees the file before the name.
      const streamed = (parts: string[]) =>
        Readable.from(
          (async function* () {
            for (const part of parts) {
              yield Buffer.from(part);
              await new Promise((resolve) => setTimeout(resolve, 5));
            }
          })(),
        );
      const multipart = { "content-type": `multipart/form-data; boundary=${boundary}` };
      const upload = (...parts: string[]) =>
        app.inject({ method: "POST", url, headers: { ...asAlice, ...multipart }, payload: streamed(parts) });

      const after = await upload(filePart("x.jsonl"), field("name", "named-after.jsonl"), end);
      assert.equal(after.statusCode, 200, after.body);
      assert.equal(after.json().name, "named-after.jsonl");
      const before = await upload(field("name", "named-before.jsonl"), filePart("x.jsonl"), end);
      assert.equal(before.json().name, "named-before.jsonl");
      const csv = await upload(filePart("pairs.txt", "input,output\na,b\n"), field("format", "csv"), end);
      assert.equal(csv.statusCode, 200, csv.body);
      assert.equal(csv.json().format, "csv");
      const longFileName = "f".repeat(300) + ".jsonl";
      const renamed = await upload(filePart(longFileName), field("name", "short.jsonl"), end);
      assert.equal(renamed.json().name, "short.jsonl");

      const cases: [string[], string | null, RegExp][] = [
        [[filePart("x.jsonl"), field("name", "a\u0000b"), end], "name", /"name" must be 1 to 256 characters/],
        [[filePart("x.jsonl"), field("name", "n".repeat(257)), end], "name", /"name" must be 1 to 256/],
        [[filePart("x.jsonl"), field("name", ""), end], "name", /"name" must be 1 to 256/],
        [[filePart(longFileName), end], "file", /send a "name" field/],
        [[filePart("bell\u0007.jsonl"), end], "file", /without control characters/],
        [[filePart("x.jsonl"), field("format", "xml"), end], "format", /"format" must be/],
        [[filePart("x.jsonl"), field("color", "red"), end], "color", /"color" is not known/],
        [[field("name", "x.jsonl"), end], "file", /no "file" field/],
      ];
      await runScenarios(
        t,
        app,
        cases.map(([parts, param, message]) => ({
          name: `${JSON.stringify(parts).slice(0, 120)} → 400 ${param}`,
          method: "POST",
          url,
          headers: multipart,
          body: () => streamed(parts),
          status: 400,
          error: { code: "invalid_request", param, message },
        })),
      );
      const files = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`);
      assert.equal(files.json().length, 4);
      assert.deepEqual(fs.readdirSync(path.join(config.dataDir, "blobs", ".tmp")), []);
    });

    test("malformed multipart bodies are 400 and store nothing", async (t) => {
      const { app, config } = await build(t, backend);
      const ds = await createDataset(app);
      const url = `/conduit/dataset/${ds.id}/upload`;
      const head = `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.jsonl"\r\n\r\n`;
      const cases: [string, string][] = [
        ["multipart/form-data", `${head}${jsonl}\r\n--${boundary}--\r\n`],
        [`multipart/form-data; boundary=${boundary}`, `${head}${jsonl}`],
        [
          `multipart/form-data; boundary=${boundary}`,
          `${head}${jsonl}\r\n--${boundary}\r\nContent-Disposition: form-da`,
        ],
        [`multipart/form-data; boundary=${boundary}`, "--" + boundary + "\r\nContent-Disp"],
      ];
      const base = await app.listen({ port: 0, host: "127.0.0.1" });
      for (const [contentType, body] of cases) {
        // Over a real socket: the end of the request is what tells the parser the body is cut short.
        const res = await fetch(base + url, {
          method: "POST",
          headers: { ...asAlice, "content-type": contentType },
          body,
          signal: AbortSignal.timeout(5000),
        });
        const text = await res.text();
        assert.equal(res.status, 400, `${contentType} ${JSON.stringify(body.slice(-30))} → ${text}`);
        const error = JSON.parse(text).error;
        assert.equal(error.code, "invalid_request");
        assert.match(error.message, /malformed multipart body/);
      }
      const files = await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`);
      assert.deepEqual(files.json(), []);
      assert.deepEqual(fs.readdirSync(path.join(config.dataDir, "blobs", ".tmp")), []);
    });
  });

  describe(`dataset upload limits: pair, body and request sizes (${backend})`, () => {
    test("a pair longer than CONDUIT_MAX_PAIR_BYTES is a 400 naming its line, in every format; one as long is fine", async (t) => {
      const { testEnv, buildTestApp } = await import("../lib/helper.ts");
      const env = await testEnv(t, backend, { CONDUIT_MAX_PAIR_BYTES: "100" });
      const { app } = await buildTestApp(t, env);
      const ds = await createDataset(app);
      const url = `/conduit/dataset/${ds.id}/upload`;
      // A JSONL line of `length` bytes.
      const line = (length: number) => `{"input":"${"x".repeat(length - 25)}","output":"b"}`;
      assert.equal(line(100).length, 100);
      const raw = (name: string, body: string) =>
        app.inject({
          method: "POST",
          url: `${url}?name=${name}`,
          headers: { ...asAlice, "content-type": "application/jsonl" },
          payload: body,
        });
      const fits = await raw("fits.jsonl", `${line(40)}\n${line(100)}\n${line(100)}`);
      assert.equal(fits.statusCode, 200, fits.body);
      assert.equal(fits.json().ioPairsCount, 3);
      const tooLong = (n: number) =>
        new RegExp(
          `line ${n}: the pair is longer than 100 bytes, the largest a pair may be \\(CONDUIT_MAX_PAIR_BYTES\\)`,
        );
      const cases: [string, string, RegExp][] = [
        ["a.jsonl", `${line(40)}\n${line(101)}\n${line(40)}\n`, tooLong(2)],
        // The last line, without a line end.
        ["a.jsonl", `${line(40)}\n${line(40)}\n${line(101)}`, tooLong(3)],
        // One line far longer than a read: refused at its first bytes.
        ["a.jsonl", line(300_000), tooLong(1)],
        ["a.csv", `input,output\na,b\nc,${"d".repeat(120)}\n`, tooLong(3)],
        // Short lines, one long quoted record.
        [
          "a.csv",
          `input,output\na,b\n"${"x\n".repeat(80)}",y\n`,
          /line \d+: the pair is longer than 100 bytes/,
        ],
        [
          "a.json",
          `[\n  {"input":"a","output":"b"},\n  {"input":"${"x".repeat(150)}","output":"b"}\n]`,
          tooLong(3),
        ],
      ];
      for (const [name, content, expected] of cases) {
        const res = name.endsWith(".jsonl")
          ? await raw(name, content)
          : await as(app, KEY_A).post(url, { name, content });
        assert.equal(res.statusCode, 400, `${name} ${content.slice(0, 80)} → ${res.body}`);
        assert.equal(res.json().error.code, "invalid_file", res.body);
        assert.match(res.json().error.message, expected, name);
      }
      const files = (await as(app, KEY_A).get(`${url.replace("/upload", "")}/files`)).json();
      assert.deepEqual(
        files.map((f: { name: string }) => f.name),
        ["fits.jsonl"],
      );
      assert.deepEqual(fs.readdirSync(path.join(env.dataDir, "blobs", ".tmp")), []);
    });

    test("uploads beyond the limit are 413 and leave nothing behind", async (t) => {
      const { testEnv, buildTestApp } = await import("../lib/helper.ts");
      const env = await testEnv(t, backend, { CONDUIT_MAX_UPLOAD_BYTES: "1000" });
      const { app } = await buildTestApp(t, env);
      const ds = await createDataset(app);
      const big = '{"input":"aaaaaaaaaaaaaaaaaaaa","output":"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"}\n'.repeat(40);
      const url = `/conduit/dataset/${ds.id}/upload`;
      const raw = await app.inject({
        method: "POST",
        url: `${url}?name=big.jsonl`,
        headers: { ...asAlice, "content-type": "application/jsonl" },
        payload: big,
      });
      assert.equal(raw.statusCode, 413, raw.body);
      const boundary = "b0undary";
      const multi = await app.inject({
        method: "POST",
        url,
        headers: { ...asAlice, "content-type": `multipart/form-data; boundary=${boundary}` },
        payload: `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n${big}\r\n--${boundary}--\r\n`,
      });
      assert.equal(multi.statusCode, 413, multi.body);
      const json = await as(app, KEY_A).post(url, { name: "big.jsonl", content: big });
      assert.equal(json.statusCode, 413, json.body);
      assert.deepEqual(fs.readdirSync(path.join(env.dataDir, "blobs", ".tmp")), []);
      assert.deepEqual((await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`)).json(), []);
      assert.equal(asBob["x-api-key"].length > 0, true);
    });

    test("a JSON upload is held to the JSON body limit; the same file streamed is stored", async (t) => {
      const { testEnv, buildTestApp } = await import("../lib/helper.ts");
      const env = await testEnv(t, backend, { CONDUIT_BODY_LIMIT: "2048" });
      const { app } = await buildTestApp(t, env);
      const ds = await createDataset(app);
      const pair = { input: "aaaaaaaaaaaaaaaaaaaa", output: "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb" };
      const url = `/conduit/dataset/${ds.id}/upload`;
      const content = { name: "big.jsonl", content: `${JSON.stringify(pair)}\n`.repeat(40) };
      for (const json of [
        await as(app, KEY_A).post(url, content),
        await as(app, KEY_A).post(url, {
          name: "big.jsonl",
          ioPairs: Array.from({ length: 40 }, () => pair),
        }),
        // Without a Content-Length: refused once read, before it is parsed.
        await app.inject({
          method: "POST",
          url,
          headers: { ...asAlice, "content-type": "application/json" },
          payload: Readable.from([JSON.stringify(content)]),
        }),
      ]) {
        assert.equal(json.statusCode, 413, json.body);
        assert.equal(json.json().error.code, "payload_too_large");
        assert.match(
          json.json().error.message,
          /^a JSON body is at most 2048 bytes \(CONDUIT_BODY_LIMIT\); upload a bigger file as multipart\/form-data or as a raw body$/,
        );
      }
      const raw = await app.inject({
        method: "POST",
        url: `${url}?name=big.jsonl`,
        headers: { ...asAlice, "content-type": "application/jsonl" },
        payload: `${JSON.stringify(pair)}\n`.repeat(40),
      });
      assert.equal(raw.statusCode, 200, raw.body);
      assert.equal(raw.json().ioPairsCount, 40);
    });
  });
}
