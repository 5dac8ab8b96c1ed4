/**
 * A run's examples before and after training: `prepareSamples` writes the files its trainer reads
 * (formatted for the base model, the held-out split drawn with the run's seed), and
 * `writeExampleLosses` joins them with the trainer's per-example losses once the run is READY.
 */
import fsp from "node:fs/promises";
import type { DatasetService } from "../datasets/DatasetService.ts";
import type { ModelRef } from "../model/types.ts";
import type { Run, RunConfig } from "../domain/runs.ts";
import type { PlanSettings } from "./core/trainingPlan.ts";
import { fileLines, LineWriter, writeExampleFiles, type ExampleFiles } from "./exampleFiles.ts";
import type { ExampleLoss } from "./core/trainerJob.ts";

/** Pairs a dataset needs before `evalFraction` of them are held out for eval loss (the scheduler's default). */
export const DEFAULT_MIN_PAIRS_FOR_EVAL = 50;

/**
 * What a run's plan reads of its config: the same when it is created (its estimate) and when its trainer job is
 * built. Windows are packed, but for preference tuning.
 */
export function planSettingsOf(config: RunConfig, maxTrainTokens: number | null): PlanSettings {
  return {
    seed: config.seed,
    contextSize: config.contextSize,
    // Preference tuning compares two whole answers: each example is a window of its own.
    packing: config.dpo === undefined,
    epochs: config.epochs,
    maxSteps: config.steps ?? null,
    maxTrainTokens,
  };
}

/** Writes a run's training (and validation) examples for `base` into `dir`; the scheduler's seam for tests. */
export type SamplePreparer = (run: Run, base: ModelRef, dir: string) => Promise<ExampleFiles>;

/** The dataset's pairs of a run, formatted for its base model, in files under `dir`. Throws when none are left. */
export async function prepareSamples(
  datasets: DatasetService,
  run: Pick<Run, "userId" | "datasetId" | "config">,
  base: ModelRef,
  dir: string,
  /** Minimum pairs before some are held out for eval loss. */
  minPairsForEval: number,
): Promise<ExampleFiles> {
  const config = run.config;
  let examples;
  try {
    examples = await writeExampleFiles(
      datasets,
      base,
      {
        userId: run.userId,
        datasetId: run.datasetId,
        systemPrompt: config.systemPrompt,
        trainOnInputs: config.trainOnInputs ?? true,
        validationFileId: config.validationFileID ?? null,
        evalFraction: config.evalFraction,
        minPairsForEval,
        seed: config.seed,
        preference: config.dpo !== undefined,
      },
      dir,
    );
  } catch (error) {
    throw new Error(`could not read dataset ${run.datasetId}: ${(error as Error).message}`, {
      cause: error,
    });
  }
  if (examples.trainCount === 0)
    throw new Error(`dataset ${run.datasetId} has no IO pairs to train on (was it deleted or emptied?)`);
  return examples;
}

/**
 * Writes every example with its loss, one JSON object per line (`GET /conduit/finetuning/{id}/examples`):
 * the example files and the trainer's losses file (one `{loss, tokens}` line per example, the training
 * examples then the validation ones) are read side by side.
 */
export async function writeExampleLosses(
  file: string,
  examples: ExampleFiles,
  lossesFile: string,
): Promise<void> {
  const temp = `${file}.tmp-${process.pid}`;
  const out = new LineWriter(temp);
  const losses = fileLines(lossesFile);
  try {
    for (const [split, source] of [
      ["train", examples.train],
      ["validation", examples.validation],
    ] as const) {
      if (source === null) continue;
      let index = 0;
      for await (const line of fileLines(source)) {
        const example = JSON.parse(line) as { input: string; output: string };
        const next = await losses.next();
        const loss = next.done ? undefined : (JSON.parse(next.value) as ExampleLoss);
        await out.write(
          JSON.stringify({
            split,
            index: index++,
            input: example.input,
            output: example.output,
            loss: loss?.loss ?? null,
            tokens: loss?.tokens ?? 0,
          }),
        );
      }
    }
    await out.close();
    await fsp.rename(temp, file);
  } finally {
    out.destroy();
    await losses.return(undefined);
    await fsp.rm(temp, { force: true });
  }
}
