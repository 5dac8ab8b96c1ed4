import assert from "node:assert/strict";
import path from "node:path";
import { test } from "node:test";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { as, buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";
import { openAiPython, runPython, skipWithoutOpenAiPython } from "../lib/openAiPython.ts";
import { until } from "../lib/wait.ts";

/** A fine-tuning job paused, resumed and its checkpoints listed by the official Python client, as OpenAI's guides write it. */

const python = openAiPython();

const script = `
import json, sys, time
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)
job_id = sys.argv[3]

def wait_for(*statuses):
    seen = []
    for _ in range(3000):
        job = client.fine_tuning.jobs.retrieve(job_id)
        seen.append(job.status)
        if job.status in statuses:
            return job, seen
        time.sleep(0.1)
    raise SystemExit(f"never {statuses}: {seen[-5:]}")

paused = client.fine_tuning.jobs.pause(job_id)
stopped, _ = wait_for("paused")
try:
    client.fine_tuning.jobs.pause(job_id)
    again = None
except Exception as e:
    again = e.status_code
resumed = client.fine_tuning.jobs.resume(job_id)
done, _ = wait_for("succeeded", "failed", "cancelled")
events = [e.message for e in client.fine_tuning.jobs.list_events(job_id, limit=1000)]
checkpoints = client.fine_tuning.jobs.checkpoints.list(job_id)
answer = client.chat.completions.create(model=checkpoints.data[-1].fine_tuned_model_checkpoint, max_tokens=4,
                                        temperature=0, messages=[{"role": "user", "content": "apple river"}])
print(json.dumps({
    "checkpoints": [{"object": c.object, "step": c.step_number, "model": c.fine_tuned_model_checkpoint,
                     "train_loss": c.metrics.train_loss, "job": c.fine_tuning_job_id} for c in checkpoints.data],
    "checkpoint_answer": answer.model,
    "paused": paused.status, "stopped": stopped.status, "again": again, "resumed": resumed.status,
    "done": done.status, "model": done.fine_tuned_model, "events": events,
}))
`;

test(
  "the official Python client: jobs.pause, jobs.resume, jobs.checkpoints.list",
  { skip: skipWithoutOpenAiPython(python) },
  async (t) => {
    const env = await testEnv(t);
    await createTinyModel(path.join(env.dataDir, "models", "tiny128.gguf"), {
      seed: 1,
      embeddingLength: 128,
    });
    const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
    core.scheduler.start();
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const pairs = ["apple river:stone 7", "ocean lemon:piano 12", "cedar pearl:storm 9"]
      .map((line) => line.split(":"))
      .map(([q, a]) =>
        JSON.stringify({
          messages: [
            { role: "user", content: q },
            { role: "assistant", content: a },
          ],
        }),
      )
      .join("\n");
    const boundary = "----conduit-test";
    const upload = await app.inject({
      method: "POST",
      url: "/v1/files",
      headers: { "x-api-key": KEY_A, "content-type": `multipart/form-data; boundary=${boundary}` },
      payload:
        `--${boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n` +
        `--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="chat.jsonl"\r\n` +
        `Content-Type: application/jsonl\r\n\r\n${pairs}\n\r\n--${boundary}--\r\n`,
    });
    assert.equal(upload.statusCode, 200, upload.body);
    const job = await as(app, KEY_A).post("/v1/fine_tuning/jobs", {
      model: "tiny128",
      training_file: upload.json<{ id: string }>().id,
      hyperparameters: { n_epochs: 100 },
    });
    assert.equal(job.statusCode, 200, job.body);
    const id = job.json<{ id: string }>().id;
    await until(
      "the job's first epochs",
      async () =>
        (await as(app, KEY_A).get(`/conduit/finetuning/${id}`)).json<{
          status: string;
          stats: { step?: number };
        }>(),
      (run) => run.status === "RUNNING" && (run.stats.step ?? 0) >= 6,
      { timeoutMs: 120_000, intervalMs: 100 },
    );

    const result = await runPython(python!, script, [address, KEY_A, id]);
    assert.equal(result.status, 0, result.stderr);
    const out = JSON.parse(result.stdout);
    assert.ok(["pausing", "paused"].includes(out.paused), out.paused);
    assert.equal(out.stopped, "paused");
    assert.equal(out.again, 409);
    assert.equal(out.resumed, "queued");
    assert.equal(out.done, "succeeded", out.events.join("\n"));
    assert.equal(out.model, `ft:tiny128::${id}`);
    const messages = (out.events as string[]).reverse();
    assert.ok(
      messages.some((m) => m.startsWith("run paused: its trainer stopped")),
      messages.join("\n"),
    );
    assert.ok(
      messages.some((m) => m.startsWith("run resumed by the user")),
      messages.join("\n"),
    );
    assert.ok(
      messages.some((m) => m.includes("resuming from the checkpoint at step")),
      messages.join("\n"),
    );
  },
);
