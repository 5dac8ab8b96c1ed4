import type { FieldNames } from "../../errors.ts";

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
