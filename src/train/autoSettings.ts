/**
 * `"auto"` training settings: epochs, learning rate and LoRA rank chosen from the dataset and the
 * model, the way OpenAI's `n_epochs: "auto"` picks epochs from the number of examples. The aim is a
 * default run that learns a handful of pairs, and does not overfit or run for hours on thousands.
 *
 * The constants come from measurements (docs/fine-tuning.md, "How auto chooses"): small models and small datasets
 * need many passes at a high rate; wide models need a lower rate; more data needs fewer passes.
 */
import { readGgufFileInfo } from "node-llama-cpp";
import type { TrainMethod } from "../contract/runs.ts";
import type { AutoSetting, TrainObjective } from "../domain/runs.ts";

/** What the choice looks at in the model. */
export interface ModelShape {
  /** Width of the residual stream (`{arch}.embedding_length`). */
  embeddingLength: number;
  /** The context the model was trained on (`{arch}.context_length`). */
  contextLength: number;
}

export interface AutoSettingsInput {
  method: TrainMethod;
  /** Preference tuning (`dpo`) takes fewer passes at a lower rate. Defaults to `"sft"`. */
  objective?: TrainObjective;
  /** Training pairs (after any validation split). */
  pairs: number;
  /** Characters of the training pairs' inputs and outputs together. */
  characters: number;
  model: ModelShape;
}

export interface AutoChoice {
  epochs: number;
  lr: number;
  loraRank: number;
  /** One plain sentence per setting: what it was chosen from. */
  reasons: Record<AutoSetting, string>;
}

/**
 * Small datasets get many passes: about SMALL_DATA_EPOCHS / pairs^1.5 epochs (10 pairs: 200, 20: 74,
 * 50: 19, 100: 7), which is what a random 128-wide model needs to memorise 10 pairs and, at the other
 * end, what SmolLM2 needs to learn a 150-pair task (3 epochs, docs/trainers.md); never fewer than DEFAULT_EPOCHS...
 */
const SMALL_DATA_EPOCHS = 6_600;
const DEFAULT_EPOCHS = 3;
const MAX_EPOCHS = 200;
/** ...and large datasets are seen at most this many times in all, down to one epoch. */
const MAX_PAIR_VISITS = 10_000;
/** LoRA learning rate of a 576-wide model (SmolLM2-135M, measured); it scales with 1/√width. */
const LORA_LR_AT_576 = 1e-3;
const FULL_LR_AT_576 = 2e-4;
/**
 * Preference tuning refines a model rather than teaching it answers: the supervised default of passes, and a tenth
 * of the supervised rate (TRL's DPO default rate is a twentieth of its SFT one).
 */
const DPO_LR_SHARE = 0.1;

/** Epochs, learning rate and LoRA rank for a dataset and model, with the reason for each. */
export function chooseAutoSettings(input: AutoSettingsInput): AutoChoice {
  const pairs = Math.max(1, input.pairs);
  const dpo = input.objective === "dpo";
  let epochs = DEFAULT_EPOCHS;
  let epochsWhy = `${DEFAULT_EPOCHS} epochs for ${pairs} ${dpo ? "preference examples" : "pairs"}`;
  const small = dpo ? 0 : Math.min(MAX_EPOCHS, Math.ceil(SMALL_DATA_EPOCHS / pairs ** 1.5));
  if (small > DEFAULT_EPOCHS) {
    epochs = small;
    epochsWhy = `${epochs} epochs: a small dataset (${pairs} pair${pairs === 1 ? "" : "s"}) needs many passes to be learned`;
  } else if (pairs * DEFAULT_EPOCHS > MAX_PAIR_VISITS) {
    epochs = Math.max(1, Math.floor(MAX_PAIR_VISITS / pairs));
    epochsWhy = `${epochs} epoch${epochs === 1 ? "" : "s"}: a large dataset (${pairs} pairs) is seen at most ${MAX_PAIR_VISITS} times in all`;
  }

  const width = Math.max(1, input.model.embeddingLength);
  const scale = Math.sqrt(576 / width);
  const supervised =
    input.method === "lora"
      ? clamp(LORA_LR_AT_576 * scale, 1e-4, 3e-3)
      : clamp(FULL_LR_AT_576 * scale, 1e-5, 1e-3);
  const lr = roundRate(dpo ? supervised * DPO_LR_SHARE : supervised);
  const lrWhy =
    `learning rate ${lr} for a ${width}-wide model (${input.method === "lora" ? "LoRA" : "full"}` +
    `${dpo ? `, DPO: ${DPO_LR_SHARE} × the supervised rate` : ""})`;

  // More distinct text to absorb wants a larger update; the rank never exceeds a quarter of the width.
  const tokens = input.characters / 4;
  const wanted = tokens < 200_000 ? 32 : 64;
  const loraRank = Math.max(4, Math.min(wanted, Math.floor(width / 4)));
  const rankWhy = `LoRA rank ${loraRank} for about ${Math.round(tokens)} tokens of pairs on a ${width}-wide model`;

  return { epochs, lr, loraRank, reasons: { epochs: epochsWhy, lr: lrWhy, loraRank: rankWhy } };
}

/** Reads the model's shape from its GGUF header. */
/** A GGUF model's `general.architecture` (the header only). */
export async function readModelArchitecture(modelPath: string): Promise<string> {
  const { metadata } = await readGgufFileInfo(modelPath, { readTensorInfo: false, logWarnings: false });
  return metadata.general?.architecture ?? "llama";
}

export async function readModelShape(modelPath: string): Promise<ModelShape> {
  const { metadata } = await readGgufFileInfo(modelPath, { readTensorInfo: false, logWarnings: false });
  const architecture = metadata.general?.architecture ?? "llama";
  const fields =
    (metadata as unknown as Record<string, Record<string, unknown> | undefined>)[architecture] ?? {};
  const number = (value: unknown, fallback: number) =>
    typeof value === "number" && Number.isFinite(value) && value > 0 ? value : fallback;
  return {
    embeddingLength: number(fields.embedding_length, 576),
    contextLength: number(fields.context_length, 2048),
  };
}

function clamp(value: number, min: number, max: number): number {
  return Math.min(max, Math.max(min, value));
}

/** Two significant digits, so that config shows 0.0021 rather than 0.002121320343559642. */
function roundRate(rate: number): number {
  return Number(rate.toPrecision(2));
}
