import { runDefaults } from "../../src/domain/runs.ts";
import type { LlamaCppOptions } from "../../src/train/native/llamaCppTrainer.ts";
import type { TorchOptions } from "../../src/train/torch/torchTrainer.ts";
import type { AnyTrainerJob, LearningRateSchedule, TrainerJob } from "../../src/train/trainer.ts";

/**
 * Trainer jobs for tests and benches, written short: a trainer job is complete (the scheduler builds it from a
 * run's stored config), and what a test leaves out here is what a run gets by default (`runDefaults`) with
 * the scheduler's own choices (AdamW, packing, no weight decay, one thread, on the CPU).
 */
export type JobInput = Partial<Omit<TrainerJob, "trainer" | "options" | "lrSchedule">> &
  Pick<TrainerJob, "baseModelPath" | "outputPath" | "workDir" | "learningRate" | "epochs"> & {
    lrSchedule?: Partial<LearningRateSchedule>;
  };

function common(input: JobInput): Omit<TrainerJob, "trainer" | "options"> {
  const method = input.method ?? runDefaults.method;
  if (method === "lora" && !input.lora) throw new Error("a LoRA job needs its rank, alpha and targets");
  return {
    method,
    lora: null,
    samples: [],
    samplesFile: null,
    evalSamples: [],
    evalSamplesFile: null,
    lossesFile: null,
    maxTrainTokens: null,
    earlyStoppingPatience: null,
    checkpointDir: null,
    packing: true,
    optimizer: "adamw",
    maxSteps: null,
    complexity: runDefaults.complexity,
    contextSize: runDefaults.contextSize,
    threads: 1,
    // A LoRA run's adapter is Q8_0 by default (CONDUIT_ADAPTER_TYPE); the trainers' own tests compare trained
    // values to F16's rounding, so their adapters are F16 unless a test asks otherwise.
    outputType: method === "lora" ? "F16" : runDefaults.outputType,
    seed: runDefaults.seed,
    weightDecay: 0,
    preference: null,
    ...input,
    lrSchedule: {
      kind: runDefaults.lrSchedule,
      warmupSteps: 0,
      minFraction: runDefaults.lrMinFraction,
      ...input.lrSchedule,
    },
  };
}

/** A job for the llama.cpp trainer, on the CPU without a BLAS backend unless `options` say otherwise. */
export function llamaCppJob(input: JobInput & { options?: Partial<LlamaCppOptions> }): AnyTrainerJob {
  const { options, ...rest } = input;
  const job = common(rest);
  return {
    ...job,
    trainer: "llama.cpp",
    options: { device: "cpu", gpuLayers: 0, blasLibrary: null, blasThreads: job.threads, ...options },
  };
}

/** A job for the torch trainer with `options.python`, on the CPU in F32 unless `options` say otherwise. */
export function torchJob(
  input: JobInput & { options: Pick<TorchOptions, "python"> & Partial<TorchOptions> },
): AnyTrainerJob {
  const { options, ...rest } = input;
  return {
    ...common(rest),
    trainer: "torch",
    options: {
      device: "cpu",
      dtype: "f32",
      probe: null,
      cacheDir: null,
      ranks: 1,
      nodes: 1,
      rendezvous: null,
      windowsPerStep: (options.ranks ?? 1) * (options.nodes ?? 1),
      ...options,
    },
  };
}
