/**
 * A DPO job after a supervised one, driven by the official `openai` Python client as OpenAI's DPO guide writes it:
 * files.create of a chat file and of a preference file, a supervised job, then a `dpo` job on its fine-tuned model,
 * both followed to `succeeded`, and the result served. Trains on the torch trainer with the 1.2 MB stories260K
 * model; skipped with a message without the client's Python (`.ci/run` makes it) or the torch trainer's venv.
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";
import { openAiPython, runPython, skipWithoutOpenAiPython } from "../lib/openAiPython.ts";
import { torchPythonForTests } from "../lib/torchPython.ts";
import { preferenceLines } from "../lib/preferences.ts";

const python = openAiPython();
const torch = torchPythonForTests();
const stories = fileURLToPath(new URL("../../../shared/models/stories260Ktok512.gguf", import.meta.url));
const skip =
  skipWithoutOpenAiPython(python) ||
  (!torch.ok ? torch.reason : !fs.existsSync(stories) ? `${stories} is not here` : false);

const script = `
import json, sys, time
from openai import OpenAI
client = OpenAI(base_url=sys.argv[1] + "/v1", api_key=sys.argv[2], max_retries=0)

def wait(job):
    while job.status not in ("succeeded", "failed", "cancelled"):
        time.sleep(0.5)
        job = client.fine_tuning.jobs.retrieve(job.id)
    return job

chat_file = client.files.create(file=open(sys.argv[3], "rb"), purpose="fine-tune")
supervised = wait(client.fine_tuning.jobs.create(
    training_file=chat_file.id, model="stories", suffix="sft",
    method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 2}}},
))

preference_file = client.files.create(file=open(sys.argv[4], "rb"), purpose="fine-tune")
dpo = wait(client.fine_tuning.jobs.create(
    training_file=preference_file.id, model=supervised.fine_tuned_model, suffix="dpo",
    method={"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.2, "n_epochs": 2}}},
))
events = [event.message for event in client.fine_tuning.jobs.list_events(dpo.id, limit=100)]

try:
    client.fine_tuning.jobs.create(training_file=preference_file.id, model="stories",
                                   method={"type": "dpo", "dpo": {"hyperparameters": {"beta": -1}}})
    refused = None
except Exception as e:
    refused = {"status": e.status_code, "param": e.body.get("param")}

answer = client.chat.completions.create(model=dpo.fine_tuned_model, max_tokens=4,
                                        messages=[{"role": "user", "content": "Tell me about the cat number 1."}])
print(json.dumps({
    "supervised": {"status": supervised.status, "model": supervised.fine_tuned_model, "error": str(supervised.error)},
    "dpo": {"status": dpo.status, "model": dpo.fine_tuned_model, "method": dpo.method.model_dump(), "from": dpo.model,
            "error": str(dpo.error)},
    "events": events,
    "refused": refused,
    "answer": answer.choices[0].message.content,
}))
`;

test(
  "the official Python client: a DPO job on a preference file after a supervised job, both succeeded",
  { skip, timeout: 600_000 },
  async (t) => {
    const env = await testEnv(t, "sqlite", {
      CONDUIT_TRAINER: "auto",
      CONDUIT_PYTHON: torch.ok ? torch.python : "",
      CONDUIT_TRAIN_THREADS: "1",
    });
    fs.copyFileSync(stories, path.join(env.dataDir, "models", "stories.gguf"));
    const chatFile = path.join(env.dataDir, "chat.jsonl");
    const preferenceFile = path.join(env.dataDir, "preferences.jsonl");
    // The supervised file: the preferred answers as chat examples.
    fs.writeFileSync(
      chatFile,
      preferenceLines
        .map((line) => {
          const example = JSON.parse(line) as {
            input: { messages: unknown[] };
            preferred_output: unknown[];
          };
          return JSON.stringify({ messages: [...example.input.messages, ...example.preferred_output] });
        })
        .join("\n"),
    );
    fs.writeFileSync(preferenceFile, preferenceLines.join("\n"));
    const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
    core.scheduler.start();
    const address = await app.listen({ port: 0, host: "127.0.0.1" });
    const result = await runPython(python!, script, [address, KEY_A, chatFile, preferenceFile]);
    assert.equal(result.status, 0, result.stderr);
    const out = JSON.parse(result.stdout) as {
      supervised: { status: string; model: string; error: string };
      dpo: { status: string; model: string; from: string; method: Record<string, unknown>; error: string };
      events: string[];
      refused: { status: number; param: string } | null;
      answer: string;
    };
    assert.equal(out.supervised.status, "succeeded", out.supervised.error);
    assert.match(out.supervised.model, /^ft:stories:sft:ft_/);
    assert.equal(out.dpo.status, "succeeded", `${out.dpo.error}\n${out.events.join("\n")}`);
    assert.match(out.dpo.model, /^ft:stories:dpo:ft_/);
    assert.equal(out.dpo.from, out.supervised.model, "the job's model is the one it was created on");
    assert.equal(out.dpo.method.type, "dpo");
    assert.deepEqual(
      (out.dpo.method.dpo as { hyperparameters: { beta: number; n_epochs: number } }).hyperparameters.beta,
      0.2,
    );
    const supervisedId = out.supervised.model.slice(out.supervised.model.lastIndexOf(":") + 1);
    assert.ok(
      out.events.some((message) => message.includes(`starts from run ${supervisedId}'s adapter`)),
      out.events.join("\n"),
    );
    assert.deepEqual(out.refused, { status: 400, param: "method.dpo.hyperparameters.beta" });
    assert.equal(typeof out.answer, "string");
  },
);
