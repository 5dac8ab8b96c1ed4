import type { FieldNames } from "../../errors.ts";
import type { CreateRun } from "../../train/commands.ts";

/** The OpenAI-compatible API's names for the fields the services blame (`param` of its error bodies). */
export const openAiFields: FieldNames = {
  runId: "fine_tuning_job_id",
  evalId: "eval_id",
  evalRunId: "run_id",
  maxTokens: "max_tokens",
  temperature: "temperature",
  topP: "top_p",
  topK: "top_k",
  presencePenalty: "presence_penalty",
  frequencyPenalty: "frequency_penalty",
  seed: "seed",
};

/**
 * On `POST /v1/fine_tuning/jobs`: the run command's fields (the `param` of the run service's errors) → the job
 * body's field they came from.
 */
export const openAiJobFields: Partial<Record<keyof CreateRun, string>> = {
  datasetID: "training_file",
  datasetName: "training_file",
  validationFileID: "validation_file",
  baseModelName: "model",
  fromRunID: "model",
  method: "method.type",
  beta: "method.dpo.hyperparameters.beta",
  epochs: "hyperparameters.n_epochs",
  lrMultiplier: "hyperparameters.learning_rate_multiplier",
  seed: "seed",
  name: "suffix",
};
