/**
 * Which trainer trains a run, decided when the run is created and kept in its `config.trainer`: the
 * setting (`CONDUIT_TRAINER`), whether the torch trainer is installed, and what the run needs (a full
 * fine-tune, an architecture, LoRA targets). A run no trainer here can train is refused at creation with
 * the reason, never queued to fail later.
 */
import os from "node:os";
import { ConduitError } from "../errors.ts";
import {
  UNTRAINABLE_LORA_TARGETS,
  type LoraTarget,
  type TrainMethod,
  type TrainerName,
  type TrainerSetting,
} from "../contract/runs.ts";
import { describeTorch, TORCH_SETUP_COMMAND, type TorchStatus } from "./torch/torchStatus.ts";

const GEGLU =
  "its feed-forward layers use GEGLU, which this llama.cpp release cannot differentiate (no backward pass)";

/**
 * Architectures the embedded llama.cpp trainer cannot train, with the reason: in the pinned release only the
 * split SwiGLU gate has a backward pass (`ggml_compute_backward`, `GGML_OP_GLU`); these use another gate
 * (read from its `src/models/*.cpp`).
 */
export const LLAMA_CPP_UNTRAINABLE_ARCHITECTURES: Readonly<Record<string, string>> = {
  gemma: GEGLU,
  gemma2: GEGLU,
  gemma3: GEGLU,
  gemma3n: GEGLU,
  gemma4: GEGLU,
  "gemma4-assistant": GEGLU,
  "gemma-embedding": GEGLU,
  grok: GEGLU,
  spark2_5: GEGLU,
  bert: GEGLU,
  "modern-bert": GEGLU,
  nemotron_h:
    "its feed-forward layers use a squared-ReLU gate, which this llama.cpp release cannot differentiate",
  nemotron_h_moe:
    "its feed-forward layers use a squared-ReLU gate, which this llama.cpp release cannot differentiate",
};

export interface TrainerChoiceInput {
  setting: TrainerSetting;
  torch: TorchStatus;
  method: TrainMethod;
  /** The base model's `general.architecture`. */
  architecture: string;
  /** The LoRA targets the request named; `undefined` when it named none (the trainer's defaults). */
  targets: readonly LoraTarget[] | undefined;
}

export interface TrainerChoice {
  trainer: TrainerName;
  /** One sentence for the run's log: which trainer, and why. */
  reason: string;
}

/** Picks the run's trainer, or throws a 400 naming what stands in the way and what would help. */
export function chooseTrainer(input: TrainerChoiceInput): TrainerChoice {
  const { setting, torch, method, architecture, targets } = input;
  const untrainable = LLAMA_CPP_UNTRAINABLE_ARCHITECTURES[architecture];
  const kv = (targets ?? []).filter((t) => (UNTRAINABLE_LORA_TARGETS as readonly string[]).includes(t));
  /** Why the llama.cpp trainer cannot train this run, or undefined when it can. */
  const llamaCppCannot =
    untrainable !== undefined
      ? {
          param: "baseModelName",
          why: `the llama.cpp trainer cannot train ${architecture} models: ${untrainable}`,
        }
      : kv.length > 0
        ? {
            param: "loraTargets",
            why:
              `the llama.cpp trainer cannot train ${kv.map((t) => `"${t}"`).join(" and ")}: this llama.cpp release ` +
              "gives the attention K and V weights no gradient (K and V pass through the KV cache)",
          }
        : undefined;
  /** Why the torch trainer cannot train this run, or undefined when it can. */
  const torchCannot =
    method === "full"
      ? { param: "method", why: 'the torch trainer trains LoRA adapters only ("method": "lora")' }
      : !torch.available
        ? { param: "baseModelName", why: `the torch trainer is not available: ${torch.reason}` }
        : undefined;
  const refuse = (first: { param: string; why: string }, second?: { param: string; why: string }): never => {
    throw new ConduitError(
      "invalid_request",
      `no trainer here can train this run: ${first.why}${second === undefined ? "" : `; ${second.why}`}`,
      { param: first.param },
    );
  };

  if (setting === "llama.cpp") {
    if (llamaCppCannot !== undefined)
      refuse({
        ...llamaCppCannot,
        why: `${llamaCppCannot.why} (CONDUIT_TRAINER is llama.cpp; the torch trainer can: ${TORCH_SETUP_COMMAND}, then CONDUIT_TRAINER=auto)`,
      });
    return { trainer: "llama.cpp", reason: "trainer: llama.cpp (CONDUIT_TRAINER)" };
  }
  if (setting === "torch") {
    if (torchCannot !== undefined)
      refuse({ ...torchCannot, why: `${torchCannot.why} (CONDUIT_TRAINER is torch)` });
    return {
      trainer: "torch",
      reason: `trainer: torch (CONDUIT_TRAINER), ${describeTorch(onlyAvailable(torch))}`,
    };
  }
  if (torchCannot === undefined)
    return {
      trainer: "torch",
      reason: `trainer: torch (auto: it is installed), ${describeTorch(onlyAvailable(torch))}`,
    };
  if (llamaCppCannot === undefined)
    return {
      trainer: "llama.cpp",
      reason: `trainer: llama.cpp (auto: ${method === "full" ? torchCannot.why : `no torch trainer here (${TORCH_SETUP_COMMAND} adds one)`})`,
    };
  return refuse(llamaCppCannot, torchCannot);
}

/**
 * A trainer's compute threads: the setting (`CONDUIT_TRAIN_THREADS`), or with `auto` every core for the torch
 * trainer and 1 for llama.cpp's (more threads do not pay there).
 */
export function trainerThreads(trainer: TrainerName, setting: number | "auto"): number {
  if (setting !== "auto") return setting;
  return trainer === "torch" ? os.availableParallelism() : 1;
}

function onlyAvailable(torch: TorchStatus) {
  if (!torch.available) throw new Error("the torch trainer is not available");
  return torch.probe;
}
