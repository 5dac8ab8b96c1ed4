import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import http from "node:http";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { test, type TestContext } from "node:test";
import { buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";
import { EtaEstimate } from "../../src/cli/runsCommand.ts";
import type { EvalGrader } from "../../src/contract/evals.ts";
import { ConduitError } from "../../src/errors.ts";
import { EvalRepository } from "../../src/store/EvalRepository.ts";
import { ModelRegistry, type PullProgress } from "../../src/model/ModelRegistry.ts";
import { beforeAfterTotals } from "../lib/evalTotals.ts";
import { freePort } from "../lib/wait.ts";
import { bin, cliServer, conduit, conduitWithInput, jsonLines, type CliResult } from "../lib/cli.ts";

/** `conduit [--json] runs create --dataset <id> --model tiny [options]`. */
function runsCreate(
  env: Record<string, string>,
  datasetId: string,
  options: string[] = [],
  { json = false }: { json?: boolean } = {},
): Promise<CliResult> {
  const create = ["runs", "create", "--dataset", datasetId, "--model", "tiny", ...options];
  return conduit(env, ...(json ? ["--json", ...create] : create));
}

/** A dataset of alice's holding one pair. */
async function onePairDataset(core: Awaited<ReturnType<typeof cliServer>>["core"]) {
  const dataset = await core.datasets.create("alice", "d");
  await core.datasets.upload("alice", dataset.id, {
    name: "train.jsonl",
    source: Readable.from([`${JSON.stringify({ input: "q", output: "a" })}\n`]),
  });
  return dataset;
}

/** Runs `conduit` whose stdout is closed before it writes (like `| head -1` after the first line). */
async function conduitWithClosedStdout(env: Record<string, string>, ...args: string[]): Promise<CliResult> {
  const child = spawn(process.execPath, [bin, ...args], {
    env: { PATH: process.env.PATH ?? "", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  child.stdout.destroy();
  let stderr = "";
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
  const [code] = (await once(child, "close")) as [number | null];
  return { code: code ?? 1, stdout: "", stderr };
}

test("the conduit CLI drives the whole loop against a real server", async (t) => {
  const environment = await testEnv(t);
  const { app, core } = await buildTestApp(t, environment, { scheduler: { pollMs: 200, concurrency: 1 } });
  core.scheduler.start();
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

  // `--json` output is one JSON document per line: the run, then each event it goes through.
  const watched = await runsCreate(env, dataset.id, ["--epochs", "2", "--watch"], { json: true });
  assert.equal(watched.code, 0, watched.stdout + watched.stderr);
  const lines = watched.stdout.trim().split("\n");
  const [run, ...events] = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
  const runId = String(run?.id);
  assert.match(runId, /^ft_/);
  assert.equal(run?.status, "QUEUED");
  assert.ok(events.length > 0, watched.stdout);
  for (const event of events) assert.ok(["log", "stats", "status"].includes(String(event.event)));
  assert.ok(
    events.some((e) => e.event === "stats" && typeof (e.data as { step?: unknown }).step === "number"),
  );
  assert.deepEqual(events.at(-1), { event: "status", data: { status: "READY", error: null } });
  // Following a finished run replays it, in words this time.
  const followed = await conduit(env, "runs", "watch", runId);
  assert.equal(followed.code, 0, followed.stderr);
  assert.match(followed.stdout, /status: READY/);
  const runs = JSON.parse((await conduit(env, "--json", "runs", "list")).stdout);
  assert.equal(runs[0].id, runId);
  assert.match((await conduit(env, "runs", "show", runId)).stdout, /READY/);
  const models = JSON.parse((await conduit(env, "--json", "models", "list")).stdout);
  assert.deepEqual(models.map((m: { id: string }) => m.id).sort(), [runId, "tiny"].sort());

  const askOnce = ["chat", "--model", runId, "--prompt", "hi", "--max-tokens", "4", "--temperature", "0"];
  const chat = await conduit(env, ...askOnce);
  assert.equal(chat.code, 0, chat.stderr);
  const chatJson = JSON.parse((await conduit(env, "--json", ...askOnce)).stdout);
  assert.equal(chatJson.object, "chat.completion");
  assert.equal(
    chat.stdout.trim(),
    chatJson.choices[0].text.trim(),
    "streamed and JSON answers agree (greedy)",
  );

  // What the server holds in memory now: the fine-tune just used, for its owner only.
  const ps = await conduit(env, "models", "ps");
  assert.equal(ps.code, 0, ps.stderr);
  assert.match(ps.stdout, /^ID\s+KIND\s+BASE\s+MEMORY\s+CONTEXT\s+ACTIVE\s+QUEUED\s+IDLE$/m);
  assert.match(
    ps.stdout,
    new RegExp(`^${runId}\\s+fine-tuned\\s+tiny\\s+\\d+(\\.\\d)? KiB\\s+\\d+\\s+0\\s+0\\s+\\d+s$`, "m"),
  );
  const loaded = JSON.parse((await conduit(env, "--json", "models", "ps")).stdout) as {
    id: string;
    memory_bytes: number;
    idle_seconds: number;
  }[];
  const mine = loaded.find((m) => m.id === runId);
  assert.ok(mine && mine.memory_bytes > 0 && mine.idle_seconds >= 0, JSON.stringify(loaded));
  const asAlice = { ...env, CONDUIT_API_KEY: KEY_A };
  const aliceChat = await conduit(asAlice, "chat", "--model", "tiny", "--prompt", "hi", "--max-tokens", "2");
  assert.equal(aliceChat.code, 0, aliceChat.stderr);
  const others = JSON.parse((await conduit(asAlice, "--json", "models", "ps")).stdout) as {
    id: string;
    kind: string;
  }[];
  assert.deepEqual(
    others.map((m) => [m.id, m.kind]),
    [["tiny", "base"]],
    "alice sees the base model she used, never carol's fine-tune",
  );

  // Interactive chat with --json: one chat.completion per answer, one per line; prompts on stderr.
  const interactive = await conduitWithInput(
    env,
    "hi\nhey\n\n",
    "--json",
    "chat",
    "--model",
    runId,
    "--max-tokens",
    "4",
    "--temperature",
    "0",
  );
  assert.equal(interactive.code, 0, interactive.stderr);
  const answers = interactive.stdout
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line) as { object: string; choices: { text: string }[] });
  assert.equal(answers.length, 2, interactive.stdout);
  assert.ok(answers.every((a) => a.object === "chat.completion"));
  assert.equal(answers[0]?.choices[0]?.text, chatJson.choices[0].text, "same prompt, same greedy answer");
  assert.match(interactive.stderr, /> /);

  // The run's result streams to a file: the bytes the server stored.
  const result = path.join(environment.dataDir, "result.gguf");
  const downloaded = await conduit(env, "--json", "runs", "download", runId, "-o", result);
  assert.equal(downloaded.code, 0, downloaded.stderr);
  const stored = await core.runs.artifact("carol", runId);
  assert.deepEqual(JSON.parse(downloaded.stdout), { id: runId, path: result, sizeBytes: stored.sizeBytes });
  assert.ok(fs.readFileSync(result).equals(fs.readFileSync(stored.path)));
  // --merged: one GGUF, the adapter merged into the base; --ollama: a folder with the GGUF and a Modelfile.
  const mergedFile = path.join(environment.dataDir, "merged.gguf");
  const merged = await conduit(env, "--json", "runs", "download", runId, "--merged", "-o", mergedFile);
  assert.equal(merged.code, 0, merged.stderr);
  assert.equal(
    fs.statSync(mergedFile).size,
    fs.statSync(path.join(environment.dataDir, "models", "tiny.gguf")).size,
  );
  const folder = path.join(environment.dataDir, "for-ollama");
  const ollama = await conduit(env, "--json", "runs", "download", runId, "--ollama", "-o", folder);
  assert.equal(ollama.code, 0, ollama.stderr);
  assert.deepEqual(JSON.parse(ollama.stdout).files, [`${runId}-lora.gguf`, "Modelfile"]);
  assert.ok(fs.readFileSync(path.join(folder, `${runId}-lora.gguf`)).equals(fs.readFileSync(stored.path)));
  const modelfile = fs.readFileSync(path.join(folder, "Modelfile"), "utf8");
  assert.match(modelfile, /^FROM \.\/tiny\.gguf$/m);
  assert.match(modelfile, new RegExp(`^ADAPTER \\./${runId}-lora\\.gguf$`, "m"));
  assert.match(modelfile, /^TEMPLATE """/m);
  assert.match(modelfile, /^PARAMETER stop "/m);
  const mergedFolder = path.join(environment.dataDir, "for-ollama-merged");
  const ollamaMerged = await conduit(
    env,
    "runs",
    "download",
    runId,
    "--ollama",
    "--merged",
    "-o",
    mergedFolder,
  );
  assert.equal(ollamaMerged.code, 0, ollamaMerged.stderr);
  const mergedModelfile = fs.readFileSync(path.join(mergedFolder, "Modelfile"), "utf8");
  assert.match(mergedModelfile, new RegExp(`^FROM \\./${runId}-merged\\.gguf$`, "m"));
  assert.doesNotMatch(mergedModelfile, /^ADAPTER/m);
  // The downloaded adapter comes back in as an imported adapter, answers as the run, and goes.
  const imported = await conduit(
    env,
    "--json",
    "models",
    "import-adapter",
    result,
    "--base",
    "tiny",
    "--name",
    "back",
  );
  assert.equal(imported.code, 0, imported.stderr);
  const adapter = JSON.parse(imported.stdout) as {
    id: string;
    name: string;
    format: string;
    base_model: string;
  };
  assert.match(adapter.id, /^ad_/);
  assert.deepEqual([adapter.name, adapter.format, adapter.base_model], ["back", "gguf", "tiny"]);
  const adapterChat = await conduit(env, "--json", ...askOnce.map((a) => (a === runId ? adapter.id : a)));
  assert.equal(adapterChat.code, 0, adapterChat.stderr);
  assert.equal(
    JSON.parse(adapterChat.stdout).choices[0].text,
    chatJson.choices[0].text,
    "same greedy answer",
  );
  const adapters = await conduit(env, "models", "adapters");
  assert.match(adapters.stdout, new RegExp(`^${adapter.id}\\s+back\\s+tiny\\s+gguf\\s+`, "m"));
  const wrongBase = await conduit(env, "models", "import-adapter", result, "--base", "nope");
  assert.equal(wrongBase.code, 3, wrongBase.stderr);
  assert.equal((await conduit(env, "models", "delete-adapter", adapter.id)).code, 0);
  assert.deepEqual(JSON.parse((await conduit(env, "--json", "models", "adapters")).stdout), []);
  const nothing = path.join(environment.dataDir, "nothing.gguf");
  assert.equal((await conduit(env, "runs", "download", "ft_missing", "-o", nothing)).code, 3);
  assert.equal(fs.existsSync(nothing) || fs.existsSync(`${nothing}.part`), false);
  // LoRA settings are run options; the server refuses them with --method full (bad input).
  const loraWithFull = await runsCreate(env, dataset.id, ["--method", "full", "--lora-rank", "8"]);
  assert.equal(loraWithFull.code, 2);
  assert.match(loraWithFull.stderr, /"loraRank" is a LoRA setting/);

  // Its kept checkpoints (2 epochs: both), each a model name that answers.
  const checkpoints = JSON.parse((await conduit(env, "--json", "runs", "checkpoints", runId)).stdout);
  assert.deepEqual(
    checkpoints.map((c: { epoch: number }) => c.epoch),
    [2, 1],
  );
  assert.match((await conduit(env, "runs", "checkpoints", runId)).stdout, /^STEP\s+EPOCH/);
  const fromCheckpoint = await conduit(env, "chat", "--model", checkpoints[1].model, "--prompt", "hi");
  assert.equal(fromCheckpoint.code, 0, fromCheckpoint.stderr);

  // Exit codes that mean something.
  for (const verb of ["pause", "resume"]) {
    const done = await conduit(env, "runs", verb, runId);
    assert.equal(done.code, 5, `a READY run cannot ${verb}: conflict`);
  }
  const ended = await conduit(env, "runs", "cancel", runId);
  assert.equal(ended.code, 5, "a finished run cannot be cancelled: conflict");
  assert.match(ended.stderr, /READY and cannot be cancelled/);
  assert.equal((await conduit(env, "runs", "show", "ft_missing")).code, 3);
  const noDataset = await conduit(env, "runs", "create", "--model", "tiny");
  assert.equal(noDataset.code, 2);
  assert.match(noDataset.stderr, /--dataset/);
  const badLr = await runsCreate(env, dataset.id, ["--lr", "-1"]);
  assert.equal(badLr.code, 2);
  assert.match(badLr.stderr, /lr/);
  const missingFile = await conduit(
    env,
    "datasets",
    "upload",
    dataset.id,
    path.join(environment.dataDir, "nope.jsonl"),
  );
  assert.equal(missingFile.code, 2, "a missing local file is bad input");
  assert.match(missingFile.stderr, /nope\.jsonl: no such file/);
  assert.equal((await conduit(env, "datasets", "upload", dataset.id, environment.dataDir)).code, 2);
  const wrongKey = await conduit({ ...env, CONDUIT_API_KEY: "wrong-key-123" }, "datasets", "list");
  assert.equal(wrongKey.code, 4);
  assert.match(wrongKey.stderr, /invalid API key/);
  const noKey = await conduit({ ...local, CONDUIT_URL: url }, "datasets", "list");
  assert.equal(noKey.code, 4);
  const down = await conduit({ ...env, CONDUIT_URL: "http://127.0.0.1:9" }, "datasets", "list");
  assert.equal(down.code, 1);
  assert.match(down.stderr, /cannot reach/i);
  assert.equal((await conduit(env, "nonsense")).code, 2);

  assert.equal((await conduit(env, "runs", "delete", runId)).code, 0);
  assert.equal((await conduit(env, "datasets", "delete", dataset.id)).code, 0);
  assert.equal((await conduit(env, "keys", "revoke", keys[0].id)).code, 0);
  assert.equal((await conduit(env, "datasets", "list")).code, 4, "a revoked key stops working");
  assert.equal((await conduit(env, "keys", "revoke", keys[0].id)).code, 3);
});

test("runs create takes auto or numbers and the validation options; runs examples prints a READY run's examples", async (t) => {
  // No trainer: runs stay QUEUED until the test makes one READY.
  const { core, env } = await cliServer(t);

  const help = await conduit(env, "runs", "create", "--help");
  for (const option of [
    "--epochs",
    "--lr",
    "--lora-rank",
    "--train-on-inputs",
    "--validation-file",
    "--early-stopping",
  ])
    assert.match(help.stdout, new RegExp(`${option}\\b`), option);
  assert.match(help.stdout, /or auto/);
  assert.match((await conduit(env, "runs", "--help")).stdout, /examples/);

  const dataset = await core.datasets.create("alice", "d");
  const pairs = (n: number) =>
    Readable.from([
      Array.from({ length: n }, (_, i) => JSON.stringify({ input: `q${i}`, output: `a${i}` })).join("\n"),
    ]);
  await core.datasets.upload("alice", dataset.id, { name: "train.jsonl", source: pairs(4) });
  const held = await core.datasets.upload("alice", dataset.id, { name: "held.jsonl", source: pairs(2) });

  const created = await runsCreate(
    env,
    dataset.id,
    [
      "--epochs",
      "auto",
      "--lr",
      "0.002",
      "--train-on-inputs",
      "--validation-file",
      held.id,
      "--early-stopping",
      "3",
    ],
    { json: true },
  );
  assert.equal(created.code, 0, created.stderr);
  const run = JSON.parse(created.stdout) as { id: string; config: Record<string, unknown>; logs: string[] };
  assert.equal(run.config.lr, 0.002);
  assert.ok(Number.isInteger(run.config.epochs), String(run.config.epochs));
  assert.deepEqual(run.config.autoSettings, ["epochs", "loraRank"]);
  assert.equal(run.config.trainOnInputs, true);
  assert.equal(run.config.validationFileID, held.id);
  assert.equal(run.config.earlyStoppingPatience, 3);
  assert.match(run.logs.join("\n"), /auto settings: /);
  const explicit = JSON.parse(
    (await runsCreate(env, dataset.id, ["--epochs", "5", "--lora-rank", "8"], { json: true })).stdout,
  ) as { config: Record<string, unknown> };
  assert.equal(explicit.config.epochs, 5);
  assert.equal(explicit.config.loraRank, 8);
  assert.equal(explicit.config.trainOnInputs, false);
  assert.deepEqual(explicit.config.autoSettings, ["lr"]);
  const badEpochs = await runsCreate(env, dataset.id, ["--epochs", "many"]);
  assert.equal(badEpochs.code, 2);
  assert.match(badEpochs.stderr, /--epochs must be a number or auto/);
  const badPatience = await runsCreate(env, dataset.id, ["--early-stopping", "0"]);
  assert.equal(badPatience.code, 2);
  assert.match(badPatience.stderr, /earlyStoppingPatience/);

  const queued = await conduit(env, "runs", "examples", run.id);
  assert.equal(queued.code, 5, "not READY: conflict");
  assert.match(queued.stderr, /QUEUED, not READY/);
  assert.equal((await conduit(env, "runs", "examples", "ft_missing")).code, 3);

  assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, run.id);
  assert.ok(await core.runRepository.finish(run.id, "w", { status: "READY", modelPath: "/m.gguf" }));
  const file = core.blobs.pathOf(`runs/${run.id}/examples.jsonl`);
  fs.mkdirSync(path.dirname(file), { recursive: true });
  const long = "a long answer ".repeat(10);
  fs.writeFileSync(
    file,
    [
      { split: "train", index: 0, input: "q0", output: "a0", loss: 0.01, tokens: 2 },
      { split: "train", index: 1, input: "line one\nline two", output: long, loss: 2.5, tokens: 30 },
      { split: "validation", index: 0, input: "v0", output: "b0", loss: null, tokens: 2 },
      { split: "validation", index: 1, input: "v1", output: "b1", loss: 1.25, tokens: 2 },
    ]
      .map((e) => JSON.stringify(e))
      .join("\n") + "\n",
  );

  const printed = await conduit(env, "runs", "examples", run.id, "--limit", "3");
  assert.equal(printed.code, 0, printed.stderr);
  const lines = printed.stdout.trimEnd().split("\n");
  assert.match(lines[0] ?? "", /^LOSS\s+SPLIT\s+INDEX\s+INPUT\s+OUTPUT$/);
  assert.match(lines[1] ?? "", /^2\.5000\s+train\s+1\s+line one⏎line two\s+a long answer .*…$/);
  assert.ok((lines[1] ?? "").length < 120, "input and output are cut short");
  assert.match(lines[2] ?? "", /^1\.2500\s+validation\s+1\s+v1\s+b1$/);
  assert.match(lines[3] ?? "", /^0\.0100\s+train\s+0\s+q0\s+a0$/);
  assert.equal(lines[4], "examples 1–3 of 4");
  const validation = await conduit(
    env,
    "--json",
    "runs",
    "examples",
    run.id,
    "--split",
    "validation",
    "--sort",
    "index",
  );
  assert.equal(validation.code, 0, validation.stderr);
  assert.deepEqual(
    (JSON.parse(validation.stdout) as { index: number; loss: number | null }[]).map((e) => [e.index, e.loss]),
    [
      [0, null],
      [1, 1.25],
    ],
  );
  const badSort = await conduit(env, "runs", "examples", run.id, "--sort", "worst");
  assert.equal(badSort.code, 2);
  assert.match(badSort.stderr, /sort/);

  // Plain `runs create` prints the id alone, so `R=$(conduit runs create …)` works.
  const plain = await runsCreate(env, dataset.id);
  assert.equal(plain.code, 0, plain.stderr);
  assert.match(plain.stdout, /^ft_\S+\n$/);
  assert.equal((await core.runs.get("alice", plain.stdout.trim())).status, "QUEUED");

  // `conduit runs show … | head -1`: a reader that leaves early is no crash.
  const cut = await conduitWithClosedStdout(env, "runs", "show", run.id);
  assert.equal(cut.code, 0, cut.stderr);
  assert.doesNotMatch(cut.stderr, /EPIPE|Error/);

  // `--json` errors carry the API's string code, and the exit code apart.
  const missing = await conduit(env, "--json", "runs", "show", "ft_missing");
  assert.equal(missing.code, 3);
  const missingError = JSON.parse(missing.stderr) as { error: Record<string, unknown> };
  assert.equal(missingError.error.code, "not_found");
  assert.equal(missingError.error.exitCode, 3);
  const invalid = JSON.parse(
    (await conduit(env, "--json", "runs", "create", "--dataset", dataset.id, "--early-stopping", "0")).stderr,
  ) as { error: Record<string, unknown> };
  assert.deepEqual(
    [invalid.error.code, invalid.error.param, invalid.error.exitCode],
    ["invalid_request", "earlyStoppingPatience", 2],
  );
  const usage = JSON.parse((await conduit(env, "--json", "runs", "create")).stderr) as {
    error: Record<string, unknown>;
  };
  assert.deepEqual(
    [usage.error.code, usage.error.exitCode],
    ["invalid_request", 2],
    "the CLI's own errors too",
  );
});

/** `conduit serve` as its own process (killed after the test if still running), once /healthz answers. */
async function serve(t: TestContext, env: Record<string, string>, url: string) {
  const child = spawn(process.execPath, [bin, "serve"], {
    env: { PATH: process.env.PATH ?? "", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stdout.setEncoding("utf8").on("data", (chunk: string) => (stdout += chunk));
  child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
  // "close" comes after the output has been read in full.
  const closed = once(child, "close") as Promise<[number | null, NodeJS.Signals | null]>;
  t.after(() => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
  });
  const deadline = Date.now() + 60_000;
  for (;;) {
    assert.equal(child.exitCode, null, `conduit serve exited early: ${stdout}${stderr}`);
    assert.ok(Date.now() < deadline, `conduit serve did not answer within 60 s: ${stdout}${stderr}`);
    const healthy = await fetch(`${url}/healthz`).then(
      (response) => response.ok,
      () => false,
    );
    if (healthy) break;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  return {
    output: () => stdout,
    /** SIGTERM, then the exit code and signal once its output is all read. */
    async stop(): Promise<[number | null, NodeJS.Signals | null]> {
      child.kill("SIGTERM");
      return closed;
    },
  };
}

test("conduit serve: a first-start key printed once, graceful SIGTERM, no key on a second start", async (t) => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-serve-"));
  t.after(() => fs.rmSync(dataDir, { recursive: true, force: true }));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  // No CONDUIT_API_KEYS and an empty database: the server makes the first key itself.
  const env = { CONDUIT_DATA_DIR: dataDir, CONDUIT_PORT: String(port) };

  const first = await serve(t, env, url);
  // Printed before the server listens; the pipe may deliver it a moment after /healthz answers.
  for (let i = 0; i < 50 && !/cnd_/.test(first.output()); i++)
    await new Promise((resolve) => setTimeout(resolve, 100));
  const key = first.output().match(/cnd_[A-Za-z0-9_-]+/)?.[0];
  assert.ok(key, `a first start prints a key: ${first.output()}`);
  const listed = await fetch(`${url}/conduit/dataset`, { headers: { "x-api-key": key } });
  assert.equal(listed.status, 200);
  assert.deepEqual(await listed.json(), []);
  assert.equal((await fetch(`${url}/conduit/dataset`)).status, 401);
  // The banner says where the dashboard is; the root leads there; the log shows the real port.
  assert.match(first.output(), new RegExp(`Dashboard: ${url}/ui\\n`));
  const root = await fetch(`${url}/`, { redirect: "manual" });
  assert.equal(root.status, 302);
  assert.equal(root.headers.get("location"), "/ui");
  assert.match(first.output(), new RegExp(`"serverUrl":"${url}"`));

  // A second server on the same port stops at once, naming the setting to change.
  const busy = await conduit(env, "serve");
  assert.equal(busy.code, 2, busy.stdout + busy.stderr);
  assert.match(busy.stderr, new RegExp(`port ${port} on 127\\.0\\.0\\.1 is in use.*CONDUIT_PORT`));
  assert.deepEqual(await first.stop(), [0, null], "SIGTERM shuts down cleanly with exit code 0");
  assert.equal(
    first.output().split(key).length - 1,
    1,
    `the key is printed once and logged nowhere else: ${first.output()}`,
  );

  const second = await serve(t, env, url);
  const again = await fetch(`${url}/conduit/dataset`, { headers: { "x-api-key": key } });
  assert.equal(again.status, 200, "the first key still works");
  assert.deepEqual(await second.stop(), [0, null]);
  assert.doesNotMatch(second.output(), /cnd_|No API key existed/, "a second start prints no key");
});

test("models list shows each model's kind, base, context length, size and quantization", async (t) => {
  const { environment, env } = await cliServer(t);
  const listed = await conduit(env, "models", "list");
  assert.equal(listed.code, 0, listed.stderr);
  const [header, tiny] = listed.stdout.trim().split("\n");
  assert.match(header ?? "", /^ID\s+KIND\s+BASE\s+CONTEXT\s+SIZE\s+QUANT\s+OWNER$/);
  const kib = Math.round(fs.statSync(path.join(environment.dataDir, "models", "tiny.gguf")).size / 1024);
  assert.match(tiny ?? "", new RegExp(`^tiny\\s+base\\s+-\\s+1024\\s+${kib} KiB\\s+F32\\s+conduit$`));
  const json = JSON.parse((await conduit(env, "--json", "models", "list")).stdout);
  assert.equal(json[0].context_length, 1024);
  assert.equal(json[0].quantization, "F32");

  // Without CONDUIT_URL the CLI finds the server where CONDUIT_HOST and CONDUIT_PORT put it.
  const { CONDUIT_URL: url, ...local } = env;
  const port = new URL(url).port;
  const byPort = await conduit({ ...local, CONDUIT_PORT: port, CONDUIT_HOST: "0.0.0.0" }, "models", "list");
  assert.equal(byPort.code, 0, byPort.stderr);
  assert.match(byPort.stdout, /^tiny\s/m);
  const elsewhere = `http://127.0.0.1:${await freePort()}`;
  const urlWins = await conduit({ ...env, CONDUIT_URL: elsewhere, CONDUIT_PORT: port }, "models", "list");
  assert.equal(urlWins.code, 1, "CONDUIT_URL wins over CONDUIT_PORT");
  assert.match(urlWins.stderr, new RegExp(`cannot reach ${elsewhere}`, "i"));

  // Every create prints the id alone.
  const created = await conduit(env, "models", "create-tiny", "--id", "tiny2");
  assert.equal(created.code, 0, created.stderr);
  assert.equal(created.stdout, "tiny2\n");
});

/** A local server for `models pull`: a file, a 404, a page that is not GGUF, and a download that stalls. */
async function modelServer(t: TestContext) {
  const gguf = Buffer.concat([Buffer.from("GGUF"), Buffer.alloc(96, 7)]);
  const server = http.createServer((request, response) => {
    if (request.url === "/stall.gguf") {
      // Says 1000 bytes, sends 100, then nothing: the client must give up on its own.
      response.writeHead(200, { "content-length": "1000" });
      response.write(gguf);
      return;
    }
    if (request.url === "/page.gguf")
      return void response.writeHead(200, { "content-type": "text/html" }).end("<html>login</html>");
    response.writeHead(404).end("no such file");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  return `http://127.0.0.1:${(server.address() as net.AddressInfo).port}`;
}

test("models pull fails within seconds naming why, shows progress from the first byte and leaves nothing", async (t) => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-pull-"));
  t.after(() => fs.rmSync(dataDir, { recursive: true, force: true }));
  const base = await modelServer(t);
  const env = { CONDUIT_DATA_DIR: dataDir, CONDUIT_LOG_LEVEL: "silent", CONDUIT_PULL_TIMEOUT_MS: "1500" };
  const refused = `http://127.0.0.1:${await freePort()}/x.gguf`;
  const cases: [string, RegExp][] = [
    ["http://conduit-test.invalid/x.gguf", /cannot resolve host conduit-test\.invalid/],
    [refused, /connection was refused/],
    [`${base}/missing.gguf`, /HTTP 404 Not Found/],
    [`${base}/page.gguf`, /not a GGUF file \(it starts with "<htm"\)/],
    [
      `${base}/stall.gguf`,
      /no more bytes for 1500 ms \(after 100 bytes\); giving up \(CONDUIT_PULL_TIMEOUT_MS\)/,
    ],
  ];
  const outputs = new Map<string, string>();
  for (const [ref, reason] of cases) {
    const pulled = await conduit(env, "models", "pull", ref);
    assert.equal(pulled.code, 1, `${ref}: ${pulled.stderr}`);
    assert.match(pulled.stderr, new RegExp(`error: Could not download '${ref.replace(/[.?]/g, "\\$&")}': `));
    assert.match(pulled.stderr, reason, ref);
    outputs.set(ref, pulled.stderr);
  }
  // The stalled download showed its bytes as they came (a line at a time, stderr not being a terminal).
  assert.match(
    outputs.get(`${base}/stall.gguf`) ?? "",
    /100 B of 1000 B/,
    "progress shows the bytes that came",
  );
  const json = await conduit(env, "--json", "models", "pull", `${base}/missing.gguf`);
  assert.equal(json.code, 1);
  const error = JSON.parse(json.stderr) as { error: { code: string; exitCode: number; message: string } };
  assert.equal(error.error.code, "unavailable", "the string code, as the API would say it");
  assert.equal(error.error.exitCode, 1);
  assert.match(error.error.message, /HTTP 404/);

  // The hf: form says why too: the network error, or what Hugging Face answered about the repository.
  const hf = await conduit(env, "models", "pull", "hf:conduit-test/no-such-repo:Q4_K_M");
  assert.equal(hf.code, 1);
  assert.match(
    hf.stderr,
    /Could not download 'hf:conduit-test\/no-such-repo:Q4_K_M': (huggingface\.co: |no answer from |Hugging Face answers HTTP \d{3})/,
  );
  assert.deepEqual(fs.readdirSync(path.join(dataDir, "models")), [], "nothing is left behind");

  // The registry reports progress from the first chunk on.
  const registry = new ModelRegistry({ modelsDir: path.join(dataDir, "models") });
  const progress: PullProgress[] = [];
  await assert.rejects(
    registry.pull(`${base}/stall.gguf`, (p) => progress.push(p), { timeoutMs: 500, id: "stalled" }),
    (e: Error) => e instanceof ConduitError && e.code === "unavailable" && /no more bytes/.test(e.message),
  );
  assert.deepEqual(progress.at(-1), { downloadedBytes: 100, totalBytes: 1000 });
  assert.deepEqual(fs.readdirSync(path.join(dataDir, "models")), []);
});

test("interactive chat drops its oldest turns to fit the model's context, keeping the system prompt", async (t) => {
  const environment = await testEnv(t, "sqlite", { CONDUIT_CONTEXT_SIZE: "128" });
  const { app, core } = await buildTestApp(t, environment);
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  const env = { CONDUIT_DATA_DIR: environment.dataDir, CONDUIT_URL: url, CONDUIT_API_KEY: KEY_A };
  // Each question is about a third of the context: the third turn no longer fits with the first two.
  const question = (i: number) => `${i} ${"the cat and the dog was in the world ".repeat(8)}`.trim();
  const input = [1, 2, 3, 4, 5].map(question).join("\n") + "\n\n";
  const chat = await conduitWithInput(
    env,
    input,
    "--json",
    "chat",
    "--model",
    "tiny",
    "--system",
    "Be brief.",
    "--max-tokens",
    "4",
    "--temperature",
    "0",
  );
  assert.equal(chat.code, 0, chat.stderr);
  const answers = jsonLines<{ usage: { prompt_tokens: number } }>(chat.stdout);
  assert.equal(answers.length, 5, chat.stdout);
  assert.match(chat.stderr, /dropped the oldest turn/);
  const context = core.engine.loaded()[0]!.contextSize;
  for (const answer of answers) assert.ok(answer.usage.prompt_tokens < context);
  // The system prompt is kept: the first request (with it) is longer than the same question alone.
  const one = await conduitWithInput(
    env,
    `${question(1)}\n\n`,
    "--json",
    "chat",
    "--model",
    "tiny",
    "--max-tokens",
    "4",
    "--temperature",
    "0",
  );
  assert.ok(
    answers[0]!.usage.prompt_tokens >
      (JSON.parse(one.stdout.trim()) as { usage: { prompt_tokens: number } }).usage.prompt_tokens,
  );
});

test("runs watch: on a terminal a bar below the log with an ETA from the step rate; elsewhere the log alone", async (t) => {
  const { core, env } = await cliServer(t);
  const dataset = await onePairDataset(core);
  const run = await core.runs.create("alice", { datasetID: dataset.id, baseModelName: "tiny" });
  assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, run.id);
  await core.runRepository.appendLog(run.id, "epoch 1 of 3");
  // 4 of 10 steps in 8 s: 6 steps to go at 2 s a step.
  await core.runRepository.updateStats(run.id, "w", {
    step: 4,
    totalSteps: 10,
    elapsedSeconds: 8,
    trainLoss: 1.5,
  });
  await core.runRepository.appendLog(run.id, "cancelling now");
  await core.runs.cancel("alice", run.id);

  // Not a terminal: the log and the status on stdout, no bar anywhere.
  const piped = await conduit(env, "runs", "watch", run.id);
  assert.equal(piped.code, 1, "the run ended CANCELLED");
  assert.match(piped.stdout, /epoch 1 of 3\n.*cancelling now\n(.*\n)*status: CANCELLED\n$/);
  assert.doesNotMatch(piped.stdout + piped.stderr, /step 4\/10|ETA/);

  // A terminal (util-linux `script` gives the command one).
  const script = "/usr/bin/script";
  if (!fs.existsSync(script)) return t.skip(`${script} is missing: no terminal to test the bar on`);
  const command = [process.execPath, bin, "runs", "watch", run.id].map((a) => `'${a}'`).join(" ");
  const tty = await new Promise<string>((resolve) =>
    execFile(
      script,
      ["-qec", command, "/dev/null"],
      { env: { PATH: process.env.PATH ?? "", TERM: "xterm", ...env }, timeout: 120_000 },
      (_error, stdout) => resolve(stdout),
    ),
  );
  assert.match(tty, /step 4\/10 \[.*\] epoch -\/- loss 1\.5000 eval - - tok\/s ETA 12s/);
  // What a terminal shows of each line: the text after the last carriage return or erase-line, no escapes.
  const esc = String.fromCharCode(27);
  const shown = tty
    .replace(/\r\n/g, "\n")
    .split("\n")
    .map((line) => {
      const last = line.split(new RegExp(`\\r|${esc}\\[1G|${esc}\\[2K`)).at(-1) ?? "";
      return last.replace(new RegExp(`${esc}\\[[0-9;?]*[A-Za-z]`, "g"), "");
    });
  // The status came while the bar was up: it is printed above the bar, on a line of its own.
  assert.ok(shown.includes("status: CANCELLED"), JSON.stringify(shown));
  assert.ok(
    shown.some((line) => line.endsWith("cancelling now") && !line.includes("step")),
    JSON.stringify(shown),
  );
});

test("runs create, show and watch print the run's estimate: a prior, then measured on the runs before it", async (t) => {
  // No trainer: the test ends runs READY as a worker would.
  const { core, env } = await cliServer(t);
  const dataset = await onePairDataset(core);
  const create = () => runsCreate(env, dataset.id, ["--epochs", "2"]);

  // The id alone on stdout (for R=$(…)); the estimate on stderr.
  const first = await create();
  assert.equal(first.code, 0, first.stderr);
  const id = first.stdout.trim();
  assert.match(id, /^ft_\w+$/);
  assert.match(
    first.stderr,
    /^estimate: (a few seconds|about \d+ (s|min)) \(no earlier run to measure: a prior/m,
  );
  const shown = await conduit(env, "runs", "show", id);
  assert.match(shown.stdout, /^estimate: .* \(no earlier run to measure/m);

  assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, id);
  const final = { trainTokens: 512, trainSeconds: 100, elapsedSeconds: 161 };
  assert.ok(await core.runRepository.updateStats(id, "w", { final: final as never }));
  assert.ok(await core.runRepository.finish(id, "w", { status: "READY", modelPath: "/m.gguf" }));
  const ready = await conduit(env, "runs", "show", id);
  assert.match(ready.stdout, /^estimate: took 2m41s \(estimated .+\)$/m);
  // config and stats as aligned key: value lines, nested objects indented under their key.
  assert.match(ready.stdout, /^config:\n {2}\w+: +\S/m);
  assert.match(ready.stdout, /^ {2}baseModelName: +tiny$/m);
  assert.match(ready.stdout, /^ {2}epochs: +2$/m);
  assert.match(ready.stdout, /^stats:\n(?: {2}\w+: *.*\n)*? {2}final:\n {4}trainTokens: +512$/m);
  assert.doesNotMatch(ready.stdout, /^(config|stats) \{/m, "not one-line JSON");
  const configLines = ready.stdout.split("\n").filter((line) => /^ {2}\w+: /.test(line));
  const column = (line: string) => line.length - line.slice(2).replace(/^\w+: +/, "").length;
  assert.ok(configLines.length > 5, ready.stdout);
  assert.equal(new Set(configLines.slice(0, 5).map(column)).size, 1, `values aligned:\n${ready.stdout}`);
  // --json is the API's run, unchanged.
  const shownJson = JSON.parse((await conduit(env, "--json", "runs", "show", id)).stdout);
  assert.equal(shownJson.config.baseModelName, "tiny");
  assert.equal(shownJson.stats.final.trainTokens, 512);
  const watched = await conduit(env, "runs", "watch", id);
  assert.equal(watched.code, 0, watched.stderr);
  assert.equal(watched.stdout.match(/^estimate: took 2m41s/gm)?.length, 1, watched.stdout);

  // 512 tokens in 100 s and 61 s around them: the next run of tiny is measured on it.
  const second = await create();
  assert.equal(second.code, 0, second.stderr);
  assert.match(second.stderr, /^estimate: about \d+ min \(measured on 1 earlier run\)$/m);
  const json = await conduit(env, "--json", "runs", "create", "--dataset", dataset.id, "--model", "tiny");
  assert.equal(json.stderr, "", "--json prints the run, estimate included, and nothing else");
  assert.equal((JSON.parse(json.stdout) as { estimate: { basis: string } }).estimate.basis, "measured");
});

test("runs show prints the run's before/after evaluation once it has one, as its log words it", async (t) => {
  // No trainer and no eval runner: the test ends the run READY and scores its eval as they would.
  const { core, env } = await cliServer(t);
  const dataset = await onePairDataset(core);
  const created = await runsCreate(env, dataset.id, ["--epochs", "2"]);
  assert.equal(created.code, 0, created.stderr);
  const id = created.stdout.trim();
  assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, id);
  assert.ok(await core.runRepository.finish(id, "w", { status: "READY", modelPath: "/m.gguf" }));
  const before = await conduit(env, "runs", "show", id);
  assert.equal(before.code, 0, before.stderr);
  assert.doesNotMatch(before.stdout, /^evaluation: /m, "no evaluation yet");

  const evals = new EvalRepository(core.db.kysely);
  const graders: EvalGrader[] = [
    { name: "exact_match", type: "exact_match", normalize: [] },
    { name: "similarity", type: "similarity", metric: "token_f1", passThreshold: 0.8 },
  ];
  await evals.create({
    id: "eval_cli",
    userId: "alice",
    name: "before/after",
    config: { graders, source: null, systemPrompt: "" },
    runId: id,
  });
  await evals.createRun({
    id: "evalrun_cli",
    evalId: "eval_cli",
    userId: "alice",
    name: "before/after",
    models: ["tiny", id],
    items: Array.from({ length: 20 }, (_, i) => ({
      messages: [{ role: "user", content: `q${i}` }],
      expected: "a",
    })),
    config: { graders, systemPrompt: "", maxTokens: 16, parallel: 8 },
    progress: { completed: 0, total: 40, model: null },
  });
  const queued = await conduit(env, "runs", "show", id);
  assert.match(queued.stdout, /^evaluation: 20 held-out pairs: queued$/m);

  assert.equal((await evals.claimNext())?.id, "evalrun_cli");
  assert.ok(
    await evals.finish("evalrun_cli", {
      status: "COMPLETED",
      progress: { completed: 40, total: 40, model: null },
      results: [beforeAfterTotals("tiny", 0, 0.05), beforeAfterTotals(id, 20, 0.98)],
    }),
  );
  const shown = await conduit(env, "runs", "show", id);
  assert.equal(shown.code, 0, shown.stderr);
  assert.match(
    shown.stdout,
    /^evaluation: base 0\/20 → fine-tune 20\/20 exact match \(similarity 0\.05 → 0\.98\): improved$/m,
  );
  // --json is the API's run: the same evaluation, also in the run list.
  const json = JSON.parse((await conduit(env, "--json", "runs", "show", id)).stdout);
  assert.equal(json.evaluation.evalId, "eval_cli");
  assert.equal(json.evaluation.improved, true);
  const listed = JSON.parse((await conduit(env, "--json", "runs", "list")).stdout);
  assert.deepEqual(listed[0].evaluation, json.evaluation);
});

test("the runs watch ETA follows the step rate it sees, else the run's own", () => {
  const eta = new EtaEstimate();
  assert.equal(eta.update({ step: 0, totalSteps: 10 }, 0), undefined, "no rate yet");
  const watch = new EtaEstimate();
  // First seen at step 2 after 100 s: the run's own rate, 50 s a step, for the 8 steps left.
  assert.equal(watch.update({ step: 2, totalSteps: 10, elapsedSeconds: 100 }, 1_000), 400);
  // Then 4 steps in 4 s: the pace seen counts, not the run's slow start.
  assert.equal(watch.update({ step: 6, totalSteps: 10, elapsedSeconds: 104 }, 5_000), 4);
  const replay = new EtaEstimate();
  assert.equal(replay.update({ step: 4, totalSteps: 10, elapsedSeconds: 8 }, 0), 12, "the run's own rate");
});

test("a first start on a port in use makes no key (none to lose); the next start on a free port does", async (t) => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-busy-"));
  t.after(() => fs.rmSync(dataDir, { recursive: true, force: true }));
  const blocker = net.createServer();
  await new Promise<void>((resolve) => blocker.listen(0, "127.0.0.1", resolve));
  t.after(() => blocker.close());
  const busyPort = (blocker.address() as net.AddressInfo).port;
  const env = { CONDUIT_DATA_DIR: dataDir, CONDUIT_PORT: String(busyPort), CONDUIT_TRAINER: "llama.cpp" };
  const busy = await conduit(env, "serve");
  assert.equal(busy.code, 2, busy.stdout + busy.stderr);
  assert.match(busy.stderr, /is in use.*CONDUIT_PORT/);
  assert.doesNotMatch(busy.stdout + busy.stderr, /cnd_|not shown again/);
  // No key was made: the key list of a fresh database is still empty.
  const keys = await conduit({ CONDUIT_DATA_DIR: dataDir }, "--json", "keys", "list");
  assert.equal(keys.code, 0, keys.stderr);
  assert.deepEqual(JSON.parse(keys.stdout), []);
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const started = await serve(t, { ...env, CONDUIT_PORT: String(port) }, url);
  for (let i = 0; i < 50 && !/cnd_/.test(started.output()); i++)
    await new Promise((resolve) => setTimeout(resolve, 100));
  assert.match(started.output(), /not shown again[\s\S]*cnd_/);
  await started.stop();
});

test("runs create sends a DPO run's method, beta and the run it continues", async (t) => {
  // The test server's trainer is llama.cpp, which refuses preference tuning, naming the method: the options arrived.
  const { core, env } = await cliServer(t);
  const dataset = await core.datasets.create("alice", "preferences");
  await core.datasets.upload("alice", dataset.id, {
    name: "p.jsonl",
    source: Readable.from([JSON.stringify({ input: "Hi", preferred: "Hello!", non_preferred: "No." })]),
  });
  const help = await conduit(env, "runs", "create", "--help");
  for (const option of ["--beta", "--from-run"])
    assert.match(help.stdout, new RegExp(`${option}\\b`), option);
  const refused = await runsCreate(env, dataset.id, ["--method", "dpo", "--beta", "0.5"]);
  assert.notEqual(refused.code, 0);
  assert.match(refused.stderr, /llama\.cpp trainer cannot do preference tuning/);
  const missing = await runsCreate(env, dataset.id, ["--method", "dpo", "--from-run", "ft_missing"]);
  assert.notEqual(missing.code, 0);
  assert.match(missing.stderr, /run ft_missing not found/);
  const stray = await runsCreate(env, dataset.id, ["--beta", "0.5"]);
  assert.match(stray.stderr, /"beta" is a preference-tuning setting; it needs "method": "dpo"/);
});

test("runs create sends the run's judge model; one that does not exist is refused by name", async (t) => {
  const { core, env } = await cliServer(t);
  const dataset = await onePairDataset(core);
  const missing = await runsCreate(env, dataset.id, ["--judge-model", "no-such-model"]);
  assert.notEqual(missing.code, 0);
  assert.match(missing.stderr, /judge model "no-such-model" not found/);
  const judged = await runsCreate(env, dataset.id, ["--judge-model", "tiny"]);
  assert.equal(judged.code, 0, judged.stderr);
  assert.equal((await core.runRepository.getById(judged.stdout.trim()))?.config.judgeModel, "tiny");
});
