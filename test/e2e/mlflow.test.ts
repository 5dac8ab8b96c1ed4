import assert from "node:assert/strict";
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { after, before, describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { describeConfig, loadConfig } from "../../src/config.ts";
import { asAlice, backends, buildTestApp, datasetOf, startRun, testEnv } from "../lib/helper.ts";
import { getRun, runEnded, waitForRun } from "../lib/helper.ts";
import { freePort, until } from "../lib/wait.ts";
import { parseTimestamp } from "../../src/domain/time.ts";

/**
 * Runs mirrored to a real MLflow tracking server (`pip install mlflow`; `.ci/run` puts it in
 * `.cache/mlflow-venv`). Skipped, saying why, when no `mlflow` can be found or started.
 */

const repoRoot = path.resolve(import.meta.dirname, "../..");

// The server of these tests is not in UTC: MLflow's start times must still be the runs' creation times.
process.env.TZ = "America/Los_Angeles";

interface MlflowCommand {
  command: string;
  args: string[];
}

/** `CONDUIT_TEST_MLFLOW` (the `mlflow` executable), the venv of `.ci/run`, `mlflow` on PATH, or `python3 -m mlflow`. */
function findMlflow(): MlflowCommand | string {
  const candidates: MlflowCommand[] = [];
  if (process.env.CONDUIT_TEST_MLFLOW)
    candidates.push({ command: process.env.CONDUIT_TEST_MLFLOW, args: [] });
  const venv = path.join(repoRoot, ".cache", "mlflow-venv", "bin", "mlflow");
  if (fs.existsSync(venv)) candidates.push({ command: venv, args: [] });
  candidates.push({ command: "mlflow", args: [] }, { command: "python3", args: ["-m", "mlflow"] });
  const tried: string[] = [];
  for (const candidate of candidates) {
    const result = spawnSync(candidate.command, [...candidate.args, "--version"], {
      encoding: "utf8",
      timeout: 120_000,
      env: { ...process.env, MLFLOW_DISABLE_TELEMETRY: "true" },
    });
    if (result.status === 0) return candidate;
    tried.push(
      `${[candidate.command, ...candidate.args].join(" ")}: ${(result.error?.message ?? result.stderr).trim().split("\n").at(-1)}`,
    );
  }
  return `no mlflow found (set CONDUIT_TEST_MLFLOW, or pip install mlflow); tried ${tried.join("; ")}`;
}

interface MlflowServer {
  uri: string;
  child: ChildProcess;
  exited: Promise<void>;
  stop(): Promise<void>;
}

/** `mlflow server` on a SQLite file and a free port, up once `/health` answers; a string says why not. */
async function startMlflow(dir: string): Promise<MlflowServer | string> {
  const found = findMlflow();
  if (typeof found === "string") return found;
  const port = await freePort();
  const logFile = path.join(dir, "server.log");
  const out = fs.openSync(logFile, "w");
  const child = spawn(
    found.command,
    [
      ...found.args,
      "server",
      "--backend-store-uri",
      `sqlite:///${path.join(dir, "mlflow.db")}`,
      "--default-artifact-root",
      `file://${path.join(dir, "artifacts")}`,
      "--artifacts-destination",
      path.join(dir, "artifacts"),
      "--host",
      "127.0.0.1",
      "--port",
      String(port),
      "--workers",
      "1",
    ],
    // Its own process group: stopping it stops its workers too.
    {
      cwd: dir,
      detached: true,
      stdio: ["ignore", out, out],
      // No background job runners (trace jobs): the tests need the tracking API only. No telemetry.
      env: { ...process.env, MLFLOW_SERVER_ENABLE_JOB_EXECUTION: "false", MLFLOW_DISABLE_TELEMETRY: "true" },
    },
  );
  fs.closeSync(out);
  let exitedEarly = false;
  const exited = new Promise<void>((resolve) =>
    child.once("exit", () => {
      exitedEarly = true;
      resolve();
    }),
  );
  const stop = async () => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const group = -(child.pid ?? 0);
    try {
      process.kill(group, "SIGTERM");
    } catch {
      return;
    }
    const killer = setTimeout(() => {
      try {
        process.kill(group, "SIGKILL");
      } catch {
        // Already gone.
      }
    }, 15_000);
    await exited;
    clearTimeout(killer);
  };
  const uri = `http://127.0.0.1:${port}`;
  // A fresh database takes MLflow tens of seconds to set up on a slow machine.
  const deadline = Date.now() + 300_000;
  while (Date.now() < deadline && !exitedEarly) {
    const healthy = await fetch(`${uri}/health`)
      .then((response) => response.ok)
      .catch(() => false);
    if (healthy) return { uri, child, exited, stop };
    await new Promise((resolve) => setTimeout(resolve, 500));
  }
  await stop();
  const tail = fs.readFileSync(logFile, "utf8").trim().split("\n").slice(-5).join(" | ");
  return `mlflow server did not start (${exitedEarly ? "it exited" : "no /health in 300 s"}): ${tail}`;
}

let server: MlflowServer | string = "not started";
const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-mlflow-"));

before(async () => {
  server = await startMlflow(dir);
  if (typeof server === "string") console.log(`# MLflow tests skipped: ${server}`);
});

after(async () => {
  if (typeof server !== "string") await server.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

/** A call of MLflow's REST API; fails the test on an error answer. */
async function mlflow<T = Record<string, unknown>>(
  uri: string,
  pathAndQuery: string,
  body?: unknown,
): Promise<T> {
  const response = await fetch(`${uri}/api/2.0/mlflow/${pathAndQuery}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { "content-type": "application/json" },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const text = await response.text();
  assert.ok(response.ok, `${pathAndQuery}: ${response.status} ${text}`);
  return JSON.parse(text) as T;
}

interface MlflowRun {
  info: { run_id: string; experiment_id: string; status: string; start_time: number; end_time?: number };
  data: {
    params?: { key: string; value: string }[];
    tags?: { key: string; value: string }[];
    metrics?: { key: string; value: number; step: number }[];
  };
}

async function mlflowRun(uri: string, runId: string): Promise<MlflowRun> {
  return (await mlflow<{ run: MlflowRun }>(uri, `runs/get?run_id=${runId}`)).run;
}

async function history(uri: string, runId: string, key: string): Promise<{ value: number; step: number }[]> {
  const answer = await mlflow<{ metrics?: { value: number; step: number }[] }>(
    uri,
    `metrics/get-history?run_id=${runId}&metric_key=${key}&max_results=25000`,
  );
  return answer.metrics ?? [];
}

const pairs = ["apple", "river", "stone", "cloud"].map((word, i) => ({
  input: `${word} ${i}`,
  output: `${i} ${word}`,
}));

/** A run on `pairs` with small fixed settings (no "auto": the runs stay short). */
async function startSmallRun(app: FastifyInstance, body: Record<string, unknown>): Promise<string> {
  return startRun(app, { datasetID: await datasetOf(app, pairs, "mlflow"), lr: 0.001, loraRank: 4, ...body });
}

/** How the tests wait for MLflow and for runs: MLflow answers slowly, and a run trains for minutes. */
const slow = { timeoutMs: 120_000, intervalMs: 200 };
const tracking = { flushIntervalMs: 200 };
const scheduler = { pollMs: 200, concurrency: 1 };

/** The MLflow run in a run's trackerURL. */
function refOf(uri: string, trackerURL: string): { experimentId: string; runId: string } {
  const match = trackerURL.match(/^(.*)\/#\/experiments\/([^/]+)\/runs\/([0-9a-f]+)$/);
  assert.ok(match, `trackerURL ${trackerURL} is an MLflow run page`);
  assert.equal(match[1], uri);
  return { experimentId: match[2] as string, runId: match[3] as string };
}

test("MLflow settings: an http(s) URL without credentials; the token and password are masked in the logged config", () => {
  assert.equal(loadConfig({}).mlflowTrackingUri, undefined);
  assert.equal(loadConfig({}).mlflowExperiment, "conduit");
  assert.equal(
    loadConfig({ CONDUIT_MLFLOW_TRACKING_URI: "https://mlflow.example:5000/" }).mlflowTrackingUri,
    "https://mlflow.example:5000",
  );
  assert.throws(() => loadConfig({ CONDUIT_MLFLOW_TRACKING_URI: "mlflow.example:5000" }), /http\(s\) URL/);
  assert.throws(
    () => loadConfig({ CONDUIT_MLFLOW_TRACKING_URI: "http://me:secret@mlflow.example" }),
    /MLFLOW_TRACKING_USERNAME/,
  );
  const logged = JSON.stringify(
    describeConfig(
      loadConfig({
        CONDUIT_MLFLOW_TRACKING_URI: "http://mlflow.example",
        MLFLOW_TRACKING_TOKEN: "token-0123456789",
        MLFLOW_TRACKING_USERNAME: "me",
        MLFLOW_TRACKING_PASSWORD: "password-0123456789",
      }),
    ),
  );
  assert.ok(!logged.includes("token-0123456789") && !logged.includes("password-0123456789"), logged);
  assert.ok(logged.includes('"mlflowTrackingUsername":"me"'), logged);
});

describe("runs mirrored to MLflow", () => {
  for (const backend of backends())
    test(`params, tags, metrics and the final status land in MLflow; a restart keeps one MLflow run (${backend})`, async (t) => {
      if (typeof server === "string") return t.skip(server);
      const { uri } = server;
      const env = await testEnv(t, backend, { CONDUIT_MLFLOW_TRACKING_URI: uri });
      const project = `conduit-test-${backend}-${process.pid}`;

      // Created by a server that stops before training it: the MLflow run is made at creation.
      const first = (await buildTestApp(t, env, { tracking })).app;
      const datasetID = await datasetOf(first, pairs, "mlflow");
      // A validation file of its own, so that there is an eval loss.
      const validation = await first.inject({
        method: "POST",
        url: `/conduit/dataset/${datasetID}/upload`,
        headers: asAlice,
        payload: { name: "v.jsonl", ioPairs: pairs.slice(0, 2) },
      });
      assert.equal(validation.statusCode, 200, validation.body);
      const id = await startRun(first, {
        lr: 0.001,
        loraRank: 4,
        datasetID,
        validationFileID: validation.json().id,
        epochs: 3,
        trackerProject: project,
        trackerEntity: "team-a",
      });
      const created = await until(
        "the MLflow run",
        () => getRun(first, id),
        (run) => run.trackerURL.startsWith(uri),
        slow,
      );
      const ref = refOf(uri, created.trackerURL);
      await first.close();

      const { app: second, core } = await buildTestApp(t, env, { tracking, scheduler });
      core.scheduler.start();
      const run = await waitForRun(second, id, runEnded, { timeoutMs: 240_000 });
      assert.equal(run.status, "READY", run.logs.join("\n"));
      assert.equal(run.trackerURL, created.trackerURL);

      const finished = await until(
        "the final status in MLflow",
        () => mlflowRun(uri, ref.runId),
        (r) => r.info.status !== "RUNNING",
        slow,
      );
      assert.equal(finished.info.status, "FINISHED");
      assert.ok(finished.info.end_time && finished.info.end_time > 0);
      assert.equal(finished.info.start_time, parseTimestamp(run.createdAt), "the run's creation, in UTC");

      const experiment = await mlflow<{ experiment: { name: string } }>(
        uri,
        `experiments/get?experiment_id=${ref.experimentId}`,
      );
      assert.equal(experiment.experiment.name, project);
      const tags = Object.fromEntries((finished.data.tags ?? []).map((tag) => [tag.key, tag.value]));
      assert.equal(tags["conduit.runId"], id);
      assert.equal(tags["conduit.trackerEntity"], "team-a");
      assert.equal(tags["mlflow.runName"], run.config.name);

      // Every config field is a param: strings as they are, the rest as JSON.
      const params = Object.fromEntries(
        (finished.data.params ?? []).map((param) => [param.key, param.value]),
      );
      assert.deepEqual(Object.keys(params).sort(), Object.keys(run.config).sort());
      assert.equal(params.baseModelName, "tiny");
      assert.equal(params.trackerProject, project);
      assert.equal(Number(params.lr), run.config.lr);
      assert.equal(params.epochs, "3");
      assert.equal(params.method, "lora");

      // One train_loss point per optimizer step, the last one as the run's stats say.
      const trainLoss = await history(uri, ref.runId, "train_loss");
      const steps = new Set(trainLoss.map((point) => point.step));
      assert.equal(run.stats.totalSteps, run.stats.step);
      assert.deepEqual(
        [...steps].sort((a, b) => a - b),
        Array.from({ length: run.stats.totalSteps }, (_, i) => i + 1),
      );
      const last = trainLoss.find((point) => point.step === run.stats.step);
      assert.ok(
        last && Math.abs(last.value - run.stats.trainLoss) < 1e-6,
        JSON.stringify({ last, stats: run.stats }),
      );
      for (const key of ["learning_rate", "tokens_per_second", "epoch"])
        assert.equal((await history(uri, ref.runId, key)).length, trainLoss.length, key);
      const evalLoss = await history(uri, ref.runId, "eval_loss");
      assert.ok(run.stats.evalLossSeries.length > 0);
      assert.deepEqual(
        evalLoss.map((point) => point.step),
        run.stats.evalLossSeries.map((point: { step: number }) => point.step),
      );
      assert.ok(
        evalLoss.every((point, i) => Math.abs(point.value - run.stats.evalLossSeries[i].evalLoss) < 1e-6),
        JSON.stringify({ evalLoss, series: run.stats.evalLossSeries }),
      );

      // The restart logged to the same MLflow run: the experiment holds exactly one for this run.
      const search = await mlflow<{ runs?: MlflowRun[] }>(uri, "runs/search", {
        experiment_ids: [ref.experimentId],
        filter: `tags.\`conduit.runId\` = '${id}'`,
      });
      assert.deepEqual(
        (search.runs ?? []).map((r) => r.info.run_id),
        [ref.runId],
      );
      assert.equal(
        run.logs.filter((line) => line.includes("mirrored to MLflow run")).length,
        1,
        run.logs.join("\n"),
      );

      // trackerURL opens the MLflow UI (the part after # is the UI's own route).
      const page = await fetch(run.trackerURL);
      assert.equal(page.status, 200);
      assert.match(await page.text(), /<html/i);
    });

  test("more metric points than one call takes go in several; a long param is cut to MLflow's 6000 characters", async (t) => {
    if (typeof server === "string") return t.skip(server);
    const { uri } = server;
    const env = await testEnv(t, "sqlite", { CONDUIT_MLFLOW_TRACKING_URI: uri });
    const { app, core } = await buildTestApp(t, env, { tracking });
    const systemPrompt = "You answer in one word. ".repeat(300);
    const id = await startSmallRun(app, { epochs: 1, systemPrompt });
    const created = await until(
      "the MLflow run",
      () => getRun(app, id),
      (run) => run.trackerURL.startsWith(uri),
      slow,
    );
    const ref = refOf(uri, created.trackerURL);
    // 300 progress reports at once, as a trainer far ahead of MLflow would send them: 1,500
    // points queued, more than the 1,000 one call may carry.
    for (let step = 1; step <= 300; step++)
      core.runEvents.emit("progress", id, {
        step,
        totalSteps: 300,
        epoch: 1,
        epochs: 1,
        trainLoss: 5 - step / 100,
        evalLoss: 6 - step / 100,
        learningRate: 0.001,
        tokensPerSecond: 1000 + step,
        elapsedSeconds: step,
        etaSeconds: 300 - step,
      });
    for (const key of ["train_loss", "eval_loss", "learning_rate", "tokens_per_second", "epoch"])
      await until(
        `300 ${key} points`,
        () => history(uri, ref.runId, key),
        (points) => points.length === 300,
        slow,
      );
    const logs = (await getRun(app, id)).logs;
    assert.ok(!logs.some((line) => line.includes("not delivered")), logs.join("\n"));
    const params = (await mlflowRun(uri, ref.runId)).data.params ?? [];
    assert.equal(systemPrompt.length > 6000, true);
    assert.equal(params.find((param) => param.key === "systemPrompt")?.value, systemPrompt.slice(0, 6000));
  });

  test("a cancelled run is KILLED in MLflow, in the default experiment", async (t) => {
    if (typeof server === "string") return t.skip(server);
    const { uri } = server;
    const experimentName = `conduit-default-${process.pid}`;
    const env = await testEnv(t, "sqlite", {
      CONDUIT_MLFLOW_TRACKING_URI: uri,
      CONDUIT_MLFLOW_EXPERIMENT: experimentName,
    });
    const { app, core } = await buildTestApp(t, env, { tracking, scheduler });
    core.scheduler.start();
    const id = await startSmallRun(app, { epochs: 1000 });
    const running = await until(
      "the run to train",
      () => getRun(app, id),
      (run) => run.status === "RUNNING" && run.stats.step > 0 && run.trackerURL.startsWith(uri),
      slow,
    );
    const ref = refOf(uri, running.trackerURL);
    const cancel = await app.inject({
      method: "POST",
      url: `/conduit/finetuning/${id}/cancel`,
      headers: asAlice,
    });
    assert.equal(cancel.statusCode, 200, cancel.body);
    const killed = await until(
      "the final status in MLflow",
      () => mlflowRun(uri, ref.runId),
      (r) => r.info.status !== "RUNNING",
      slow,
    );
    assert.equal(killed.info.status, "KILLED");
    const experiment = await mlflow<{ experiment: { name: string } }>(
      uri,
      `experiments/get?experiment_id=${ref.experimentId}`,
    );
    assert.equal(experiment.experiment.name, experimentName);
  });

  test("an experiment deleted in MLflow refuses the run: it still ends READY and its log says so, once", async (t) => {
    if (typeof server === "string") return t.skip(server);
    const { uri } = server;
    const project = `conduit-deleted-${process.pid}`;
    const { experiment_id } = await mlflow<{ experiment_id: string }>(uri, "experiments/create", {
      name: project,
    });
    await mlflow(uri, "experiments/delete", { experiment_id });
    const env = await testEnv(t, "sqlite", { CONDUIT_MLFLOW_TRACKING_URI: uri });
    const { app, core } = await buildTestApp(t, env, { tracking, scheduler });
    core.scheduler.start();
    const id = await startSmallRun(app, { epochs: 2, trackerProject: project });
    const run = await waitForRun(app, id, runEnded, { timeoutMs: 240_000 });
    assert.equal(run.status, "READY", run.logs.join("\n"));
    assert.match(run.trackerURL, new RegExp(`/ui/runs/${id}$`), "trackerURL stays the dashboard page");
    const report = run.logs.filter((line) => line.includes("MLflow tracking: not delivered"));
    assert.equal(report.length, 1, run.logs.join("\n"));
    assert.ok(report[0]?.includes(`experiment "${project}" is deleted in MLflow`), report[0]);
    assert.ok(report[0]?.includes("nothing more of this run is sent"), report[0]);
  });

  // Last: it stops the server.
  test("MLflow stopped mid-run: the run still ends READY and its log says what was not delivered", async (t) => {
    if (typeof server === "string") return t.skip(server);
    const { uri } = server;
    const env = await testEnv(t, "sqlite", { CONDUIT_MLFLOW_TRACKING_URI: uri });
    const { app, core } = await buildTestApp(t, env, {
      tracking: { ...tracking, maxAttempts: 3, retryDelayMs: 100 },
      scheduler,
    });
    core.scheduler.start();
    // Long enough to go on training for a while after MLflow has stopped (0.1 s a step here).
    const id = await startSmallRun(app, { epochs: 200 });
    const running = await until(
      "the run to train",
      () => getRun(app, id),
      (run) => run.status === "RUNNING" && run.trackerURL.startsWith(uri),
      slow,
    );
    const ref = refOf(uri, running.trackerURL);
    await until(
      "metrics in MLflow",
      () => history(uri, ref.runId, "train_loss"),
      (points) => points.length > 0,
      slow,
    );
    await server.stop();
    const stopped = await getRun(app, id);
    assert.equal(
      stopped.status,
      "RUNNING",
      "the run must still be training when MLflow stops (give it more epochs)",
    );

    const run = await until(
      "the run to end and report",
      () => getRun(app, id),
      (r) => runEnded(r) && r.logs.some((line) => line.includes("final status")),
      { timeoutMs: 600_000, intervalMs: 200 },
    );
    assert.equal(run.status, "READY", run.logs.join("\n"));
    const report = run.logs.filter((line) => line.includes("MLflow tracking: not delivered"));
    assert.ok(report.length > 0, run.logs.join("\n"));
    assert.ok(
      report.some((line) => /\d+ metric points \(steps? \d+/.test(line)),
      `the points are counted: ${report.join("\n")}`,
    );
    assert.ok(
      report.some((line) => line.includes("the final status FINISHED") && line.includes("after 3 tries")),
      report.join("\n"),
    );
    t.diagnostic(report.join("\n"));
  });
});
