import fs from "node:fs";
import path from "node:path";
import type {
  AnyTrainerJob,
  TrainerHandle,
  TrainerHandlers,
  TrainerLauncher,
  TrainerOutcome,
  TrainerProgress,
  TrainingStats,
} from "../../src/train/trainer.ts";

/**
 * One trainer started by the scheduler, driven by the test: it reports progress and logs, writes what a
 * trainer writes and ends when told to, as the real child process would. `kill()` ends it at once
 * (SIGKILL); `cancel()` only asks, and it stops when the test calls {@link FakeTrainerRun.stopAtStepBoundary}.
 */
export class FakeTrainerRun {
  /** The stop requests the scheduler made, in order. */
  readonly stopRequests: ("cancel" | "kill")[] = [];
  readonly handle: TrainerHandle;
  private finish!: (outcome: TrainerOutcome) => void;
  private ended = false;
  private step = 0;
  private readonly stopWaiters: (() => void)[] = [];

  constructor(
    readonly job: AnyTrainerJob,
    private readonly handlers: TrainerHandlers,
  ) {
    const done = new Promise<TrainerOutcome>((resolve) => (this.finish = resolve));
    this.handle = {
      pid: undefined,
      cancel: () => this.requestStop("cancel"),
      kill: () => {
        this.requestStop("kill");
        this.end({ status: "cancelled" });
      },
      done,
    };
  }

  /** Whether the trainer has ended (completed, failed, crashed or stopped). */
  get hasEnded(): boolean {
    return this.ended;
  }

  /** Settles once the scheduler has asked the trainer to stop (a cancel or a kill). */
  stopRequested(): Promise<void> {
    if (this.stopRequests.length > 0) return Promise.resolve();
    return new Promise((resolve) => this.stopWaiters.push(resolve));
  }

  log(line: string): void {
    this.handlers.onLog?.(line);
  }

  /** One more optimizer step, as a progress report. */
  progress(extra: Partial<TrainerProgress> = {}): TrainerProgress {
    this.step += 1;
    const progress: TrainerProgress = {
      step: this.step,
      totalSteps: 10,
      epoch: 1,
      epochs: 1,
      trainLoss: 5 - this.step / 10,
      learningRate: 0.001,
      tokensPerSecond: 100,
      elapsedSeconds: this.step,
      etaSeconds: 10 - this.step,
      ...extra,
    };
    this.handlers.onProgress?.(progress);
    return progress;
  }

  /** Writes the output file and one loss per example (training then validation), and ends `completed`. */
  complete(stats: Partial<TrainingStats> = {}): TrainingStats {
    const examples = [this.job.samplesFile, this.job.evalSamplesFile].flatMap((file) =>
      file ? fs.readFileSync(file, "utf8").split("\n").filter(Boolean) : [],
    );
    if (this.job.lossesFile)
      fs.writeFileSync(
        this.job.lossesFile,
        examples.map((_, i) => JSON.stringify({ loss: 1 + i / 10, tokens: 3 + i })).join("\n") + "\n",
      );
    fs.mkdirSync(path.dirname(this.job.outputPath), { recursive: true });
    // A full run writes a whole model (the scheduler patches its context length); a LoRA run an adapter.
    if (this.job.method === "full") {
      if (!fs.existsSync(this.job.outputPath)) fs.copyFileSync(this.job.baseModelPath, this.job.outputPath);
    } else fs.writeFileSync(this.job.outputPath, Buffer.concat([Buffer.from("GGUF"), Buffer.alloc(60, 1)]));
    const full: TrainingStats = {
      steps: this.step,
      epochs: 1,
      trainTokens: 100,
      sampleTokens: 90,
      lossTokens: 40,
      windowSize: 64,
      finalTrainLoss: 1.5,
      stoppedEarly: false,
      resumedFromStep: 0,
      warnings: [],
      tokensPerSecond: 100,
      trainSeconds: 1,
      elapsedSeconds: 1,
      trainableTensors: 4,
      trainableParameters: 1000,
      outputBytes: fs.statSync(this.job.outputPath).size,
      peakRssBytes: 1,
      ...stats,
    };
    this.end({
      status: "completed",
      outputPath: this.job.outputPath,
      stats: full,
      examples: { train: [], eval: [] },
    });
    return full;
  }

  /**
   * The job fails with the trainer's message (exit code 1), as for a model it cannot load; `outOfSpace` when
   * what failed was a write to a full disk.
   */
  fail(message: string, outOfSpace = false): void {
    this.end({ status: "failed", reason: message, exitCode: 1, signal: null, outOfSpace });
  }

  /** The process dies without a word (a native crash). */
  crash(signal: NodeJS.Signals = "SIGSEGV"): void {
    this.end({ status: "failed", reason: `trainer process was killed by ${signal}`, exitCode: null, signal });
  }

  /** After a `cancel()`: the trainer stops at the next step boundary. */
  stopAtStepBoundary(): void {
    if (!this.stopRequests.includes("cancel")) throw new Error("the trainer was not asked to stop");
    this.end({ status: "cancelled" });
  }

  private requestStop(how: "cancel" | "kill"): void {
    this.stopRequests.push(how);
    for (const resolve of this.stopWaiters.splice(0)) resolve();
  }

  private end(outcome: TrainerOutcome): void {
    if (this.ended) return;
    this.ended = true;
    this.finish(outcome);
  }
}

/** A trainer launcher for the scheduler that starts {@link FakeTrainerRun}s instead of child processes. */
export class FakeTrainer {
  readonly runs: FakeTrainerRun[] = [];
  private readonly waiters: { n: number; resolve: (run: FakeTrainerRun) => void }[] = [];

  readonly launch: TrainerLauncher = (job, handlers) => {
    const run = new FakeTrainerRun(job, handlers);
    this.runs.push(run);
    for (const waiter of this.waiters.filter((w) => w.n === this.runs.length)) waiter.resolve(run);
    return run.handle;
  };

  /** The `n`th trainer started (1-based), once it has been. */
  started(n = 1): Promise<FakeTrainerRun> {
    const run = this.runs[n - 1];
    if (run) return Promise.resolve(run);
    return new Promise((resolve) => this.waiters.push({ n, resolve }));
  }
}
