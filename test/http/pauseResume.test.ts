import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import OpenAI, { toFile } from "openai";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { as, buildTestApp, KEY_A, KEY_B, testEnv } from "../lib/helper.ts";
import { until } from "../lib/wait.ts";

/** Pause and resume on both faces, on the tiny model and the llama.cpp trainer, across a restart. */

const conversations = [
  ["apple river", "stone 7"],
  ["ocean lemon", "piano 12"],
  ["cedar pearl", "storm 9"],
].map(([q, a]) => ({
  messages: [
    { role: "user", content: q },
    { role: "assistant", content: a },
  ],
}));
const chatJsonl = conversations.map((c) => JSON.stringify(c)).join("\n") + "\n";

interface RunWire {
  status: string;
  logs: string[];
  stats: { step?: number };
}

test("a running job pauses (freeing its trainer), stays paused across a restart, resumes from its checkpoint and succeeds", async (t) => {
  const env = await testEnv(t);
  await createTinyModel(path.join(env.dataDir, "models", "tiny128.gguf"), { seed: 1, embeddingLength: 128 });
  const first = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
  first.core.scheduler.start();
  const address = await first.app.listen({ port: 0, host: "127.0.0.1" });
  const client = new OpenAI({ baseURL: `${address}/v1`, apiKey: KEY_A, maxRetries: 0 });
  const file = await client.files.create({
    file: await toFile(Buffer.from(chatJsonl), "chat.jsonl"),
    purpose: "fine-tune",
  });
  const long = await client.fineTuning.jobs.create({
    model: "tiny128",
    training_file: file.id,
    hyperparameters: { n_epochs: 150 },
  });
  const short = await client.fineTuning.jobs.create({
    model: "tiny128",
    training_file: file.id,
    hyperparameters: { n_epochs: 2 },
  });
  const conduit = (app = first.app) => as(app, KEY_A);
  const run = async (id: string, app = first.app) =>
    (await conduit(app).get(`/conduit/finetuning/${id}`)).json<RunWire>();

  // A queued run pauses at once and resumes to the queue (Conduit's face), with its log saying so.
  const paused = await conduit().post(`/conduit/finetuning/${short.id}/pause`);
  assert.equal(paused.statusCode, 200, paused.body);
  assert.equal(paused.json<RunWire>().status, "PAUSED");
  assert.equal((await client.fineTuning.jobs.retrieve(short.id)).status, "paused");
  assert.equal((await conduit().post(`/conduit/finetuning/${short.id}/pause`)).statusCode, 409);
  // Another user's run is no run of theirs.
  assert.equal((await as(first.app, KEY_B).post(`/conduit/finetuning/${short.id}/resume`)).statusCode, 404);
  assert.equal((await as(first.app, KEY_B).post(`/v1/fine_tuning/jobs/${short.id}/pause`)).statusCode, 404);
  const resumed = await conduit().post(`/conduit/finetuning/${short.id}/resume`);
  assert.equal(resumed.statusCode, 200, resumed.body);
  assert.equal(resumed.json<RunWire>().status, "QUEUED");
  assert.ok(
    resumed.json<RunWire>().logs.some((l) => l.endsWith("run resumed by the user: it is queued again")),
  );
  const missing = await conduit().post(`/conduit/finetuning/ft_nosuchrun/pause`);
  assert.equal(missing.statusCode, 404, missing.body);

  // The long run trains past its first checkpoint (written at the first evaluation point, an epoch's end here).
  await until(
    "the long run's first epochs",
    () => run(long.id),
    (r) => r.status === "RUNNING" && (r.stats.step ?? 0) >= 6,
    { timeoutMs: 120_000, intervalMs: 100 },
  );
  // The official client's types know no `pausing` or `paused` yet.
  const status = (job: { status: string }) => job.status;
  const pausing = status(await client.fineTuning.jobs.pause(long.id));
  assert.ok(["pausing", "paused"].includes(pausing), pausing);
  // While its trainer is stopping, the job cannot be resumed.
  if (pausing === "pausing") await assert.rejects(client.fineTuning.jobs.resume(long.id), { status: 409 });
  const pausedLong = await until(
    "the long run's trainer to stop",
    () => client.fineTuning.jobs.retrieve(long.id),
    (job) => status(job) === "paused",
    { timeoutMs: 30_000, intervalMs: 100 },
  );
  assert.equal(pausedLong.finished_at, null);
  const pausedRun = await run(long.id);
  assert.equal(pausedRun.status, "PAUSED");
  const pausedLine = pausedRun.logs.find((l) => l.includes("run paused: its trainer stopped"));
  const checkpointStep = Number(/checkpoint at step (\d+)/.exec(pausedLine ?? "")?.[1]);
  assert.ok(checkpointStep > 0, pausedRun.logs.join("\n"));

  // The trainer is free: the short run, queued behind, trains to the end meanwhile.
  await until(
    "the short run to succeed while the long one is paused",
    () => client.fineTuning.jobs.retrieve(short.id),
    (job) => job.status === "succeeded",
    { timeoutMs: 120_000, intervalMs: 200 },
  );
  assert.equal((await run(long.id)).status, "PAUSED");
  // Only a queued or running job pauses; only a paused one resumes.
  await assert.rejects(client.fineTuning.jobs.pause(short.id), { status: 409 });
  await assert.rejects(client.fineTuning.jobs.resume(short.id), { status: 409 });
  const conflict = await conduit().post(`/conduit/finetuning/${short.id}/pause`);
  assert.equal(conflict.statusCode, 409);
  assert.match(conflict.json<{ error: { message: string } }>().error.message, /READY and cannot be paused/);

  // A restart: the paused run stays paused, its checkpoint kept, and no scheduler takes it.
  await first.app.close();
  const second = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
  second.core.scheduler.start();
  await new Promise((resolve) => setTimeout(resolve, 1000));
  assert.equal((await run(long.id, second.app)).status, "PAUSED");
  const back = await conduit(second.app).post(`/v1/fine_tuning/jobs/${long.id}/resume`);
  assert.equal(back.statusCode, 200, back.body);
  assert.equal(back.json<{ status: string }>().status, "queued");
  const done = await until(
    "the resumed run to end",
    () => run(long.id, second.app),
    (r) => !["QUEUED", "RUNNING"].includes(r.status),
    { timeoutMs: 300_000, intervalMs: 300 },
  );
  assert.equal(done.status, "READY", done.logs.join("\n"));
  assert.ok(
    done.logs.some((l) => l.includes(`resuming from the checkpoint at step ${checkpointStep}`)),
    done.logs.join("\n"),
  );
  // A pause is no failed attempt: the resumed one is still the first.
  assert.match(done.logs.filter((l) => l.includes("training started")).at(-1)!, /\(attempt 1\)$/);
  assert.equal((await conduit(second.app).post(`/conduit/finetuning/${long.id}/resume`)).statusCode, 409);

  // Its last 3 epochs' ends are kept, each served under its own ft: name and downloadable.
  const secondAddress = await second.app.listen({ port: 0, host: "127.0.0.1" });
  const again = new OpenAI({ baseURL: `${secondAddress}/v1`, apiKey: KEY_A, maxRetries: 0 });
  const listed = await conduit(second.app).get(`/conduit/finetuning/${long.id}/checkpoints`);
  assert.equal(listed.statusCode, 200, listed.body);
  const kept = listed.json<{ step: number; epoch: number; trainLoss: number; model: string }[]>();
  assert.equal(kept.length, 3, listed.body);
  assert.deepEqual(
    kept.map((c) => c.epoch),
    [150, 149, 148],
  );
  const model = `ft:tiny128::${long.id}`;
  assert.equal(kept[0]!.model, `${model}:ckpt-step-${kept[0]!.step}`);
  const page = await again.fineTuning.jobs.checkpoints.list(long.id, { limit: 2 });
  assert.equal(page.has_more, true);
  assert.deepEqual(
    page.data.map((c) => [c.object, c.step_number, c.fine_tuned_model_checkpoint, c.fine_tuning_job_id]),
    kept.slice(0, 2).map((c) => ["fine_tuning.job.checkpoint", c.step, c.model, long.id]),
  );
  assert.equal(page.data[0]!.metrics.train_loss, kept[0]!.trainLoss);
  const rest = await again.fineTuning.jobs.checkpoints.list(long.id, { after: page.data[1]!.id });
  assert.deepEqual(
    rest.data.map((c) => c.step_number),
    [kept[2]!.step],
  );
  // Each checkpoint answers as a model; the oldest is not the final weights.
  const ask = (name: string) =>
    again.chat.completions.create({
      model: name,
      messages: [{ role: "user", content: "apple river" }],
      temperature: 0,
      max_tokens: 4,
    });
  const oldest = kept[2]!.model;
  const answer = await ask(oldest);
  assert.equal(answer.model, oldest);
  assert.ok((answer.choices[0]!.message.content ?? "").length > 0);
  assert.equal((await again.models.retrieve(oldest)).id, oldest);
  await assert.rejects(ask(`${model}:ckpt-step-1`), { status: 404 });
  const download = await conduit(second.app).get(
    `/conduit/finetuning/${long.id}/checkpoints/${kept[2]!.step}/artifact`,
  );
  assert.equal(download.statusCode, 200);
  assert.equal(download.rawPayload.subarray(0, 4).toString(), "GGUF");
  // Written as the run's adapter is (the served type, Q8_0 by default), not as the F32 the trainer trains.
  const adapter = await conduit(second.app).get(`/conduit/finetuning/${long.id}/artifact`);
  assert.equal(adapter.statusCode, 200);
  assert.equal(download.rawPayload.length, adapter.rawPayload.length);
  assert.equal(
    (await conduit(second.app).get(`/conduit/finetuning/${long.id}/checkpoints/1/artifact`)).statusCode,
    404,
  );
  // Owner-only: another user sees neither the list nor the model.
  assert.equal(
    (await as(second.app, KEY_B).get(`/conduit/finetuning/${long.id}/checkpoints`)).statusCode,
    404,
  );
  assert.equal(
    (await as(second.app, KEY_B).get(`/v1/fine_tuning/jobs/${long.id}/checkpoints`)).statusCode,
    404,
  );
  const theirs = await as(second.app, KEY_B).post("/v1/chat/completions", {
    model: oldest,
    messages: [{ role: "user", content: "hi" }],
  });
  assert.equal(theirs.statusCode, 404, theirs.body);
  // Deleted with its run.
  assert.equal((await conduit(second.app).delete(`/conduit/finetuning/${long.id}`)).statusCode, 200);
  await assert.rejects(ask(oldest), { status: 404 });
  assert.equal((await conduit(second.app).get(`/conduit/finetuning/${long.id}/checkpoints`)).statusCode, 404);
  // A two-epoch job keeps both epochs' ends.
  assert.deepEqual(
    (await again.fineTuning.jobs.checkpoints.list(short.id)).data.map(
      (c) => c.metrics.step === c.step_number,
    ),
    [true, true],
  );
});
