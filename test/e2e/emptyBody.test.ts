/**
 * An empty body sent as `Content-Type: application/json` is no body: the OpenAI clients send exactly
 * that on cancel and delete. Operations that take no body, or only optional fields, accept it; those
 * that need fields still say which.
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import { openAiPython, runPython, skipWithoutOpenAiPython } from "../lib/openAiPython.ts";
import { as, build, buildTestApp, datasetWithPairs, KEY_A, startRun, testEnv } from "../lib/helper.ts";

const emptyJson = { headers: { "content-type": "application/json" } };
const chatLine = JSON.stringify({
  messages: [
    { role: "user", content: "ping" },
    { role: "assistant", content: "pong" },
  ],
});

describe("an empty JSON body", () => {
  test("is accepted wherever the operation takes no body or only optional fields", async (t) => {
    const { app } = await build(t);
    const alice = as(app, KEY_A);
    const { id: ds, fileId } = await datasetWithPairs(app, [{ input: "a", output: "b" }]);
    const run = await startRun(app, { datasetID: ds });
    const ok = { message: "SUCCESS" };

    for (const body of ["", "  \r\n"]) {
      const cancel = await alice.post(`/conduit/finetuning/${run}/cancel`, body, emptyJson);
      assert.ok([200, 409].includes(cancel.statusCode), cancel.body);
    }
    const openAiFile = await app.inject({
      method: "POST",
      url: "/v1/files",
      headers: { "x-api-key": KEY_A, "content-type": "multipart/form-data; boundary=b" },
      payload:
        `--b\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n` +
        `--b\r\nContent-Disposition: form-data; name="file"; filename="c.jsonl"\r\n\r\n${chatLine}\n\r\n--b--\r\n`,
    });
    assert.equal(openAiFile.statusCode, 200, openAiFile.body);
    const job = await alice.post("/v1/fine_tuning/jobs", {
      model: "tiny",
      training_file: openAiFile.json<{ id: string }>().id,
    });
    assert.equal(job.statusCode, 200, job.body);
    const jobId = job.json<{ id: string }>().id;
    const cancelJob = await alice.post(`/v1/fine_tuning/jobs/${jobId}/cancel`, "", emptyJson);
    assert.equal(cancelJob.statusCode, 200, cancelJob.body);
    assert.equal(cancelJob.json<{ status: string }>().status, "cancelled");

    const deletions = [
      [`/conduit/finetuning/${run}`, ok],
      [`/conduit/dataset/${ds}/file/${fileId}`, ok],
      [`/conduit/dataset/${ds}`, ok],
      [`/v1/files/${openAiFile.json<{ id: string }>().id}`, { deleted: true }],
    ] as const;
    for (const [url, fragment] of deletions) {
      const response = await alice.delete(url, { ...emptyJson, payload: "" } as never);
      assert.equal(response.statusCode, 200, `${url}: ${response.body}`);
      const body = response.json<Record<string, unknown>>();
      assert.deepEqual({ ...body, ...fragment }, body);
    }
  });

  test("is still refused where the operation needs fields, naming the first", async (t) => {
    const { app } = await build(t);
    const response = await as(app, KEY_A).post("/conduit/dataset", "", emptyJson);
    assert.equal(response.statusCode, 400);
    assert.match(response.json<{ error: { message: string } }>().error.message, /name|body/);
    const bad = await as(app, KEY_A).post("/conduit/dataset", "{", emptyJson);
    assert.equal(bad.statusCode, 400);
    assert.equal(bad.json<{ error: { code: string } }>().error.code, "invalid_json");
  });
});

const python = openAiPython();

describe("the official OpenAI Python client", () => {
  test(
    "cancels a fine-tuning job and deletes a file",
    {
      skip: skipWithoutOpenAiPython(python),
    },
    async (t) => {
      const env = await testEnv(t);
      const { app } = await buildTestApp(t, env);
      const address = await app.listen({ port: 0, host: "127.0.0.1" });
      const data = path.join(env.dataDir, "chat.jsonl");
      fs.writeFileSync(data, `${chatLine}\n`);
      const script = `
import json, sys
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)
file = client.files.create(file=open(sys.argv[3], "rb"), purpose="fine-tune")
job = client.fine_tuning.jobs.create(model="tiny", training_file=file.id)
cancelled = client.fine_tuning.jobs.cancel(job.id)
deleted = client.files.delete(file.id)
print(json.dumps({"job": cancelled.status, "deleted": deleted.deleted,
                  "after": client.fine_tuning.jobs.retrieve(job.id).status}))
`;
      const result = await runPython(python!, script, [address, KEY_A, data]);
      assert.equal(result.status, 0, result.stderr);
      assert.deepEqual(JSON.parse(result.stdout), { job: "cancelled", deleted: true, after: "cancelled" });
    },
  );
});
