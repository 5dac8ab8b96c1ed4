/**
 * What the run service is asked to do, in its own terms: each API face (the Conduit API's
 * `POST /conduit/finetuning`, the OpenAI face's `POST /v1/fine_tuning/jobs`) maps its body into these
 * and maps the service's errors (whose `param` names a field of the command) back to its own fields.
 */
import type { LoraTarget, RunMethod, TrainerName } from "../contract/runs.ts";
import type { JobRequest } from "../domain/runs.ts";

/**
 * Create a fine-tuning run. Every field but the dataset is optional; what is left out gets its default
 * (`runDefaults`), and `"auto"` settings are chosen from the data and the model.
 */
export interface CreateRun {
  /** The dataset to train on, by id. One of `datasetID` and `datasetName` is required (the id wins). */
  datasetID?: string | undefined;
  /** The dataset to train on, by name. */
  datasetName?: string | undefined;
  /** The base model's id. Defaults to the server's default model (`CONDUIT_DEFAULT_MODEL`). */
  baseModelName?: string | undefined;
  /** Defaults to `runDefaults.method`. */
  method?: RunMethod | undefined;
  /** DPO's β (`dpo` only). Defaults to `runDefaults.beta`. */
  beta?: number | undefined;
  /** A READY supervised LoRA run of the user's whose adapter a `dpo` run starts from. Defaults to none (the base). */
  fromRunID?: string | undefined;
  /** The trainer that trains the run. Defaults to the server's choice (`CONDUIT_TRAINER`). */
  trainer?: TrainerName | undefined;
  /** Learning rate, or `"auto"`. Defaults to `"auto"`. */
  lr?: number | "auto" | undefined;
  /** Multiplies the learning rate, `"auto"`'s or the one given (OpenAI's `learning_rate_multiplier`). Defaults to `1`. */
  lrMultiplier?: number | undefined;
  /** Passes over the data, or `"auto"`. Defaults to `"auto"`. */
  epochs?: number | "auto" | undefined;
  /** Cap on optimizer steps. Defaults to none. */
  steps?: number | undefined;
  /** LoRA rank, or `"auto"` (`lora` only). Defaults to `"auto"`. */
  loraRank?: number | "auto" | undefined;
  /** LoRA alpha (`lora` only). Defaults to `runDefaults.loraAlphaPerRank` × the rank. */
  loraAlpha?: number | undefined;
  /** The weights that get adapters (`lora` only). Defaults to every target the run's trainer can train. */
  loraTargets?: readonly LoraTarget[] | undefined;
  /** Fraction of the top blocks trained. Defaults to `runDefaults.complexity`. */
  complexity?: number | undefined;
  /** Train on the whole conversation, not the answers only. Defaults to `false`. */
  trainOnInputs?: boolean | undefined;
  /** A file of the user's whose pairs are the validation set. Defaults to none (a random hold-out). */
  validationFileID?: string | undefined;
  /** Evaluations without a new best before training stops. Defaults to none. */
  earlyStoppingPatience?: number | undefined;
  /** Defaults to none. */
  systemPrompt?: string | undefined;
  /** A model that also grades the automatic before/after (a `score_model` grader). Defaults to none. */
  judgeModel?: string | undefined;
  /** Defaults to `<dataset name>-<base model>`. */
  name?: string | undefined;
  /** Defaults to none. */
  trackerProject?: string | undefined;
  /** Defaults to none. */
  trackerEntity?: string | undefined;
  /** Seed of the run's sample order, held-out pairs and initial adapter. Defaults to `runDefaults.seed`. */
  seed?: number | undefined;
  /** What a compatibility face was asked (suffix, metadata, ...), kept in `config.jobRequest`. Defaults to none. */
  jobRequest?: JobRequest | undefined;
}

/** Which pairs an example belongs to. */
export type ExampleSplit = "train" | "validation";

/** One training or validation pair of a READY run, with its loss after training. */
export interface RunExample {
  split: ExampleSplit;
  /** Position in its split, in upload order, from 0. */
  index: number;
  input: string;
  output: string;
  /** Mean loss per trained token; `null` when none of its tokens was trained. */
  loss: number | null;
  /** The trained tokens the loss averages. */
  tokens: number;
}

/** Which of a READY run's examples to read, and in what order. */
export interface ExamplesQuery {
  /** `loss`: the worst learned first; `index`: training then validation examples, in upload order. */
  sort: "loss" | "index";
  /** Only one split. Defaults to both. */
  split?: ExampleSplit | undefined;
  limit: number;
  offset: number;
}
