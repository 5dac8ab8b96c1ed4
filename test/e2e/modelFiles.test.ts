// Model files replaced under a running server. The server runs as its own process: before the engine read its
// models into memory, a loaded file truncated in place ended the process with SIGBUS, which would take the
// test runner with it.
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { KEY_A } from "../lib/helper.ts";

const bin = fileURLToPath(new URL("../../bin/conduit.js", import.meta.url));

/** `conduit serve` on port 0 (its banner says the port), killed after the test if still running. */
async function serve(t: TestContext, dataDir: string) {
  const child = spawn(process.execPath, [bin, "serve"], {
    env: {
      PATH: process.env.PATH ?? "",
      CONDUIT_DATA_DIR: dataDir,
      CONDUIT_PORT: "0",
      CONDUIT_API_KEYS: `${KEY_A}:alice`,
      CONDUIT_LOG_LEVEL: "info",
      CONDUIT_TRAIN_CONCURRENCY: "0",
      CONDUIT_GPU: "off",
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => (output += chunk));
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (output += chunk));
  const closed = once(child, "close") as Promise<[number | null, NodeJS.Signals | null]>;
  let ended: string | undefined;
  child.on("exit", (code, signal) => (ended = signal ?? `exit code ${code}`));
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  const deadline = Date.now() + 60_000;
  let url: string | undefined;
  while (url === undefined) {
    assert.equal(child.exitCode, null, `conduit serve exited early: ${output}`);
    assert.ok(Date.now() < deadline, `conduit serve did not start within 60 s: ${output}`);
    url = /Conduit is listening on (http:\/\/\S+)/.exec(output)?.[1];
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  return {
    url,
    output: () => output,
    alive: () => child.exitCode === null && child.signalCode === null,
    /** How the process ended (`SIGBUS`), waiting a moment for it; `undefined` while it runs. */
    async ended(): Promise<string | undefined> {
      await Promise.race([closed, new Promise((resolve) => setTimeout(resolve, 1000))]);
      return ended;
    },
    async stop(): Promise<[number | null, NodeJS.Signals | null]> {
      child.kill("SIGTERM");
      return closed;
    },
  };
}

test("a loaded model file rewritten, truncated or renamed over: the server stays up and serves the file as it is now", async (t) => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-modelfiles-"));
  t.after(() => fs.rmSync(dataDir, { recursive: true, force: true }));
  const models = path.join(dataDir, "models");
  fs.mkdirSync(models);
  const tiny = path.join(models, "tiny.gguf");
  // Another model of another shape, also served as `next` to know what it answers.
  const next = path.join(models, "next.gguf");
  await createTinyModel(tiny, { seed: 1 });
  await createTinyModel(next, { seed: 2, embeddingLength: 32, blockCount: 1 });
  const original = fs.readFileSync(tiny);
  const replacement = fs.readFileSync(next);
  assert.ok(replacement.length < original.length, "the replacement is smaller: the old file's tail is gone");

  const server = await serve(t, dataDir);
  const ask = async (model: string) => {
    const response = await fetch(`${server.url}/v1/completions`, {
      method: "POST",
      headers: { "x-api-key": KEY_A, "content-type": "application/json" },
      body: JSON.stringify({ model, prompt: "Once upon a time", max_tokens: 12, temperature: 0 }),
    }).catch(async (error: Error) =>
      assert.fail(`no answer (${error.message}); the server ended with ${await server.ended()}`),
    );
    const body = (await response.json()) as {
      choices?: { text: string }[];
      error?: { code: string; message: string };
    };
    return { status: response.status, text: body.choices?.[0]?.text, error: body.error };
  };
  const before = await ask("tiny");
  const nextAnswer = await ask("next");
  assert.equal(before.status, 200);
  assert.equal(nextAnswer.status, 200);
  assert.notEqual(before.text, nextAnswer.text, "the two models answer differently");

  /** The log line shows up (a moment after the answer, through the pipe). */
  const logShows = async (pattern: RegExp) => {
    for (let i = 0; i < 50 && !pattern.test(server.output()); i++)
      await new Promise((resolve) => setTimeout(resolve, 100));
    assert.match(server.output(), pattern);
  };

  // `cp next.gguf tiny.gguf`: the same inode, truncated and written again.
  const inode = fs.statSync(tiny).ino;
  fs.writeFileSync(tiny, replacement);
  assert.equal(fs.statSync(tiny).ino, inode);
  const rewritten = await ask("tiny");
  assert.ok(server.alive(), `the server died: ${server.output().slice(-2000)}`);
  assert.deepEqual(rewritten, nextAnswer, "the file as it is now is served");
  await logShows(
    /model 'tiny': \S+tiny\.gguf was rewritten in place \(\d+ bytes, now \d+\); unloading it and loading the file again/,
  );

  // The recommended way: a complete file renamed over the old one.
  fs.writeFileSync(`${tiny}.tmp`, original);
  fs.renameSync(`${tiny}.tmp`, tiny);
  assert.deepEqual(await ask("tiny"), before, "the original model is back");
  await logShows(/model 'tiny': \S+tiny\.gguf was replaced by another file/);

  // Truncated (a copy in progress): that request fails by name, the server goes on.
  fs.truncateSync(tiny, Math.floor(original.length / 2));
  const truncated = await ask("tiny");
  assert.ok(server.alive(), `the server died: ${server.output().slice(-2000)}`);
  assert.equal(truncated.status, 503);
  assert.equal(truncated.error?.code, "unavailable");
  assert.match(truncated.error?.message ?? "", /The model 'tiny' could not be loaded/);
  await logShows(/loading model 'tiny' failed/);
  assert.equal((await ask("next")).status, 200, "other models are not affected");
  // The copy completes: the next request loads it.
  fs.writeFileSync(tiny, original);
  assert.deepEqual(await ask("tiny"), before);

  assert.deepEqual(await server.stop(), [0, null]);
});
