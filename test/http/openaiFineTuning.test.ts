import assert from "node:assert/strict";
import path from "node:path";
import { describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import OpenAI, { toFile } from "openai";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import {
  asAlice,
  asBob,
  backends,
  build,
  buildTestApp,
  createDataset,
  KEY_A,
  testEnv,
  as,
  KEY_B,
} from "../lib/helper.ts";

/** Chat examples of two answered turns each: nothing a random model could say by chance. */
const conversations = [
  ["apple river", "stone 7", "cloud maple", "tiger 3"],
  ["ocean lemon", "piano 12", "comet honey", "raven 5"],
  ["cedar pearl", "storm 9", "flute amber", "otter 1"],
].map(([q1, a1, q2, a2]) => ({
  messages: [
    { role: "system", content: "Answer in two words." },
    { role: "user", content: q1 },
    { role: "assistant", content: a1 },
    { role: "user", content: q2 },
    { role: "assistant", content: a2 },
  ],
}));
const chatJsonl = conversations.map((c) => JSON.stringify(c)).join("\n") + "\n";

async function upload(
  app: FastifyInstance,
  name: string,
  content: string,
  purpose = "fine-tune",
  headers = asAlice,
) {
  const boundary = "----conduit-test";
  const payload =
    `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n${purpose}\r\n` +
    `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="${name}"\r\n` +
    `Content-Type: application/jsonl\r\n\r\n${content}\r\n--${boundary}--\r\n`;
  return app.inject({
    method: "POST",
    url: "/v1/files",
    headers: { ...headers, "content-type": `multipart/form-data; boundary=${boundary}` },
    payload,
  });
}

describe("OpenAI's files and fine-tuning jobs with the official client", () => {
  test("upload a chat file, train a job, follow its events to succeeded, chat with ft:…, cancel another", async (t) => {
    const env = await testEnv(t);
    // 128 wide: the default 64-wide tiny model learns too slowly for a test (see training.test.ts).
    await createTinyModel(path.join(env.dataDir, "models", "tiny128.gguf"), {
      seed: 1,
      embeddingLength: 128,
    });
    const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
    core.scheduler.start();
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_A, maxRetries: 0 });

    const file = await client.files.create({
      file: await toFile(Buffer.from(chatJsonl), "chat.jsonl"),
      purpose: "fine-tune",
    });
    assert.equal(file.object, "file");
    assert.equal(file.filename, "chat.jsonl");
    assert.equal(file.bytes, Buffer.byteLength(chatJsonl));
    assert.equal(file.purpose, "fine-tune");
    assert.equal(file.status, "processed");
    assert.deepEqual(
      (await client.files.list()).data.map((f) => f.id),
      [file.id],
    );
    assert.equal((await client.files.retrieve(file.id)).filename, "chat.jsonl");
    assert.equal(await (await client.files.content(file.id)).text(), chatJsonl);
    // One store: the file is a dataset of its own on the Conduit API, one example a pair.
    const datasetId = (file as OpenAI.FileObject & { dataset_id: string }).dataset_id;
    const dataset = (await as(app, KEY_A).get(`/conduit/dataset/${datasetId}`)).json();
    assert.equal(dataset.name, "chat.jsonl");
    assert.equal(dataset.ioPairsCount, 3);
    const preview = (await as(app, KEY_A).get(`/conduit/dataset/${datasetId}/file/${file.id}/pairs`)).json();
    assert.deepEqual(preview[0], { input: "cloud maple", output: "tiger 3", line: 1, ...conversations[0] });

    const job = await client.fineTuning.jobs.create({
      model: "tiny128",
      training_file: file.id,
      suffix: "pairs",
      method: {
        type: "supervised",
        supervised: { hyperparameters: { n_epochs: "auto", batch_size: "auto" } },
      },
      seed: 7,
      metadata: { purpose: "test" },
    });
    assert.equal(job.object, "fine_tuning.job");
    assert.match(job.id, /^ft_/);
    assert.equal(job.status, "queued");
    assert.equal(job.model, "tiny128");
    assert.equal(job.training_file, file.id);
    assert.equal(job.seed, 7);
    assert.equal(
      (job as OpenAI.FineTuning.FineTuningJob & { user_provided_suffix: string }).user_provided_suffix,
      "pairs",
    );
    assert.deepEqual(job.metadata, { purpose: "test" });
    assert.equal(job.fine_tuned_model, null);
    // The same run on the Conduit API, with its own status names.
    const run = (await as(app, KEY_A).get(`/conduit/finetuning/${job.id}`)).json();
    assert.ok(["QUEUED", "RUNNING"].includes(run.status));
    assert.equal(run.config.seed, 7);
    assert.equal(run.config.datasetID, datasetId);
    assert.equal(job.hyperparameters.n_epochs, run.config.epochs);

    // Follow the events until the job ends; OpenAI lists them newest first.
    const deadline = Date.now() + 300_000;
    let events: OpenAI.FineTuning.Jobs.FineTuningJobEvent[] = [];
    for (;;) {
      events = (await client.fineTuning.jobs.listEvents(job.id, { limit: 100 })).data;
      const end = events[0]?.data as { status?: string } | undefined;
      if (end?.status) break;
      assert.ok(Date.now() < deadline, `the job did not end: ${events.map((e) => e.message).join("\n")}`);
      await new Promise((resolve) => setTimeout(resolve, 300));
    }
    // Every event, page by page (the client follows `after`): the whole log, oldest last.
    const every: OpenAI.FineTuning.Jobs.FineTuningJobEvent[] = [];
    for await (const event of client.fineTuning.jobs.listEvents(job.id, { limit: 40 })) every.push(event);
    assert.ok(every.length > 40 && every[0]!.id === events[0]!.id);
    assert.equal(new Set(every.map((e) => e.id)).size, every.length);
    // A limit over the page's cap is taken as the cap, not refused: the whole log fits in one page here.
    for (const limit of [1000, 5000]) {
      const page = await client.fineTuning.jobs.listEvents(job.id, { limit });
      assert.deepEqual(
        page.data.map((e) => e.id),
        every.map((e) => e.id),
      );
      assert.equal(page.has_more, false);
    }
    const messages = every.map((e) => e.message).reverse();
    assert.equal((events[0]!.data as { status: string }).status, "succeeded", messages.join("\n"));
    assert.equal(messages[0], "run queued");
    assert.ok(messages.some((m) => m.startsWith("training started")));
    assert.ok(every.every((e) => e.object === "fine_tuning.job.event" && e.level !== "error"));
    // Paged: one at a time, older than the one before.
    const first = await client.fineTuning.jobs.listEvents(job.id, { limit: 1 });
    assert.equal(first.data[0]!.id, events[0]!.id);
    assert.equal(first.has_more, true);
    const second = await client.fineTuning.jobs.listEvents(job.id, { limit: 1, after: first.data[0]!.id });
    assert.equal(second.data[0]!.id, events[1]!.id);

    const done = await client.fineTuning.jobs.retrieve(job.id);
    assert.equal(done.status, "succeeded");
    const model = `ft:tiny128:pairs:${job.id}`;
    assert.equal(done.fine_tuned_model, model);
    assert.ok(done.finished_at !== null && done.finished_at >= done.created_at);
    assert.ok(done.trained_tokens !== null && done.trained_tokens > 0);
    assert.ok((await client.models.list()).data.some((m) => m.id === model));
    assert.equal((await client.models.retrieve(model)).id, model);
    // Its result file is the run's adapter, read through the files API; others' is a 404, deleting it a 400.
    assert.deepEqual(done.result_files, [`file-${job.id}`]);
    const result = await client.files.retrieve(done.result_files[0]!);
    assert.equal(result.purpose, "fine-tune-results");
    assert.equal(result.filename, `${job.id}-lora.gguf`);
    const bytes = Buffer.from(await (await client.files.content(result.id)).arrayBuffer());
    assert.equal(bytes.length, result.bytes);
    assert.equal(bytes.subarray(0, 4).toString(), "GGUF");
    assert.ok(bytes.equals((await as(app, KEY_A).get(`/conduit/finetuning/${job.id}/artifact`)).rawPayload));
    for (const url of [`/v1/files/${result.id}`, `/v1/files/${result.id}/content`, "/v1/files/file-ft_none"])
      assert.equal((await as(app, KEY_B).get(url)).statusCode, 404, url);
    await assert.rejects(client.files.delete(result.id), { status: 400 });
    // The name must be the job's own: another suffix is no model.
    await assert.rejects(client.models.retrieve(`ft:tiny128:other:${job.id}`), { status: 404 });

    // Every assistant turn was trained: the model gives the second answer too, in its conversation.
    const [c] = conversations;
    const answer = (turns: number) =>
      client.chat.completions.create({
        model,
        messages: c!.messages.slice(0, turns) as OpenAI.ChatCompletionMessageParam[],
        temperature: 0,
        max_tokens: 8,
      });
    const chat = await answer(4);
    assert.equal(chat.choices[0]!.message.content, "tiger 3");
    assert.equal(chat.model, model);
    const firstTurn = await answer(2);
    assert.equal(firstTurn.choices[0]!.message.content, "stone 7");
    const raw = await client.completions.create({
      model,
      prompt: "<|im_start|>user\nocean lemon<|im_end|>\n<|im_start|>assistant\n",
      temperature: 0,
      max_tokens: 2,
    });
    assert.equal(raw.choices.length, 1);

    // Another job, cancelled: its learning rate is the multiplier times auto's.
    const long = await client.fineTuning.jobs.create({
      model: "tiny128",
      training_file: file.id,
      hyperparameters: { n_epochs: 1000, learning_rate_multiplier: 2 },
    });
    const cancelled = await client.fineTuning.jobs.cancel(long.id);
    assert.equal(cancelled.status, "cancelled");
    assert.equal(cancelled.hyperparameters.learning_rate_multiplier, 2);
    assert.deepEqual(cancelled.result_files, []);
    assert.equal((await as(app, KEY_A).get(`/v1/files/file-${long.id}`)).statusCode, 409);
    const runs = (await as(app, KEY_A).get("/conduit/finetuning")).json();
    const [longRun, doneRun] = [long.id, job.id].map((id) => runs.find((r: { id: string }) => r.id === id));
    assert.equal(longRun.status, "CANCELLED");
    assert.ok(Math.abs(longRun.config.lr - 2 * doneRun.config.lr) < 1e-12, `${longRun.config.lr}`);
    const cancelEvents = (await client.fineTuning.jobs.listEvents(long.id)).data;
    assert.equal((cancelEvents[0]!.data as { status: string }).status, "cancelled");
    await assert.rejects(client.fineTuning.jobs.cancel(long.id), { status: 409 });

    const jobs = await client.fineTuning.jobs.list({ limit: 1 });
    assert.deepEqual(
      jobs.data.map((j) => j.id),
      [long.id],
    );
    assert.equal(jobs.has_more, true);
    const all: string[] = [];
    for await (const page of client.fineTuning.jobs.list({ limit: 1 })) all.push(page.id);
    assert.deepEqual(all, [long.id, job.id]);
    const tagged = await client.fineTuning.jobs.list({ metadata: { purpose: "test" } });
    assert.deepEqual(
      tagged.data.map((j) => j.id),
      [job.id],
    );

    // Deleting the file removes its dataset; the fine-tuned model stays.
    assert.deepEqual(await client.files.delete(file.id), { id: file.id, object: "file", deleted: true });
    await assert.rejects(client.files.retrieve(file.id), { status: 404 });
    assert.equal((await as(app, KEY_A).get(`/conduit/dataset/${datasetId}`)).statusCode, 404);
    assert.equal((await client.models.retrieve(model)).id, model);
  });
});

for (const backend of backends())
  describe(`OpenAI's files and jobs: what is refused, and whose is whose (${backend})`, () => {
    test("uploads: purpose fine-tune only, chat examples validated naming the line, nothing kept when refused", async (t) => {
      const { app } = await build(t, backend);
      const assistants = await upload(app, "a.jsonl", chatJsonl, "assistants");
      assert.equal(assistants.statusCode, 400);
      assert.equal(assistants.json().error.param, "purpose");
      const bad = [
        [JSON.stringify({ messages: [{ role: "user", content: "hi" }] }), /line 1: .*no assistant turn/],
        [
          `${JSON.stringify(conversations[0])}\n${JSON.stringify({ messages: [{ role: "tool", content: "x" }] })}`,
          /line 2: messages\[0\]\.role .*tool and function calls/,
        ],
        [
          JSON.stringify({ messages: [{ role: "user", content: [{ type: "image_url" }] }] }),
          /only text parts/,
        ],
        [
          JSON.stringify({
            messages: [
              { role: "user", content: "a" },
              { role: "assistant", content: "b", weight: 2 },
            ],
          }),
          /weight must be 0 or 1/,
        ],
        [
          JSON.stringify({
            messages: [
              { role: "user", content: "a" },
              { role: "assistant", content: "b", weight: 0 },
            ],
          }),
          /no assistant turn to train on/,
        ],
        // A JSON escape spelling a lone surrogate is not text: refused as a JSON body refuses it.
        [
          `${JSON.stringify(conversations[0])}\n{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b\\udc00"}]}`,
          /line 2: messages\[1\]\.content holds a lone UTF-16 surrogate/,
        ],
      ] as const;
      for (const [content, message] of bad) {
        const response = await upload(app, "bad.jsonl", content);
        assert.equal(response.statusCode, 400, content);
        assert.equal(response.json().error.code, "invalid_file");
        assert.match(response.json().error.message, message);
      }
      // Nothing was kept: no file and no dataset.
      assert.deepEqual((await as(app, KEY_A).get("/v1/files")).json().data, []);
      assert.deepEqual((await as(app, KEY_A).get("/conduit/dataset")).json(), []);
      // IO pairs are files too, with text parts joined.
      const pairs = await upload(app, "pairs.jsonl", '{"input":"a","output":"b"}\n');
      assert.equal(pairs.statusCode, 200, pairs.body);
      const parts = await upload(
        app,
        "parts.jsonl",
        JSON.stringify({
          messages: [
            {
              role: "user",
              content: [
                { type: "text", text: "he" },
                { type: "text", text: "llo" },
              ],
            },
            { role: "assistant", content: "hi" },
          ],
        }),
      );
      assert.equal(parts.statusCode, 200, parts.body);
      const listed = (await as(app, KEY_A).get("/v1/files?limit=1")).json();
      assert.deepEqual(
        listed.data.map((f: { filename: string }) => f.filename),
        ["parts.jsonl"],
      );
      assert.equal(listed.has_more, true);
      const older = (await as(app, KEY_A).get(`/v1/files?after=${listed.last_id}`)).json();
      assert.deepEqual(
        older.data.map((f: { filename: string }) => f.filename),
        ["pairs.jsonl"],
      );
      assert.deepEqual((await as(app, KEY_A).get("/v1/files?purpose=batch")).json().data, []);
    });

    test("jobs: fields OpenAI has that Conduit cannot honour are 400s naming them; others' files and jobs are 404s", async (t) => {
      const { app } = await build(t, backend);
      const file = (await upload(app, "chat.jsonl", chatJsonl)).json();
      const create = (body: Record<string, unknown>, headers = asAlice) =>
        app.inject({
          method: "POST",
          url: "/v1/fine_tuning/jobs",
          headers,
          payload: { model: "tiny", training_file: file.id, ...body },
        });
      const refused: [Record<string, unknown>, string, RegExp?][] = [
        [
          { hyperparameters: { batch_size: 8 } },
          "hyperparameters.batch_size",
          /one optimizer step per window/,
        ],
        [{ hyperparameters: { n_epochs: 0 } }, "hyperparameters.n_epochs"],
        [{ hyperparameters: { learning_rate_multiplier: -1 } }, "hyperparameters.learning_rate_multiplier"],
        [{ method: { type: "reinforcement" } }, "method.type", /reinforcement fine-tuning is not supported/],
        [{ method: { type: "dpo" } }, "training_file", /not a preference example/],
        [
          { method: { type: "supervised", dpo: { hyperparameters: { beta: 0.2 } } } },
          "method.dpo",
          /does not go with "method.type": "supervised"/,
        ],
        [
          { method: { type: "dpo", dpo: { hyperparameters: { beta: 0 } } } },
          "method.dpo.hyperparameters.beta",
        ],
        [
          {
            hyperparameters: { n_epochs: 2 },
            method: { type: "supervised", supervised: { hyperparameters: {} } },
          },
          "hyperparameters",
        ],
        [{ integrations: [{ type: "wandb" }] }, "integrations", /Weights & Biases/],
        [{ suffix: "a:b" }, "suffix"],
        [{ model: "ft:tiny::ft_01" }, "model", /fine-tuned model/],
        [{ validation_file: file.id }, "validation_file", /none would be left to train on/],
        [{ epochs: 3 }, "epochs", /not a known field/],
      ];
      for (const [body, param, message] of refused) {
        const response = await create(body);
        assert.equal(response.statusCode, 400, `${JSON.stringify(body)}: ${response.body}`);
        assert.equal(response.json().error.param, param, JSON.stringify(body));
        if (message) assert.match(response.json().error.message, message);
      }
      // DPO: on a preference file, the llama.cpp trainer (the tests' server's) cannot; a fine-tuned model to
      // continue must be one of the user's.
      const preferences = (
        await upload(
          app,
          "preferences.jsonl",
          JSON.stringify({
            input: { messages: [{ role: "user", content: "Hi" }] },
            preferred_output: [{ role: "assistant", content: "Hello!" }],
            non_preferred_output: [{ role: "assistant", content: "Go away." }],
          }),
        )
      ).json();
      const onLlamaCpp = await create({ training_file: preferences.id, method: { type: "dpo" } });
      assert.equal(onLlamaCpp.statusCode, 400, onLlamaCpp.body);
      assert.equal(onLlamaCpp.json().error.param, "method.type");
      assert.match(onLlamaCpp.json().error.message, /llama\.cpp trainer cannot do preference tuning/);
      const noSuchModel = await create({
        training_file: preferences.id,
        model: "ft:tiny::ft_01",
        method: { type: "dpo" },
      });
      assert.equal(noSuchModel.statusCode, 404, noSuchModel.body);
      assert.equal(noSuchModel.json().error.param, "model");
      const missing = await create({ training_file: "file_nope" });
      assert.equal(missing.statusCode, 404);
      assert.equal(missing.json().error.param, "training_file");
      const unknownModel = await create({ model: "nope" });
      assert.equal(unknownModel.statusCode, 404);
      assert.equal(unknownModel.json().error.param, "model");
      const noSuchJob = await as(app, KEY_A).get("/v1/fine_tuning/jobs/ft_missing");
      assert.equal(noSuchJob.statusCode, 404);
      assert.equal(noSuchJob.json().error.param, "fine_tuning_job_id");
      // A file of a Conduit dataset with other files: a job trains on one file alone.
      const ds = await createDataset(app, "two files");
      for (const name of ["a.jsonl", "b.jsonl"])
        await as(app, KEY_A).post(`/conduit/dataset/${ds.id}/upload`, {
          name,
          ioPairs: [{ input: "a", output: "b" }],
        });
      const seedFiles = (await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`)).json();
      const several = await create({ training_file: seedFiles[0].id });
      assert.equal(several.statusCode, 400);
      assert.equal(several.json().error.param, "training_file");
      assert.match(several.json().error.message, /one of several files/);
      // ... unless the other is its validation file.
      const withValidation = await create({
        training_file: seedFiles[0].id,
        validation_file: seedFiles[1].id,
      });
      assert.equal(withValidation.statusCode, 200, withValidation.body);
      assert.equal(withValidation.json().validation_file, seedFiles[1].id);

      // Bob sees none of Alice's files and jobs.
      const job = (await create({})).json();
      const tagged = (await create({ metadata: { team: "a", kind: "x" } })).json();
      const filtered = (
        await as(app, KEY_A).get("/v1/fine_tuning/jobs?metadata[team]=a&metadata[kind]=x")
      ).json();
      assert.deepEqual(
        filtered.data.map((j: { id: string }) => j.id),
        [tagged.id],
      );
      assert.deepEqual(filtered.data[0].metadata, { team: "a", kind: "x" });
      const none = (await as(app, KEY_A).get("/v1/fine_tuning/jobs?metadata[team]=b")).json();
      assert.deepEqual(none.data, []);
      // A key's 64 characters are counted as the document's schema counts them: 40 astral characters are 80
      // UTF-16 units, and fit.
      const astral = "𝐓".repeat(40);
      const wide = await create({ metadata: { [astral]: "x" } });
      assert.equal(wide.statusCode, 200, wide.body);
      const tooLong = await create({ metadata: { ["𝐓".repeat(65)]: "x" } });
      assert.equal(tooLong.statusCode, 400, tooLong.body);
      const typo = await as(app, KEY_A).get("/v1/fine_tuning/jobs?limt=2");
      assert.equal(typo.statusCode, 400);
      assert.equal(typo.json().error.param, "limt");
      assert.equal((await create({}, asBob)).statusCode, 404);
      for (const url of [
        `/v1/files/${file.id}`,
        `/v1/files/${file.id}/content`,
        `/v1/fine_tuning/jobs/${job.id}`,
      ])
        assert.equal((await as(app, KEY_B).get(url)).statusCode, 404, url);
      for (const [method, url] of [
        ["DELETE", `/v1/files/${file.id}`],
        ["POST", `/v1/fine_tuning/jobs/${job.id}/cancel`],
      ] as const)
        assert.equal((await app.inject({ method, url, headers: asBob })).statusCode, 404, url);
      assert.deepEqual((await as(app, KEY_B).get("/v1/fine_tuning/jobs")).json().data, []);
      assert.deepEqual((await as(app, KEY_B).get("/v1/files")).json().data, []);
      assert.equal((await app.inject({ url: "/v1/fine_tuning/jobs" })).statusCode, 401);

      // A run started on the Conduit API is a job too: its training file is its dataset.
      const seedRun = (
        await as(app, KEY_A).post("/conduit/finetuning", { datasetID: ds.id, baseModelName: "tiny" })
      ).json();
      const asJob = (await as(app, KEY_A).get(`/v1/fine_tuning/jobs/${seedRun.id}`)).json();
      assert.equal(asJob.status, "queued");
      assert.equal(asJob.training_file, ds.id);
      assert.equal(asJob.user_provided_suffix, null);
      const badCursor = await as(app, KEY_A).get(`/v1/fine_tuning/jobs/${job.id}/events?after=x`);
      assert.equal(badCursor.statusCode, 400);
      assert.equal(badCursor.json().error.param, "after");
    });
  });
