import assert from "node:assert/strict";
import { test } from "node:test";
import { checkpointModelName, checkpointOfModelName } from "../../src/domain/modelNames.ts";
import { checkpointPage } from "../../src/api/openai/fineTuningWire.ts";
import { ConduitError } from "../../src/errors.ts";
import type { Run } from "../../src/domain/runs.ts";

const openAiRun = {
  id: "ft_abc123",
  config: { baseModelName: "tiny", jobRequest: { face: "openai", suffix: "s" } },
} as unknown as Run;
const conduitRun = { id: "ft_def456", config: { baseModelName: "tiny" } } as unknown as Run;

test("a checkpoint's model name is its run's name and :ckpt-step-N, and reads back", () => {
  assert.equal(checkpointModelName(openAiRun, 40), "ft:tiny:s:ft_abc123:ckpt-step-40");
  assert.equal(checkpointModelName(conduitRun, 7), "ft_def456:ckpt-step-7");
  assert.deepEqual(checkpointOfModelName("ft:tiny:s:ft_abc123:ckpt-step-40"), {
    runName: "ft:tiny:s:ft_abc123",
    step: 40,
  });
  assert.deepEqual(checkpointOfModelName("ft_def456:ckpt-step-7"), { runName: "ft_def456", step: 7 });
  for (const name of [
    "ft_def456",
    "ft_def456:ckpt-step-0",
    "ft_def456:ckpt-step-07",
    ":ckpt-step-3",
    "ft_x:ckpt-step-1234567890",
    "tiny",
  ])
    assert.equal(checkpointOfModelName(name), undefined, name);
});

test("OpenAI's checkpoint list pages newest first with after and limit; an unknown after is a 400 naming it", () => {
  const checkpoints = [30, 20, 10].map((step) => ({
    step,
    epoch: step / 10,
    trainLoss: step / 100,
    createdAt: "2026-01-01 00:00:00.000",
  }));
  const first = checkpointPage(openAiRun, checkpoints, undefined, 2);
  assert.deepEqual(
    first.data.map((c) => [c.id, c.step_number, c.fine_tuned_model_checkpoint]),
    [
      ["ftckpt_abc123_30", 30, "ft:tiny:s:ft_abc123:ckpt-step-30"],
      ["ftckpt_abc123_20", 20, "ft:tiny:s:ft_abc123:ckpt-step-20"],
    ],
  );
  assert.equal(first.has_more, true);
  assert.equal(first.first_id, "ftckpt_abc123_30");
  assert.equal(first.last_id, "ftckpt_abc123_20");
  assert.deepEqual(first.data[0]!.metrics, { step: 30, train_loss: 0.3 });
  const rest = checkpointPage(openAiRun, checkpoints, "ftckpt_abc123_20", 2);
  assert.deepEqual(
    rest.data.map((c) => c.step_number),
    [10],
  );
  assert.equal(rest.has_more, false);
  const withEval = checkpointPage(openAiRun, [{ ...checkpoints[0]!, evalLoss: 0.5 }], undefined, 10);
  assert.deepEqual(withEval.data[0]!.metrics, {
    step: 30,
    train_loss: 0.3,
    valid_loss: 0.5,
    full_valid_loss: 0.5,
  });
  assert.throws(
    () => checkpointPage(openAiRun, checkpoints, "ftckpt_other_1", 2),
    (error: unknown) => error instanceof ConduitError && error.param === "after",
  );
  const empty = checkpointPage(openAiRun, [], undefined, 10);
  assert.deepEqual(empty, { object: "list", data: [], first_id: null, last_id: null, has_more: false });
});
