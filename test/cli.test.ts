import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import type { FastifyInstance } from "fastify";
import { buildTestApp, testEnv } from "./helper.ts";

const bin = fileURLToPath(new URL("../bin/conduit.js", import.meta.url));

interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the real `conduit` binary. */
function conduit(env: Record<string, string>, ...args: string[]): Promise<CliResult> {
  return new Promise((resolve) => {
    execFile(
      process.execPath,
      [bin, ...args],
      { env: { PATH: process.env.PATH ?? "", ...env }, timeout: 120_000 },
      (error, stdout, stderr) =>
        resolve({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr }),
    );
  });
}

test("the conduit CLI drives the whole loop against a real server", async (t) => {
  const environment = await testEnv(t);
  const { app } = await buildTestApp(t, environment, { scheduler: { pollMs: 200, concurrency: 1 } });
  (app as FastifyInstance & { conduit: { scheduler: { start(): void } } }).conduit.scheduler.start();
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  const local = { CONDUIT_DATA_DIR: environment.dataDir, CONDUIT_LOG_LEVEL: "silent" };

  const help = await conduit(local, "--help");
  assert.equal(help.code, 0);
  for (const command of ["serve", "keys", "models", "datasets", "runs", "chat"])
    assert.match(help.stdout, new RegExp(`\\b${command}\\b`));
  assert.equal((await conduit(local, "runs", "--help")).code, 0);

  // Keys are managed in the local database the server uses.
  const created = await conduit(local, "keys", "create", "--user", "carol");
  assert.equal(created.code, 0, created.stderr);
  const key = created.stdout.trim();
  assert.match(key, /^cnd_/);
  const env = { ...local, CONDUIT_URL: url, CONDUIT_API_KEY: key };
  const keys = JSON.parse((await conduit(env, "--json", "keys", "list", "--user", "carol")).stdout);
  assert.equal(keys.length, 1);
  assert.equal(keys[0].userId, "carol");
  assert.equal(JSON.stringify(keys).includes(key), false, "listing never shows the key");

  const dataset = JSON.parse((await conduit(env, "--json", "datasets", "create", "greetings")).stdout);
  assert.match(dataset.id, /^ds_/);
  const file = path.join(environment.dataDir, "pairs.jsonl");
  fs.writeFileSync(
    file,
    ["hi", "hey", "yo"].map((w, i) => JSON.stringify({ input: w, output: `hello ${i}` })).join("\n") + "\n",
  );
  const uploaded = await conduit(env, "datasets", "upload", dataset.id, file);
  assert.equal(uploaded.code, 0, uploaded.stderr);
  assert.match(uploaded.stdout, /3 pairs/);

  const bad = path.join(environment.dataDir, "bad.csv");
  fs.writeFileSync(bad, "input,output\na,b\nc\n");
  const refused = await conduit(env, "datasets", "upload", dataset.id, bad);
  assert.equal(refused.code, 2);
  assert.match(refused.stderr, /bad\.csv: line 3: invalid CSV/);

  const listed = await conduit(env, "datasets", "list");
  assert.match(listed.stdout, new RegExp(`${dataset.id}\\s+greetings\\s+3\\s+READY`));
  assert.equal((await conduit(env, "datasets", "rename", dataset.id, "hellos")).code, 0);
  assert.match((await conduit(env, "datasets", "show", dataset.id)).stdout, /^hellos/);

  const watched = await conduit(
    env,
    "runs",
    "create",
    "--dataset",
    dataset.id,
    "--model",
    "tiny",
    "--epochs",
    "2",
    "--watch",
  );
  assert.equal(watched.code, 0, watched.stdout + watched.stderr);
  assert.match(watched.stdout, /status: READY/);
  const runId = watched.stdout.match(/^(ft_\S+) QUEUED/m)?.[1];
  assert.ok(runId, watched.stdout);
  const runs = JSON.parse((await conduit(env, "--json", "runs", "list")).stdout);
  assert.equal(runs[0].id, runId);
  assert.match((await conduit(env, "runs", "show", runId)).stdout, /READY/);
  const models = JSON.parse((await conduit(env, "--json", "models", "list")).stdout);
  assert.deepEqual(models.map((m: { id: string }) => m.id).sort(), [runId, "tiny"].sort());

  const chat = await conduit(
    env,
    "chat",
    "--model",
    runId,
    "--prompt",
    "hi",
    "--max-tokens",
    "4",
    "--temperature",
    "0",
  );
  assert.equal(chat.code, 0, chat.stderr);
  const chatJson = JSON.parse(
    (
      await conduit(
        env,
        "--json",
        "chat",
        "--model",
        runId,
        "--prompt",
        "hi",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
      )
    ).stdout,
  );
  assert.equal(chatJson.object, "chat.completion");
  assert.equal(
    chat.stdout.trim(),
    chatJson.choices[0].text.trim(),
    "streamed and JSON answers agree (greedy)",
  );

  // Exit codes that mean something.
  const ended = await conduit(env, "runs", "cancel", runId);
  assert.equal(ended.code, 5, "a finished run cannot be cancelled: conflict");
  assert.match(ended.stderr, /READY and cannot be cancelled/);
  assert.equal((await conduit(env, "runs", "show", "ft_missing")).code, 3);
  const noDataset = await conduit(env, "runs", "create", "--model", "tiny");
  assert.equal(noDataset.code, 2);
  assert.match(noDataset.stderr, /--dataset/);
  const badLr = await conduit(
    env,
    "runs",
    "create",
    "--dataset",
    dataset.id,
    "--model",
    "tiny",
    "--lr",
    "-1",
  );
  assert.equal(badLr.code, 2);
  assert.match(badLr.stderr, /lr/);
  const wrongKey = await conduit({ ...env, CONDUIT_API_KEY: "wrong-key-123" }, "datasets", "list");
  assert.equal(wrongKey.code, 4);
  assert.match(wrongKey.stderr, /invalid API key/);
  const noKey = await conduit({ ...local, CONDUIT_URL: url }, "datasets", "list");
  assert.equal(noKey.code, 4);
  const down = await conduit({ ...env, CONDUIT_URL: "http://127.0.0.1:9" }, "datasets", "list");
  assert.equal(down.code, 1);
  assert.match(down.stderr, /cannot reach/);
  assert.equal((await conduit(env, "nonsense")).code, 2);

  assert.equal((await conduit(env, "runs", "delete", runId)).code, 0);
  assert.equal((await conduit(env, "datasets", "delete", dataset.id)).code, 0);
  assert.equal((await conduit(env, "keys", "revoke", keys[0].id)).code, 0);
  assert.equal((await conduit(env, "datasets", "list")).code, 4, "a revoked key stops working");
  assert.equal((await conduit(env, "keys", "revoke", keys[0].id)).code, 3);
});
