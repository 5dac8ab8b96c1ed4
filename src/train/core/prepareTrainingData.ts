/**
 * The preparation every trainer makes of a job's data, whichever computes it: the samples tokenized with the
 * base model's own llama.cpp tokenizer (as inference tokenizes a prompt), kept on disk in the work directory,
 * and planned into windows, steps and evaluation points. So a run trains on the same tokens, windows, loss
 * masks and steps on every trainer.
 */
import type { LlamaLib, Pointer } from "../libllama/llamaLib.ts";
import type { TokenStore } from "./sampleStore.ts";
import { tokenizeSamples } from "./tokenizeSample.ts";
import type { TrainingHooks } from "./TrainerBackend.ts";
import type { TrainerJob } from "./trainerJob.ts";
import { TrainingPlan, type PlanSettings } from "./trainingPlan.ts";

/** What the preparation reads of a job: its samples, its work directory and the plan's settings. */
export type TrainingDataJob = PlanSettings &
  Pick<TrainerJob, "samples" | "samplesFile" | "evalSamples" | "evalSamplesFile" | "workDir">;

export interface TrainingData {
  /** The windows of every epoch, the eval windows, the steps (its `train` and `evalSet` hold the tokens). */
  plan: TrainingPlan;
  /** Tokens of the training samples that count in the loss. */
  trainedTokens: number;
}

/**
 * Tokenizes a job's training and held-out samples with `model`'s vocabulary (a model loaded whole, or
 * `vocab_only`) and plans them. The token stores are pushed to `stores`, for the caller to dispose once the job
 * is done. `undefined` when the job was cancelled meanwhile; throws when the plan cannot be made (no samples, an
 * example longer than the window allows, more tokens than `maxTrainTokens`).
 */
export async function prepareTrainingData(
  lib: LlamaLib,
  model: Pointer,
  job: TrainingDataJob,
  hooks: Pick<TrainingHooks, "isCancelled" | "yieldToEventLoop">,
  stores: TokenStore[],
): Promise<TrainingData | undefined> {
  const vocab = lib.llama_model_get_vocab(model);
  // Samples are tokenized once, as they are read, into token files in the work directory; only where each
  // starts stays in memory, and a window's samples are read back when it runs.
  const train = await tokenizeSamples(
    lib,
    vocab,
    job.samplesFile ?? job.samples,
    job.workDir,
    "train",
    hooks,
    stores,
  );
  const held =
    train &&
    (await tokenizeSamples(
      lib,
      vocab,
      job.evalSamplesFile ?? job.evalSamples,
      job.workDir,
      "eval",
      hooks,
      stores,
    ));
  if (train === undefined || held === undefined) return undefined;
  // A sample's last token is labelled with the end token, which pads the windows too.
  const eos = lib.llama_vocab_eos(vocab);
  const endToken = eos >= 0 ? eos : Math.max(0, lib.llama_vocab_bos(vocab));
  const plan = TrainingPlan.create(
    job,
    train.store,
    held.store,
    lib.llama_model_n_ctx_train(model),
    endToken,
  );
  return { plan, trainedTokens: train.trained };
}
