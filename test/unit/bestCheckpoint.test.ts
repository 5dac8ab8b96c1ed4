/**
 * The best checkpoint is the one served, on both trainers: the llama.cpp trainer's `BestCheckpoint` against the
 * cases the torch worker's `BestTracker` is tested on too (test/python/best_cases.json, run by
 * test/e2e/torchTrainer.test.ts with the worker's Python).
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import { test } from "node:test";
import { BestCheckpoint, type BestEvaluation } from "../../src/train/core/bestCheckpoint.ts";

interface Case {
  name: string;
  patience: number | null;
  evals: [loss: number, epoch: number, step: number][];
  best: BestEvaluation;
  evalsSinceBest: number;
  stopped: boolean;
}

const { cases } = JSON.parse(
  fs.readFileSync(new URL("../python/best_cases.json", import.meta.url), "utf8"),
) as { cases: Case[] };

for (const c of cases)
  test(`best checkpoint: ${c.name}`, () => {
    const tracker = new BestCheckpoint(c.patience);
    const kept = c.evals.map(([loss, epoch, step]) => tracker.observe(loss, epoch, step));
    assert.deepEqual(tracker.best, c.best);
    assert.equal(tracker.evalsSinceBest, c.evalsSinceBest);
    assert.equal(tracker.stopped, c.stopped);
    // The weights kept last (the ones written) are the best evaluation's.
    assert.equal(c.evals[kept.lastIndexOf(true)]![2], c.best.step);
  });

test("best checkpoint: a resumed run goes on from its saved state", () => {
  const first = new BestCheckpoint(3);
  first.observe(0.5, 1, 10);
  first.observe(0.6, 2, 20);
  const resumed = new BestCheckpoint(3, first.state());
  assert.equal(resumed.observe(0.55, 3, 30), false);
  assert.deepEqual(resumed.best, { loss: 0.5, epoch: 1, step: 10 });
  assert.equal(resumed.evalsSinceBest, 2);
  // A state saved before lowestEvalLoss was kept still has a floor: its best.
  const old = new BestCheckpoint(null, { best: { loss: 0.5, epoch: 1, step: 10 }, evalsSinceBest: 0 });
  assert.equal(old.observe(0.7, 2, 20), false);
});
