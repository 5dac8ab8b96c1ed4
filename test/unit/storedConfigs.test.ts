// A run's config as the store reads it: runs stored before `jobRequest` keep working. No server, no model.
import assert from "node:assert/strict";
import { test } from "node:test";
import { servedModelName } from "../../src/domain/modelNames.ts";
import { runConfigOf } from "../../src/store/RunRepository.ts";

const settings = { baseModelName: "tiny", method: "lora", seed: 7 };

test("a run stored with OpenAI's `openai` record is read with its jobRequest, and keeps its ft: name", () => {
  const legacy = JSON.stringify({
    ...settings,
    openai: {
      training_file: "file-abc",
      suffix: "pairs",
      metadata: { purpose: "test" },
      learning_rate_multiplier: 2,
      model: "ft:tiny::ft_old",
    },
  });
  const config = runConfigOf(legacy);
  assert.deepEqual(config, {
    ...settings,
    jobRequest: {
      face: "openai",
      trainingFileID: "file-abc",
      suffix: "pairs",
      metadata: { purpose: "test" },
      lrMultiplier: 2,
      model: "ft:tiny::ft_old",
    },
  });
  assert.equal(servedModelName({ id: "ft_1", config }), "ft:tiny:pairs:ft_1");
  const { model: _model, ...onBase } = JSON.parse(legacy).openai as Record<string, unknown>;
  assert.equal(runConfigOf(JSON.stringify({ ...settings, openai: onBase })).jobRequest?.model, undefined);
});

test("a run stored with its jobRequest, or without one, is read as stored", () => {
  const jobRequest = {
    face: "openai",
    trainingFileID: "file-abc",
    suffix: null,
    metadata: null,
    lrMultiplier: null,
  };
  assert.deepEqual(runConfigOf(JSON.stringify({ ...settings, jobRequest })), { ...settings, jobRequest });
  const plain = runConfigOf(JSON.stringify(settings));
  assert.deepEqual(plain, settings);
  assert.equal(servedModelName({ id: "ft_2", config: plain }), "ft_2");
});
