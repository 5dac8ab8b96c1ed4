/**
 * A run's plan made before any trainer starts (its estimate at creation): its samples tokenized with the base
 * model's own tokenizer and planned by `prepareTrainingData`, the one preparation every trainer makes of a job's
 * data. So the steps, windows, epochs and evaluations an estimate counts are the ones the trainer will run.
 */
import fs from "node:fs";
import { loadLlamaLib, withQuietLog } from "../libllama/llamaLib.ts";
import { prepareTrainingData, type TrainingDataJob } from "./prepareTrainingData.ts";
import type { TokenStore } from "./sampleStore.ts";
import type { PlanSummary } from "./trainingPlan.ts";

/**
 * Plans `job` on the vocabulary of `baseModelPath` (read alone, `vocab_only`: no weights are loaded), with
 * llama.cpp's CPU build. Token files go to `job.workDir`, which the caller removes. Throws what the trainer
 * would (no samples, an example longer than the window allows, more tokens than `maxTrainTokens`).
 */
export async function planTrainingData(baseModelPath: string, job: TrainingDataJob): Promise<PlanSummary> {
  fs.mkdirSync(job.workDir, { recursive: true });
  const lib = loadLlamaLib({ gpu: "cpu" });
  const params = lib.llama_model_default_params();
  params.vocab_only = true;
  // Its log stays out of the server's output (node-llama-cpp's logger, where it has one, is put back).
  const model = withQuietLog(lib, (warnings) => {
    const loaded = lib.llama_model_load_from_file(baseModelPath, params);
    if (loaded === null)
      throw new Error(
        `could not read the vocabulary of ${baseModelPath}${warnings() ? `: ${warnings()}` : ""}`,
      );
    return loaded;
  });
  const stores: TokenStore[] = [];
  try {
    const data = await prepareTrainingData(
      lib,
      model,
      job,
      {
        isCancelled: () => false,
        yieldToEventLoop: () => new Promise((resolve) => setImmediate(resolve)),
      },
      stores,
    );
    if (data === undefined) throw new Error("the plan was cancelled");
    return data.plan.summary();
  } finally {
    for (const store of stores) store.dispose();
    withQuietLog(lib, () => lib.llama_model_free(model));
  }
}
