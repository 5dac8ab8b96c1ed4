import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { as, backends, build, buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";
import { type RunEstimate } from "../../src/contract/estimate.ts";
import type { Core } from "../../src/core.ts";

// A run's estimated duration through the API: planned at creation, refined while it trains, the actual time once
// READY; on the Conduit API and the OpenAI face (the planning itself: unit/estimate.test.ts; the CLI: e2e/cli.test.ts).

async function datasetWithPairs(app: FastifyInstance, pairs = 12) {
  const ds = (await as(app, KEY_A).post("/conduit/dataset", { name: "d" })).json() as { id: string };
  const res = await as(app, KEY_A).post(`/conduit/dataset/${ds.id}/upload`, {
    name: "a.jsonl",
    ioPairs: Array.from({ length: pairs }, (_, i) => ({ input: `question ${i}`, output: `answer ${i}` })),
  });
  assert.equal(res.statusCode, 200, res.body);
  return ds;
}

type RunBody = {
  id: string;
  status: string;
  updatedAt: string;
  estimate: RunEstimate | null;
  stats: Record<string, unknown>;
};

async function createRun(app: FastifyInstance, body: Record<string, unknown>): Promise<RunBody> {
  const res = await as(app, KEY_A).post("/conduit/finetuning", body);
  assert.equal(res.statusCode, 200, res.body);
  return res.json();
}

/** Ends a run READY as a worker would, with the trainer's totals. */
async function finishRun(core: Core, id: string, final: Record<string, unknown>) {
  assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, id);
  assert.ok(await core.runRepository.updateStats(id, "w", { final: final as never }));
  assert.ok(await core.runRepository.finish(id, "w", { status: "READY", modelPath: "/m.gguf" }));
}

for (const backend of backends()) {
  describe(`run estimates (${backend})`, () => {
    test("a run has an estimate from creation, on both faces; measured once a run of its trainer, model and method is READY", async (t) => {
      const env = await testEnv(t, backend);
      fs.copyFileSync(
        path.join(env.dataDir, "models", "tiny.gguf"),
        path.join(env.dataDir, "models", "other.gguf"),
      );
      const { app, core } = await buildTestApp(t, env);
      const ds = await datasetWithPairs(app);

      const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 2 });
      const estimate = run.estimate;
      assert.ok(estimate, "a new run has an estimate");
      assert.equal(estimate.basis, "prior");
      assert.equal(estimate.measuredRuns, 0);
      assert.ok(estimate.seconds > 0 && estimate.remainingSeconds === estimate.seconds);
      assert.equal(estimate.finishAt, null, "its seconds count from its start");
      assert.equal(estimate.planned?.basis, "prior");
      assert.ok(estimate.planned!.steps >= 2, "two epochs of a window or more");
      assert.equal(estimate.planned?.windowSize, 256, "short pairs: the shortest window");
      assert.deepEqual(run.stats, {}, "a queued run has no stats: the estimate is beside them");
      const read = (await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).json() as RunBody;
      assert.deepEqual(read.estimate?.planned, estimate.planned);
      const [listed] = (await as(app, KEY_A).get("/conduit/finetuning")).json() as RunBody[];
      assert.equal(listed?.estimate?.basis, "prior", "summaries have it too");

      // The OpenAI face: the job's estimated_finish is the estimate's, from creation.
      const before = Math.floor(Date.now() / 1000);
      const job = (await as(app, KEY_A).get(`/v1/fine_tuning/jobs/${run.id}`)).json();
      assert.equal(job.status, "queued");
      assert.ok(Number.isInteger(job.estimated_finish));
      assert.ok(job.estimated_finish >= before + Math.floor(estimate.seconds), "from now");

      await finishRun(core, run.id, {
        steps: 2,
        trainTokens: 512,
        sampleTokens: 200,
        trainSeconds: 4,
        elapsedSeconds: 5,
        resumedFromStep: 0,
        stoppedEarly: false,
      });
      const ready = (await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).json() as RunBody;
      assert.deepEqual(
        [ready.estimate?.basis, ready.estimate?.seconds, ready.estimate?.finishAt],
        ["final", 5, null],
      );
      assert.deepEqual(ready.estimate?.planned, estimate.planned, "what was planned stays");
      assert.equal(
        (await as(app, KEY_A).get(`/v1/fine_tuning/jobs/${run.id}`)).json().estimated_finish,
        null,
      );

      const next = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 2 });
      assert.equal(next.estimate?.basis, "measured");
      assert.equal(next.estimate?.measuredRuns, 1);
      assert.equal(next.estimate?.planned?.tokensPerSecond, 128, "512 tokens in 4 s");
      assert.equal(next.estimate?.planned?.overheadSeconds, 1);
      // Another model, another method or another trainer: nothing measured yet.
      const other = await createRun(app, { datasetID: ds.id, baseModelName: "other", epochs: 2 });
      assert.equal(other.estimate?.basis, "prior");
      const full = await createRun(app, {
        datasetID: ds.id,
        baseModelName: "tiny",
        epochs: 2,
        method: "full",
      });
      assert.equal(full.estimate?.basis, "prior");

      // A job created on the OpenAI face has one too.
      const created = await as(app, KEY_A).post("/v1/fine_tuning/jobs", {
        model: "tiny",
        training_file: (await core.datasets.listFiles("alice", ds.id, { limit: 1, offset: 0 }))[0]!.id,
      });
      assert.equal(created.statusCode, 200, created.body);
      assert.ok(created.json().estimated_finish >= created.json().created_at);
      const conduitView = (
        await as(app, KEY_A).get(`/conduit/finetuning/${created.json().id}`)
      ).json() as RunBody;
      assert.equal(conduitView.estimate?.basis, "measured");
    });

    test("while it trains, the estimate is the trainer's pace; re-queued, the plan again", async (t) => {
      const { app, core } = await build(t, backend);
      const ds = await datasetWithPairs(app);
      const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 2 });
      assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, run.id);
      assert.ok(
        await core.runRepository.updateStats(run.id, "w", {
          step: 3,
          totalSteps: 10,
          elapsedSeconds: 30,
          etaSeconds: 700,
        }),
      );
      const running = (await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).json() as RunBody;
      assert.equal(running.estimate?.basis, "training");
      assert.equal(running.estimate?.seconds, 730);
      assert.equal(running.estimate?.remainingSeconds, 700);
      const updatedAt = Date.parse(`${running.updatedAt.replace(" ", "T")}Z`);
      assert.equal(
        running.estimate?.finishAt,
        new Date(updatedAt + 700_000).toISOString().replace("T", " ").slice(0, 23),
      );
      assert.deepEqual(running.estimate?.planned, run.estimate?.planned);
      const job = (await as(app, KEY_A).get(`/v1/fine_tuning/jobs/${run.id}`)).json();
      assert.equal(job.status, "running");
      assert.equal(
        job.estimated_finish,
        Math.floor((updatedAt + 700_000) / 1000),
        "700 s after the stats were written",
      );

      assert.ok(await core.runRepository.release(run.id, "w"));
      const requeued = (await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).json() as RunBody;
      assert.equal(requeued.estimate?.basis, "prior");
    });
  });
}

test("a run trained on the tiny model: its estimate from creation to READY, and the next one measured on it", async (t) => {
  const { app, core } = await build(t, "sqlite", { scheduler: { pollMs: 200, concurrency: 1 } });
  const ds = await datasetWithPairs(app, 30);
  const first = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 3 });
  assert.equal(first.estimate?.basis, "prior");
  core.scheduler.start();
  let run: RunBody;
  for (;;) {
    run = (await as(app, KEY_A).get(`/conduit/finetuning/${first.id}`)).json();
    if (!["QUEUED", "RUNNING"].includes(run.status)) break;
    assert.ok(run.estimate, `a ${run.status} run has an estimate`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  assert.equal(run.status, "READY");
  const final = run.stats.final as {
    steps: number;
    windowSize: number;
    sampleTokens: number;
    trainTokens: number;
    trainSeconds: number;
    elapsedSeconds: number;
    runSeconds: number;
  };
  assert.equal(run.estimate?.basis, "final");
  assert.equal(run.estimate?.seconds, final.runSeconds);
  assert.ok(final.runSeconds > final.elapsedSeconds, "the trainer's seconds are part of the run's");
  assert.deepEqual(run.estimate?.planned, first.estimate?.planned);
  // The plan made at creation is the one the trainer ran.
  assert.equal(first.estimate?.planned?.steps, final.steps);
  assert.equal(first.estimate?.planned?.windowSize, final.windowSize);
  assert.equal(first.estimate?.planned?.tokens, final.trainTokens);
  assert.equal(first.estimate?.planned?.sampleTokens, final.sampleTokens);

  const next = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 3 });
  assert.equal(next.estimate?.basis, "measured");
  assert.equal(next.estimate?.measuredRuns, 1);
  assert.equal(next.estimate?.planned?.tokensPerSecond, final.trainTokens / final.trainSeconds);
  assert.equal(next.estimate?.planned?.overheadSeconds, final.runSeconds - final.trainSeconds);
});

test("a busy machine: the plan expects half a core per trainer thread at a load of 3 on 2 cores, and takes twice as long", async (t) => {
  let load = 0;
  const { app } = await build(t, "sqlite", { cpu: { load: () => load, cores: () => 2 } });
  const ds = await datasetWithPairs(app);
  const idle = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 2 });
  load = 3;
  const busy = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 2 });
  assert.equal(idle.estimate?.planned?.cpuShare, 1);
  assert.equal(busy.estimate?.planned?.cpuShare, 0.5);
  assert.equal(busy.estimate?.planned?.tokens, idle.estimate?.planned?.tokens, "the same plan");
  const ratio = busy.estimate!.seconds / idle.estimate!.seconds;
  assert.ok(Math.abs(ratio - 2) < 1e-9, `twice the seconds, not ${ratio}x`);
});
