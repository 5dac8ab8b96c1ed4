/**
 * Choosing a trainer's threads between steps: Conduit's `ThreadTuner` against the cases the torch worker's port is
 * tested on too (test/python/thread_tuner_cases.json, run by test/e2e/torchTrainer.test.ts with the worker's Python).
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import { describe, test } from "node:test";
import { ThreadTuner, type ThreadTunerOptions } from "../../src/train/core/threadTuner.ts";

interface Case {
  name: string;
  candidates: number[];
  options: ThreadTunerOptions;
  firstStep: number;
  phases: { steps: number; seconds: Record<string, number> }[];
  used: number[];
  lines: string[];
}

const { cases } = JSON.parse(
  fs.readFileSync(new URL("../python/thread_tuner_cases.json", import.meta.url), "utf8"),
) as { cases: Case[] };

/** Runs `steps` steps whose time is `stepTime(threads, step)`; returns the thread count of each and the log lines. */
function drive(tuner: ThreadTuner, steps: number, stepTime: (threads: number, step: number) => number) {
  const used: number[] = [];
  const lines: string[] = [];
  for (let step = 0; step < steps; step++) {
    const threads = tuner.threads();
    used.push(threads);
    const line = tuner.observe(stepTime(threads, step));
    if (line) lines.push(line);
  }
  return { used, lines };
}

describe("choosing a trainer's threads between steps", () => {
  for (const c of cases)
    test(c.name, () => {
      const times = c.phases.flatMap((phase) => Array.from({ length: phase.steps }, () => phase.seconds));
      const run = drive(new ThreadTuner(c.candidates, c.options), times.length, (threads, step) =>
        step === 0 ? c.firstStep : times[step]![String(threads)]!,
      );
      assert.deepEqual(run, { used: c.used, lines: c.lines });
    });

  test("the llama.cpp trainer's order (every core first): on an idle machine the faster count is kept", () => {
    const tuner = new ThreadTuner([2, 1], { trialSteps: 3, settleSteps: 10 });
    const { used, lines } = drive(tuner, 12, (threads, step) =>
      step === 0 ? 9 : threads === 2 ? 0.3 : 0.42,
    );
    assert.deepEqual(used, [2, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 2]);
    assert.deepEqual(lines, ["2 threads (a step: 2 → 0.30 s, 1 → 0.42 s)"]);
  });

  test("when a core gets busy, the kept count's slower steps bring a trial early, which moves to fewer threads", () => {
    const tuner = new ThreadTuner([2, 1], { trialSteps: 3, settleSteps: 1000 });
    // Idle for 20 steps, then a core is busy: two threads spin against the other work (0.75 s), one does not (0.5 s).
    const { used, lines } = drive(tuner, 40, (threads, step) =>
      step < 20 ? (threads === 2 ? 0.3 : 0.45) : threads === 2 ? 0.75 : 0.5,
    );
    assert.equal(lines.length, 2, lines.join("\n"));
    assert.match(lines[1]!, /^1 thread \(a step: 2 → 0\.75 s, 1 → 0\.50 s\)$/);
    assert.deepEqual(used.slice(-5), [1, 1, 1, 1, 1]);
  });

  test("the machine's load going away is found at the next planned trial", () => {
    const tuner = new ThreadTuner([2, 1], { trialSteps: 2, settleSteps: 6 });
    const { used } = drive(tuner, 30, (threads, step) =>
      step < 12 ? (threads === 2 ? 0.75 : 0.5) : threads === 2 ? 0.3 : 0.45,
    );
    assert.deepEqual(used.slice(-3), [2, 2, 2]);
  });
});
