import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { as, backends, build, buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";
import {
  aboutDuration,
  currentEstimate,
  describeEstimate,
  type RunEstimate,
  type RunPlan,
} from "../../src/contract/estimate.ts";
import { planRun, planTokens, type ModelCost, type PlanInput } from "../../src/train/runEstimate.ts";
import type { FinishedRun } from "../../src/store/RunRepository.ts";
import type { Core } from "../../src/core.ts";

// A run's estimated duration: planned at creation (a prior, or measured on earlier runs), refined while it
// trains, the actual time once READY; on the Conduit API, the OpenAI face and the CLI (cli.test.ts).

const smollm2: ModelCost = {
  parameters: 134_515_008,
  vocabSize: 49_152,
  contextLength: 8192,
  fileType: "Q4_1",
  sizeBytes: 94 * 2 ** 20,
};

/** 100 pairs of 200 bytes of text each (50 tokens at 4 bytes a token) and 10 template tokens: 60 a pair. */
function input(overrides: Partial<PlanInput> = {}): PlanInput {
  return {
    trainer: "llama.cpp",
    method: "lora",
    model: smollm2,
    train: { pairs: 100, textBytes: 100 * 200 },
    validation: null,
    evalFraction: 0.1,
    minPairsForEval: 50,
    epochs: 3,
    steps: null,
    contextSize: 1024,
    templateTokens: 10,
    threads: 1,
    history: [],
    ...overrides,
  };
}

/** A READY run's totals as a trainer reports them, and the plan it was made with. */
function finished(final: FinishedRun["final"], plan: RunPlan | null = null): FinishedRun {
  return { final, plan };
}

describe("planning a run", () => {
  test("tokens and steps come from the pairs the way the trainers pack windows; steps cap them", () => {
    const plan = planTokens(input());
    // 90 pairs train (10 held out), 60 tokens each; 256-token windows hold (256 - 30) / 60 of them.
    assert.equal(plan.windowSize, 256);
    assert.equal(plan.steps, 3 * Math.ceil(90 / (226 / 60)));
    assert.equal(plan.tokens, plan.steps * 256);
    assert.equal(plan.sampleTokens, 3 * 90 * 60);
    assert.ok(plan.evalTokens > 0, "the held-out pairs are evaluated");

    const capped = planTokens(input({ steps: 10 }));
    assert.equal(capped.steps, 10);
    assert.equal(capped.tokens, 2560);
    // Long pairs get a longer window (the longest guessed at twice the mean).
    assert.equal(planTokens(input({ train: { pairs: 100, textBytes: 100 * 1600 } })).windowSize, 1024);
    // A validation file is evaluated, and every pair of the dataset trains.
    const validated = planTokens(input({ validation: { pairs: 20, textBytes: 20 * 200 } }));
    assert.equal(validated.sampleTokens, 3 * 100 * 60);
  });

  test("the prior: slower on a bigger model, faster with more threads, per trainer; overheads counted", () => {
    const small = planRun(input());
    assert.equal(small.basis, "prior");
    assert.equal(small.measuredRuns, 0);
    assert.equal(small.tokenRatio, 1);
    assert.ok(small.seconds > small.overheadSeconds && small.overheadSeconds > 0);
    assert.ok(
      Math.abs(small.seconds - small.overheadSeconds - small.tokens / small.tokensPerSecond) < 1e-9,
      "seconds are the overhead and the loop's tokens at its rate",
    );
    const big = planRun(input({ model: { ...smollm2, parameters: 8 * smollm2.parameters } }));
    assert.ok(big.tokensPerSecond < small.tokensPerSecond / 3);
    assert.ok(planRun(input({ threads: 2 })).tokensPerSecond > small.tokensPerSecond);
    const torch = planRun(input({ trainer: "torch" }));
    assert.ok(torch.tokensPerSecond > 4 * small.tokensPerSecond, "the torch trainer is the faster one");
    assert.ok(torch.overheadSeconds > small.overheadSeconds, "Python starts and loads the GGUF");
    assert.ok(
      planRun(input({ model: { ...smollm2, fileType: "F32" } })).tokensPerSecond > small.tokensPerSecond,
      "llama.cpp trains LoRA on an F32 base faster than through Q8_0",
    );
    const blas = planRun(input({ blas: true })).tokensPerSecond;
    assert.ok(
      blas > 5 * small.tokensPerSecond,
      "with its BLAS backend llama.cpp trains ~6x faster than through Q8_0",
    );
  });

  test("measured: the earlier runs' loop rate and overhead, and the tokens they really trained per planned one", () => {
    const first = planRun(input());
    // The run trained 1.5 times the sample tokens its plan said (a tokenizer that splits digits, say).
    const history = [
      finished(
        {
          trainTokens: 10_000,
          trainSeconds: 100,
          elapsedSeconds: 120,
          sampleTokens: first.sampleTokens * 1.5,
          resumedFromStep: 0,
          stoppedEarly: false,
        },
        first,
      ),
      // The whole attempt's seconds count where a run has them.
      finished({ trainTokens: 30_000, trainSeconds: 100, elapsedSeconds: 130, runSeconds: 140 }),
    ];
    const plan = planRun(input({ history }));
    assert.equal(plan.basis, "measured");
    assert.equal(plan.measuredRuns, 2);
    assert.equal(plan.tokensPerSecond, 40_000 / 200);
    assert.equal(plan.overheadSeconds, 30, "the median of 20 and 40");
    assert.equal(plan.tokenRatio, 1.5);
    assert.equal(plan.sampleTokens, Math.round(first.sampleTokens * 1.5));
    assert.equal(plan.seconds, 30 + plan.tokens / 200);

    // A run planned with the ratio that trains what it planned keeps the ratio (no drift).
    const again = planRun(
      input({
        history: [
          finished(
            { trainTokens: 1, trainSeconds: 1, elapsedSeconds: 1, sampleTokens: plan.sampleTokens },
            plan,
          ),
        ],
      }),
    );
    assert.ok(Math.abs(again.tokenRatio - 1.5) < 1e-3, String(again.tokenRatio));
    // Runs without totals (older than them) are not measured on.
    assert.equal(planRun(input({ history: [finished({ steps: 3 })] })).basis, "prior");
  });
});

describe("the estimate a run shows", () => {
  const plan = planRun(input());
  const at = Date.parse("2026-11-26T12:00:00Z");

  test("the plan while QUEUED, the trainer's pace once it steps, the actual once READY; from the stored run alone", () => {
    const queued = currentEstimate(plan, { status: "QUEUED", stats: {}, updatedAt: at });
    assert.deepEqual(queued, {
      basis: "prior",
      seconds: plan.seconds,
      remainingSeconds: plan.seconds,
      finishAt: null,
      measuredRuns: 0,
      planned: plan,
    });
    // Started (at its last update), no step yet: the plan, counted from then.
    const starting = currentEstimate(
      { ...plan, seconds: 90 },
      { status: "RUNNING", stats: {}, updatedAt: at },
    );
    assert.deepEqual([starting?.basis, starting?.finishAt], ["prior", "2026-11-26 12:01:30.000"]);
    // 3 steps in 30 s, and 70 s to go, when the stats were written.
    const stats = { step: 3, totalSteps: 10, elapsedSeconds: 30, etaSeconds: 70 };
    const training = currentEstimate(plan, { status: "RUNNING", stats, updatedAt: at });
    assert.equal(training?.basis, "training");
    assert.equal(training?.seconds, 100);
    assert.equal(training?.remainingSeconds, 70);
    assert.equal(training?.finishAt, "2026-11-26 12:01:10.000");
    assert.deepEqual(training?.planned, plan, "the plan stays beside it");
    const ready = currentEstimate(plan, {
      status: "READY",
      stats: { final: { elapsedSeconds: 95 } as never },
      updatedAt: at,
    });
    assert.deepEqual(
      [ready?.basis, ready?.seconds, ready?.remainingSeconds, ready?.finishAt],
      ["final", 95, 0, null],
      "a run trained before runSeconds: the trainer's seconds",
    );
    const whole = currentEstimate(plan, {
      status: "READY",
      stats: { final: { elapsedSeconds: 95, runSeconds: 97 } as never },
      updatedAt: at,
    });
    assert.equal(whole?.seconds, 97, "the whole attempt: examples, trainer, per-example losses");
    for (const status of ["FAILED", "CANCELLED"] as const)
      assert.equal(currentEstimate(plan, { status, stats, updatedAt: at }), null);
    // A re-queued run keeps its last attempt's stats: the plan again.
    assert.equal(currentEstimate(plan, { status: "QUEUED", stats, updatedAt: at })?.basis, "prior");
    // A run created before estimates: none while queued, the trainer's pace once it trains.
    assert.equal(currentEstimate(null, { status: "QUEUED", stats: {}, updatedAt: at }), null);
    assert.equal(currentEstimate(null, { status: "RUNNING", stats, updatedAt: at })?.basis, "training");
  });

  test("in words", () => {
    assert.equal(aboutDuration(4), "a few seconds");
    assert.equal(aboutDuration(42), "about 40 s");
    assert.equal(aboutDuration(170), "about 3 min");
    assert.equal(aboutDuration(4800), "about 1 h 20 min");
    const measured: RunEstimate = {
      basis: "measured",
      seconds: 170,
      remainingSeconds: 170,
      finishAt: null,
      measuredRuns: 2,
      planned: { ...plan, basis: "measured", seconds: 170, measuredRuns: 2 },
    };
    assert.equal(describeEstimate(measured), "about 3 min (measured on 2 earlier runs)");
    assert.match(
      describeEstimate({ ...measured, basis: "prior", measuredRuns: 0 }),
      /^about 3 min \(no earlier run/,
    );
    assert.equal(
      describeEstimate({ ...measured, basis: "training", remainingSeconds: 60 }),
      "about 60 s left (at the trainer's pace)",
    );
    assert.equal(
      describeEstimate({ ...measured, basis: "final", seconds: 161, remainingSeconds: 0 }),
      "took 2m41s (estimated about 3 min)",
    );
  });
});

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
    trainTokens: number;
    trainSeconds: number;
    elapsedSeconds: number;
    runSeconds: number;
  };
  assert.equal(run.estimate?.basis, "final");
  assert.equal(run.estimate?.seconds, final.runSeconds);
  assert.ok(final.runSeconds > final.elapsedSeconds, "the trainer's seconds are part of the run's");
  assert.deepEqual(run.estimate?.planned, first.estimate?.planned);

  const next = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 3 });
  assert.equal(next.estimate?.basis, "measured");
  assert.equal(next.estimate?.measuredRuns, 1);
  assert.equal(next.estimate?.planned?.tokensPerSecond, final.trainTokens / final.trainSeconds);
  assert.equal(next.estimate?.planned?.overheadSeconds, final.runSeconds - final.trainSeconds);
});
