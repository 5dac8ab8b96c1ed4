import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, test } from "node:test";
import {
  aboutDuration,
  currentEstimate,
  describeEstimate,
  type RunEstimate,
  type RunPlan,
} from "../../src/contract/estimate.ts";
import {
  cpuShare,
  planRun,
  planTokens,
  type ModelCost,
  type PlanInput,
} from "../../src/train/runEstimate.ts";
import type { PlanSummary } from "../../src/train/core/trainingPlan.ts";
import { llamaCppPrior } from "../../src/train/native/llamaCppTrainer.ts";
import { totalMemory } from "../../src/train/core/TrainerBackend.ts";
import { trainers } from "../../src/train/trainers.ts";
import { torchRate } from "../../src/train/torch/torchTrainer.ts";
import type { TrainerHost } from "../../src/train/core/TrainerBackend.ts";
import type { FinishedRun } from "../../src/store/RunRepository.ts";
import { RecentLoad } from "../../src/train/recentLoad.ts";

// A run's estimated duration: planned at creation (a prior, or measured on earlier runs), refined while it
// trains, the actual time once READY (through the API: http/estimate.test.ts).

const smollm2: ModelCost = {
  parameters: 134_515_008,
  vocabSize: 49_152,
  contextLength: 8192,
  fileType: "Q4_1",
  sizeBytes: 94 * 2 ** 20,
  file: "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
};

/** A plan as its trainer will run it: 3 epochs of 25 windows of 256 tokens, 3 eval windows. */
const plan3x25: PlanSummary = {
  windowSize: 256,
  stepsPerEpoch: [25, 25, 25],
  steps: 75,
  sampleTokens: 3 * 90 * 60,
  evalWindows: 3,
  evaluations: 3,
  lossWindows: 28,
};

function input(overrides: Partial<PlanInput> = {}): PlanInput {
  return {
    prior: llamaCppPrior("none"),
    method: "lora",
    model: smollm2,
    plan: plan3x25,
    threads: 1,
    history: [],
    cpuShare: 1,
    ...overrides,
  };
}

/** A server's settings, as far as the trainers' priors read them. */
const host: TrainerHost = {
  threads: 1,
  gpu: "off",
  accelerator: () => Promise.resolve({ device: "cpu", gpuLayers: 0 }),
  python: undefined,
  ranks: 1,
  nodes: 1,
  rendezvous: null,
  blas: "off",
  cacheDir: "/nonexistent",
};

/** A READY run's totals as a trainer reports them, and the plan it was made with. */
function finished(final: FinishedRun["final"], plan: RunPlan | null = null): FinishedRun {
  return { final, plan };
}

describe("planning a run", () => {
  test("steps, windows and tokens are the plan's (the trainer's own, made at creation)", () => {
    const plan = planRun(input());
    assert.equal(plan.steps, 75);
    assert.equal(plan.windowSize, 256);
    assert.equal(plan.tokens, 75 * 256);
    assert.equal(plan.sampleTokens, plan3x25.sampleTokens);
    const tokens = planTokens(plan3x25);
    assert.equal(tokens.evalTokens, 3 * 256 * 3, "the eval windows at every evaluation point");
    assert.equal(tokens.lossTokens, 28 * 256);
    // Preference tuning: every window is one of a pair, and the reference pass measures each pair once more.
    const pairs = planTokens({ ...plan3x25, pairs: true });
    assert.equal(pairs.tokens, 2 * 75 * 256);
    assert.equal(pairs.evalTokens, 2 * tokens.evalTokens);
    assert.equal(pairs.lossTokens, 4 * tokens.lossTokens);
    assert.equal(planRun(input({ plan: { ...plan3x25, pairs: true } })).tokens, 2 * plan.tokens);
  });

  test("the torch trainer's prior follows the type it trains in and falls faster with size in bf16", () => {
    const qwen15 = 1_543_714_304;
    // The fitted curves at the bases of bench/README.md's readyTime runs (one thread).
    assert.ok(Math.abs(torchRate(smollm2.parameters, true, 1) - 302) < 1e-9);
    assert.ok(Math.abs(torchRate(smollm2.parameters, false, 1) - 90) < 1e-9);
    const bf16 = torchRate(qwen15, true, 1);
    assert.ok(bf16 > 45 && bf16 < 52, `bf16 on the 1.5B base: ${bf16}`);
    assert.ok(torchRate(qwen15, false, 1) < bf16, "F32 is the slower type");
    // Before any check of the install the prior takes F32, the slower.
    assert.equal(
      trainers.torch.prior({ ...host, python: "/nonexistent/python" }).tokensPerSecond("lora", smollm2, 1),
      torchRate(smollm2.parameters, false, 1),
    );
  });

  test("the torch trainer's prior counts converting the base the first time, not once its copy is kept", (t) => {
    const cache = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-estimate-"));
    t.after(() => fs.rmSync(cache, { recursive: true, force: true }));
    const modelFile = path.join(cache, "qwen2.5-coder-1.5b-instruct.gguf");
    fs.writeFileSync(modelFile, "");
    const qwen = { ...smollm2, parameters: 1_543_714_304, sizeBytes: 1_117_320_768, file: modelFile };
    const torchHost = { ...host, cacheDir: cache };
    const first = planRun(input({ model: qwen, prior: trainers.torch.prior(torchHost) })).overheadSeconds;
    // The worker's copy: `<file name>-<16 hex digits>/config.json` under the cache's torch/ folder.
    fs.mkdirSync(path.join(cache, "torch", "qwen2.5-coder-1.5b-instruct-0123456789abcdef"), {
      recursive: true,
    });
    const unfinished = planRun(
      input({ model: qwen, prior: trainers.torch.prior(torchHost) }),
    ).overheadSeconds;
    assert.equal(unfinished, first, "a copy being written (no config.json yet) is not a copy");
    fs.writeFileSync(
      path.join(cache, "torch", "qwen2.5-coder-1.5b-instruct-0123456789abcdef", "config.json"),
      "{}",
    );
    const next = planRun(input({ model: qwen, prior: trainers.torch.prior(torchHost) })).overheadSeconds;
    assert.ok(first - next > 25 && first - next < 60, `the 1.5B conversion: ${first - next} s`);
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
    const torch = planRun(input({ prior: trainers.torch.prior(host) }));
    assert.ok(torch.tokensPerSecond > 3 * small.tokensPerSecond, "the torch trainer is the faster one");
    assert.ok(
      trainers.torch.prior(host).overheadSeconds(smollm2) > llamaCppPrior("none").overheadSeconds(smollm2),
      "Python starts and loads the GGUF",
    );
    assert.ok(
      planRun(input({ model: { ...smollm2, fileType: "F32" } })).tokensPerSecond > small.tokensPerSecond,
      "llama.cpp trains LoRA on an F32 base faster than through Q8_0",
    );
    const blas = planRun(input({ prior: llamaCppPrior("any") })).tokensPerSecond;
    assert.ok(
      blas > 5 * small.tokensPerSecond,
      "with its BLAS backend llama.cpp trains ~6x faster than through Q8_0",
    );
    // A base whose F32 copy is over the budget: a backend that takes F32 weights only leaves it to Q8_0 without BLAS.
    const overBudget = { ...smollm2, parameters: totalMemory() };
    const rate = (blas: "none" | "f32" | "any") =>
      planRun(input({ prior: llamaCppPrior(blas), model: overBudget })).tokensPerSecond;
    assert.equal(rate("f32"), rate("none"));
    assert.ok(
      rate("any") > 5 * rate("f32"),
      "a backend that takes every type trains it as it is, through BLAS",
    );
    assert.ok(
      planRun(input({ prior: llamaCppPrior("f32") })).tokensPerSecond === blas,
      "within the budget, through an F32 copy",
    );
    // With bf16 products the base trains as it is, faster: the curve through bench/README.md's three bases (two
    // threads: 191.7, 68.0 and 33.1 tok/s).
    const bf16 = llamaCppPrior("any", true);
    const at = (parameters: number) => bf16.tokensPerSecond("lora", { ...smollm2, parameters }, 2);
    for (const [parameters, measured] of [
      [134_515_008, 191.7],
      [494_032_768, 68.0],
      [1_543_714_304, 33.1],
    ] as const)
      assert.ok(
        Math.abs(at(parameters) / measured - 1) < 0.15,
        `${parameters}: ${at(parameters)} vs ${measured}`,
      );
    const qwen15 = { ...smollm2, parameters: 1_543_714_304 };
    assert.ok(
      bf16.tokensPerSecond("lora", qwen15, 2) > 1.2 * llamaCppPrior("any").tokensPerSecond("lora", qwen15, 2),
      "the 1.5B base trains faster in bf16 than through F32 products",
    );
    assert.equal(
      bf16.tokensPerSecond("full", smollm2, 1),
      llamaCppPrior("any").tokensPerSecond("full", smollm2, 1),
      "a full fine-tune's weights are F32: bf16 changes nothing",
    );
  });

  test("measured: the earlier runs' loop rate and overhead", () => {
    const history = [
      finished({ trainTokens: 10_000, trainSeconds: 100, elapsedSeconds: 120 }),
      // The whole attempt's seconds count where a run has them.
      finished({ trainTokens: 30_000, trainSeconds: 100, elapsedSeconds: 130, runSeconds: 140 }),
    ];
    const plan = planRun(input({ history }));
    assert.equal(plan.basis, "measured");
    assert.equal(plan.measuredRuns, 2);
    assert.equal(plan.tokensPerSecond, 40_000 / 200);
    assert.equal(plan.overheadSeconds, 30, "the median of 20 and 40");
    assert.equal(plan.tokenRatio, 1);
    assert.equal(plan.seconds, 30 + plan.tokens / 200);
    // Runs without totals (older than them) are not measured on.
    assert.equal(planRun(input({ history: [finished({ steps: 3 })] })).basis, "prior");
  });

  test("a busy machine: the rate and the overhead scaled by the share of a core each trainer thread can expect", () => {
    assert.equal(cpuShare(0, 2, 1), 1, "an idle machine: a core each");
    assert.equal(cpuShare(1, 2, 1), 1, "one other busy thread and the trainer's fit on 2 cores");
    assert.equal(cpuShare(3, 2, 1), 0.5);
    assert.equal(cpuShare(2, 2, 2), 0.5);
    assert.equal(cpuShare(-1, 4, 2), 1);
    const idle = planRun(input());
    const busy = planRun(input({ cpuShare: 0.5 }));
    assert.equal(busy.cpuShare, 0.5);
    assert.equal(busy.tokensPerSecond, idle.tokensPerSecond / 2);
    assert.equal(busy.overheadSeconds, idle.overheadSeconds * 2);
    assert.equal(busy.seconds, idle.seconds * 2);
    // Earlier runs as on cores of their own: one measured at half its cores counts twice as fast.
    const atHalf = finished(
      { trainTokens: 10_000, trainSeconds: 100, elapsedSeconds: 120 },
      { ...idle, cpuShare: 0.5 },
    );
    const measured = planRun(input({ history: [atHalf] }));
    assert.equal(measured.tokensPerSecond, 200);
    assert.equal(measured.overheadSeconds, 10);
    const measuredBusy = planRun(input({ history: [atHalf], cpuShare: 0.5 }));
    assert.equal(measuredBusy.tokensPerSecond, 100);
    assert.equal(measuredBusy.overheadSeconds, 20);
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
    // Waiting for its first step (loading the base, log lines updating the run): the plan counts down from the
    // attempt's start, and the finish time stays where it was.
    const waiting = (secondsLater: number) =>
      currentEstimate(
        { ...plan, seconds: 90 },
        {
          status: "RUNNING",
          stats: { startedAt: "2026-11-26 12:00:00.000" },
          updatedAt: at + secondsLater * 1000,
        },
      );
    assert.deepEqual(
      [10, 60].map((s) => [waiting(s)?.remainingSeconds, waiting(s)?.finishAt]),
      [
        [80, "2026-11-26 12:01:30.000"],
        [30, "2026-11-26 12:01:30.000"],
      ],
    );
    assert.match(describeEstimate(waiting(60)!), /^about 30 s left, waiting for the first step/);
    // Past the plan: nothing left to count, and it says it is still waiting.
    assert.equal(waiting(200)?.remainingSeconds, 0);
    assert.equal(waiting(200)?.finishAt, "2026-11-26 12:03:20.000");
    assert.match(describeEstimate(waiting(200)!), /^waiting for the first step, longer than planned/);
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
    assert.equal(
      describeEstimate({ ...measured, planned: { ...measured.planned!, cpuShare: 0.4 } }),
      "about 3 min (measured on 2 earlier runs; a busy machine: 40 % of a core per thread)",
    );
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

test("RecentLoad: the runnable threads of the last ~20 s, not a minute's average; the load average before 3 samples", (t) => {
  const early = new RecentLoad(() => 1000, 60_000_000, 20_000);
  t.after(() => early.stop());
  assert.notEqual(early.current(), 1000, "one sample: the 1-minute load average");
  early.sample(2000);
  early.sample(2000);
  assert.equal(early.current(), 1000, "three: their average");
  let now = 0;
  const load = new RecentLoad(() => now, 60_000_000, 20_000);
  t.after(() => load.stop());
  // Idle, then 4 threads want a core: 30 s later (15 samples of 2 s) the average is most of the way there.
  for (let i = 0; i < 5; i++) load.sample(2000);
  assert.equal(load.current(), 0);
  now = 4;
  for (let i = 0; i < 15; i++) load.sample(2000);
  assert.ok(load.current() > 3 && load.current() < 4, String(load.current()));
  // Where /proc/stat cannot be read: the load average (never a sample).
  const unread = new RecentLoad(() => undefined);
  for (let i = 0; i < 5; i++) unread.sample(2000);
  assert.ok(unread.current() >= 0 && unread.current() < 1000);
});
