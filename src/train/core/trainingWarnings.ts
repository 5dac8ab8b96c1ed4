/** What a finished training run says about how it learned, the same for both trainer backends. */

/** Above this final training loss (nats per trained token) the run gets a warning. */
const HIGH_FINAL_LOSS = 1.0;

/**
 * Eval-loss differences below this are noise (a small eval set, nats per token): `max(0.001, 1%)`. Early stopping
 * counts only drops beyond it as improvements, and the overfitting warning only rises beyond it; the served
 * checkpoint is still the lowest eval loss (`bestCheckpoint.ts`).
 */
export function evalNoise(loss: number): number {
  return Math.max(0.001, 0.01 * loss);
}

/** Plain-words warnings about how a run learned. */
export function trainingWarnings(
  finalTrainLoss: number,
  evals: readonly { epoch: number; step: number; trainLoss: number; evalLoss: number }[],
  best: { loss: number; epoch: number; step: number } | null,
): string[] {
  const warnings: string[] = [];
  if (Number.isFinite(finalTrainLoss) && finalTrainLoss > HIGH_FINAL_LOSS)
    warnings.push(
      `the training loss ended at ${finalTrainLoss.toFixed(2)} nats per token, so the model has not learned ` +
        "the training answers well; train for more epochs, raise the learning rate or the LoRA rank, or check " +
        "that the answers follow from the inputs",
    );
  const last = evals.at(-1);
  if (best !== null && last !== undefined && last.step !== best.step) {
    const atBest = evals.find((e) => e.step === best.step);
    if (
      atBest !== undefined &&
      last.evalLoss > best.loss * 1.05 &&
      last.evalLoss > best.loss + evalNoise(best.loss) &&
      last.trainLoss < atBest.trainLoss
    )
      warnings.push(
        `the eval loss rose from ${best.loss.toFixed(2)} (epoch ${best.epoch}) to ${last.evalLoss.toFixed(2)} ` +
          `while the training loss fell from ${atBest.trainLoss.toFixed(2)} to ${last.trainLoss.toFixed(2)}: the ` +
          `model is memorising the training pairs rather than generalising; the checkpoint of epoch ${best.epoch} ` +
          "is the one served (fewer epochs or early stopping would end sooner)",
      );
  }
  return warnings;
}
