// Configs as the store reads them: runs, evals and eval runs stored before the neutral names keep working. No
// server, no model.
import assert from "node:assert/strict";
import { test } from "node:test";
import { servedModelName } from "../../src/domain/modelNames.ts";
import { evalConfigOf, evalRunConfigOf } from "../../src/store/EvalRepository.ts";
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

test("an eval and an eval run stored with OpenAI's `openai` record are read with their faceRequest", () => {
  const graders = [{ type: "exact_match", name: "exact_match", normalize: [] }];
  const evalConfig = evalConfigOf(
    JSON.stringify({
      graders,
      source: null,
      systemPrompt: "",
      openai: {
        data_source_config: { type: "custom", item_schema: { type: "object" } },
        testing_criteria: [{ type: "string_check" }],
        metadata: { team: "a" },
        expectedField: "answer",
      },
    }),
  );
  assert.deepEqual(evalConfig, {
    graders,
    source: null,
    systemPrompt: "",
    faceRequest: {
      face: "openai",
      dataSourceConfig: { type: "custom", item_schema: { type: "object" } },
      testingCriteria: [{ type: "string_check" }],
      metadata: { team: "a" },
      expectedField: "answer",
    },
  });
  const settings = { graders, systemPrompt: "", maxTokens: 8, parallel: 2 };
  assert.deepEqual(
    evalRunConfigOf(
      JSON.stringify({ ...settings, openai: { data_source: { type: "completions" }, metadata: null } }),
    ),
    { ...settings, faceRequest: { face: "openai", dataSource: { type: "completions" }, metadata: null } },
  );
  assert.deepEqual(evalRunConfigOf(JSON.stringify(settings)), settings);
});
