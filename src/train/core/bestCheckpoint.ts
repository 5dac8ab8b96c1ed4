/**
 * Which evaluation's weights a run serves, and when early stopping ends it: the same rule on every trainer (the
 * torch worker's `BestTracker` in `torch/worker.py` is its Python twin, tested against the same cases).
 *
 * The best checkpoint is the one with the lowest eval loss, and it is the one served: a later evaluation
 * replaces it only with a loss as low or lower. Early stopping counts the evaluations in a row that did not drop
 * beyond `evalNoise` of the lowest so far, so a run whose eval loss only wobbles stops, while the weights it
 * serves are still the lowest it measured.
 */
import type { CheckpointState } from "./checkpoint.ts";
import { evalNoise } from "./trainingWarnings.ts";

export type BestEvaluation = NonNullable<CheckpointState["best"]>;

export class BestCheckpoint {
  best: BestEvaluation | null;
  /** Evaluations in a row without a drop beyond the noise margin. */
  evalsSinceBest: number;
  /** Set once `patience` evaluations in a row did not improve. */
  stopped = false;
  private lowest: number | undefined;

  constructor(
    /** Evaluations without an improvement before training stops; `null` for never. */
    private readonly patience: number | null,
    resume?: Pick<CheckpointState, "best" | "evalsSinceBest" | "lowestEvalLoss">,
  ) {
    this.best = resume?.best ?? null;
    this.evalsSinceBest = resume?.evalsSinceBest ?? 0;
    this.lowest = resume?.lowestEvalLoss ?? resume?.best?.loss;
  }

  /** Records an evaluation; returns true when its weights are the new best, to keep (and serve). */
  observe(loss: number, epoch: number, step: number): boolean {
    const lowest = this.lowest;
    if (lowest === undefined || loss < lowest - evalNoise(lowest)) this.evalsSinceBest = 0;
    else {
      this.evalsSinceBest += 1;
      if (this.patience !== null && this.evalsSinceBest >= this.patience) this.stopped = true;
    }
    this.lowest = lowest === undefined ? loss : Math.min(lowest, loss);
    if (this.best !== null && loss > this.best.loss) return false;
    this.best = { loss, epoch, step };
    return true;
  }

  /** What a checkpoint keeps of it, to resume with. */
  state(): Pick<CheckpointState, "best" | "evalsSinceBest" | "lowestEvalLoss"> {
    return {
      best: this.best,
      evalsSinceBest: this.evalsSinceBest,
      ...(this.lowest === undefined ? {} : { lowestEvalLoss: this.lowest }),
    };
  }
}
