/**
 * A run's plan made before any trainer starts (its estimate at creation): its samples tokenized with the base
 * model's own tokenizer and planned by `prepareTrainingData`, the one preparation every trainer makes of a job's
 * data. So the steps, windows, epochs and evaluations an estimate counts are the ones the trainer will run.
 */
import fs from "node:fs";
import { loadLlamaLib, withQuietLog, type LlamaLib, type Pointer } from "../libllama/llamaLib.ts";
import { prepareTrainingData, type TrainingDataJob } from "./prepareTrainingData.ts";
import type { TokenStore } from "./sampleStore.ts";
import type { PlanSummary } from "./trainingPlan.ts";

/**
 * Plans `job` on the vocabulary of `baseModelPath` (read alone, `vocab_only`: no weights are loaded; kept for the
 * next plans of the same file), with
 * llama.cpp's CPU build. Token files go to `job.workDir`, which the caller removes. Throws what the trainer
 * would (no samples, an example longer than the window allows, more tokens than `maxTrainTokens`).
 */
export async function planTrainingData(baseModelPath: string, job: TrainingDataJob): Promise<PlanSummary> {
  fs.mkdirSync(job.workDir, { recursive: true });
  const lib = loadLlamaLib({ gpu: "cpu" });
  const vocabulary = vocabularyOf(lib, baseModelPath);
  const stores: TokenStore[] = [];
  try {
    const data = await prepareTrainingData(
      lib,
      vocabulary.model,
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
    vocabulary.users--;
    evictVocabularies(lib);
  }
}

/**
 * Vocabularies kept loaded, by file version, most recently used last: reading one stops the event loop (0.2–0.4 s
 * for a 150k-token one), once per file rather than per run. One is freed only while no plan uses it.
 */
const vocabularies = new Map<string, { model: Pointer; users: number }>();
const KEPT_VOCABULARIES = 2;

/** The base's vocabulary read alone (`vocab_only`), counted as used until the caller lets it go (`users`). */
function vocabularyOf(lib: LlamaLib, baseModelPath: string): { model: Pointer; users: number } {
  const stat = fs.statSync(baseModelPath);
  const key = `${baseModelPath}\0${stat.size}\0${stat.mtimeMs}`;
  let vocabulary = vocabularies.get(key);
  if (vocabulary === undefined) {
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
    vocabulary = { model, users: 0 };
  }
  vocabularies.delete(key);
  vocabularies.set(key, vocabulary);
  vocabulary.users++;
  return vocabulary;
}

/** Frees the least recently used vocabularies beyond the few kept, of those no plan is using. */
function evictVocabularies(lib: LlamaLib): void {
  let excess = vocabularies.size - KEPT_VOCABULARIES;
  for (const [key, vocabulary] of vocabularies) {
    if (excess <= 0) break;
    if (vocabulary.users > 0) continue;
    vocabularies.delete(key);
    withQuietLog(lib, () => lib.llama_model_free(vocabulary.model));
    excess--;
  }
}
