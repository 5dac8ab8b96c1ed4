import { randomBytes } from "node:crypto";
import fsp from "node:fs/promises";
import os from "node:os";
import path from "node:path";
import type { Logger } from "pino";
import type { DatasetService } from "../datasets/DatasetService.ts";
import { readGgufFileInfo } from "node-llama-cpp";
import { writeGgufUint32 } from "../model/gguf/GgufPatch.ts";
import { isOutOfSpace, OUT_OF_SPACE_RUN } from "../errors.ts";
import type { BlobStore } from "../store/BlobStore.ts";
import { DatabaseHealth } from "../store/DatabaseHealth.ts";
import type { RunRepository } from "../store/RunRepository.ts";
import { timestamp } from "../domain/time.ts";
import { methodOf, trainerOf, type Run, type RunConfig, type TrainerName } from "../domain/runs.ts";
import type { TrainerBackend, TrainerHost } from "./core/TrainerBackend.ts";
import { CheckpointDir, keptSteps, type KeptCheckpoint } from "./core/checkpoint.ts";
import type { RunCheckpoint } from "../contract/runs.ts";
import type { PreferenceJobOptions, TrainerJob, TrainerProgress, TrainingStats } from "./core/trainerJob.ts";
import type { ModelCatalog } from "./RunService.ts";
import type { RunEventBus } from "./runEvents.ts";
import {
  DEFAULT_MIN_PAIRS_FOR_EVAL,
  planSettingsOf,
  prepareSamples,
  writeExampleLosses,
  type SamplePreparer,
} from "./prepareSamples.ts";
import type { ExampleFiles } from "./exampleFiles.ts";
import { trainers, type AnyTrainerJob, type TrainerOptions } from "./trainers.ts";
import {
  startTrainer,
  type TrainerHandle,
  type TrainerHandlers,
  type TrainerLauncher,
  type TrainerOutcome,
} from "./trainer.ts";

export interface SchedulerOptions {
  /** Runs trained at once by this process. Defaults to `1`. */
  concurrency: number;
  /** What this server offers its trainers: their threads, where it computes, the libraries they load. */
  host: TrainerHost;
  /** How long a claimed run stays ours without a heartbeat. Defaults to `30000` ms. */
  leaseMs?: number;
  /** Heartbeat and queue poll interval. Defaults to `2000` ms. */
  pollMs?: number;
  /** Starts before a run whose trainer keeps dying is FAILED. Defaults to `3`. */
  maxAttempts?: number;
  /** Minimum pairs before some are held out for eval loss. Defaults to `50`. */
  minPairsForEval?: number;
  /** Most tokens a run may train on (`CONDUIT_MAX_RUN_TOKENS`); a run over it fails before its first step. Defaults to no limit. */
  maxRunTokens?: number;
  /** Starts a run's trainer (tests pass an in-memory fake). Defaults to `startTrainer`, a child process per run. */
  trainer?: TrainerLauncher;
  /**
   * Writes a run's examples, formatted for its base model, to the files its trainer reads (tests wrap it to
   * hold a run in preparation). Defaults to `prepareSamples` on the run's dataset.
   */
  prepareSamples?: SamplePreparer;
  /**
   * The database's outages as this process sees them: a run's end, log and stats wait one out instead of being
   * lost, and expired leases are judged only once the database has been back for a lease's length. Defaults to
   * a tracker of the scheduler's own.
   */
  health?: DatabaseHealth;
}

type StopReason = "cancel" | "pause" | "shutdown" | "lost";

/** A LoRA run's config. */
type LoraConfig = Extract<RunConfig, { method: "lora" }>;

interface ActiveRun {
  run: Run;
  handle?: TrainerHandle;
  /**
   * Why the run is being stopped: cancelled (or deleted) by a user, paused by a user (its checkpoint is kept for
   * when it is resumed), the server shutting down, or `lost`: this worker no longer holds the run's lease (its
   * heartbeat failed, or the run was re-queued), so the run and its files now belong to another attempt and are
   * left alone.
   */
  stopping?: StopReason;
  /** Settles once `train` is done with the run, trainer or not. */
  done?: Promise<void>;
}

/**
 * Starts queued runs: claims them from the runs table (the job queue), trains each in a trainer
 * child process, keeps the lease alive, mirrors logs and stats into the run, and ends it READY,
 * FAILED or CANCELLED. Crash recovery: runs whose worker stopped heartbeating are re-queued.
 */
export class Scheduler {
  readonly workerId = `${os.hostname()}-${process.pid}-${randomBytes(3).toString("hex")}`;
  private readonly active = new Map<string, ActiveRun>();
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;
  private closed = false;
  private readonly leaseMs: number;
  private readonly pollMs: number;
  private readonly maxAttempts: number;
  private readonly startTrainer: TrainerLauncher;
  private readonly prepareSamples: SamplePreparer;
  private readonly health: DatabaseHealth;
  /** Each run's last pending log line: its lines are written in order, each waiting out an outage. */
  private readonly logging = new Map<string, Promise<void>>();
  private readonly onChanged = (runId: string) => {
    const active = this.active.get(runId);
    if (active)
      void this.checkCancelled(active).catch((error: unknown) => {
        // The next change or tick looks again.
        if (!this.health.saw(error)) this.log.warn({ err: error, runId }, "cancel check failed");
      });
    else void this.tick();
  };

  constructor(
    private readonly runs: RunRepository,
    private readonly events: RunEventBus,
    private readonly datasets: DatasetService,
    private readonly models: ModelCatalog,
    private readonly blobs: BlobStore,
    private readonly log: Logger,
    private readonly options: SchedulerOptions,
  ) {
    this.leaseMs = options.leaseMs ?? 30_000;
    this.pollMs = options.pollMs ?? 2_000;
    this.maxAttempts = options.maxAttempts ?? 3;
    const minPairsForEval = options.minPairsForEval ?? DEFAULT_MIN_PAIRS_FOR_EVAL;
    this.startTrainer = options.trainer ?? startTrainer;
    this.health = options.health ?? new DatabaseHealth();
    this.prepareSamples =
      options.prepareSamples ??
      ((run, base, dir) => prepareSamples(this.datasets, run, base, dir, minPairsForEval));
  }

  start(): void {
    if (this.options.concurrency <= 0) return;
    this.events.on("changed", this.onChanged);
    this.timer = setInterval(() => void this.tick(), this.pollMs);
    void this.tick();
  }

  /** One pass: recover dead workers' runs, renew our leases, start queued runs while there is room. */
  tick(): Promise<void> {
    this.ticking ??= this.doTick().finally(() => (this.ticking = undefined));
    return this.ticking;
  }

  /** The last tick found the database away (said once in the log, and once when it is back). */
  private waitingForDatabase = false;

  private async doTick(): Promise<void> {
    try {
      // A lease that ran out while the database was away says nothing of its worker (none could renew one):
      // leases are judged only once the database has been back for a lease's length.
      if (this.health.upFor(this.leaseMs)) {
        // A dead attempt's work directory is of no use to the next one (which resumes from the checkpoint):
        // it goes before the run is QUEUED again, while no worker can claim it.
        const { failed } = await this.runs.recoverExpired(this.maxAttempts, async (runId) => {
          await this.blobs.remove(`runs/${runId}/work`);
          const step = await checkpointStep(this.blobs.pathOf(`runs/${runId}/checkpoint`));
          return step === undefined
            ? "it starts again from the base model (it had written no checkpoint)"
            : `it resumes from its checkpoint at step ${step}`;
        });
        for (const runId of failed) this.events.emit("ended", runId, "FAILED");
      }
      for (const active of this.active.values()) await this.renew(active);
      while (!this.closed && this.active.size < this.options.concurrency) {
        const run = await this.runs.claimNext(this.workerId, this.leaseMs);
        if (!run) break;
        const active: ActiveRun = { run };
        this.active.set(run.id, active);
        active.done = this.train(active)
          .catch((error: unknown) => this.log.error({ err: error, runId: run.id }, "run ended badly"))
          .finally(() => {
            this.active.delete(run.id);
            if (!this.closed) void this.tick();
          });
      }
      if (this.waitingForDatabase) {
        this.waitingForDatabase = false;
        this.log.info("the database is back: runs start again");
      }
    } catch (error) {
      if (!this.health.saw(error)) this.log.error({ err: error }, "scheduler tick failed");
      else if (!this.waitingForDatabase) {
        this.waitingForDatabase = true;
        this.log.warn("the database is unavailable: no run starts until it is back");
      }
      return;
    }
  }

  private async renew(active: ActiveRun): Promise<void> {
    if (!(await this.runs.heartbeat(active.run.id, this.workerId, this.leaseMs)))
      this.stop(active, await this.whyGone(active.run.id));
  }

  private async checkCancelled(active: ActiveRun): Promise<void> {
    const run = await this.runs.getById(active.run.id);
    if (!run || run.status === "CANCELLED") this.stop(active, "cancel");
    else if (run.status === "PAUSED") this.stop(active, "pause");
    else if (run.status !== "RUNNING") this.stop(active, "lost");
  }

  /** Why a run this worker held is no longer its own: cancelled, deleted or paused by a user, or taken over. */
  private async whyGone(runId: string): Promise<"cancel" | "pause" | "lost"> {
    const run = await this.runs.getById(runId);
    return !run || run.status === "CANCELLED" ? "cancel" : run.status === "PAUSED" ? "pause" : "lost";
  }

  private stop(active: ActiveRun, why: StopReason): void {
    if (active.stopping) return;
    active.stopping = why;
    // A user's stop waits for a step boundary; the others do not wait.
    if (why === "cancel" || why === "pause") active.handle?.cancel();
    else active.handle?.kill();
  }

  /** Appends a line to a run's log, after its earlier lines, waiting out an outage of the database. */
  private appendLog(runId: string, message: string): Promise<void> {
    const line = (this.logging.get(runId) ?? Promise.resolve())
      .then(() => this.persist(() => this.runs.appendLog(runId, message)))
      .then(
        () => undefined,
        (error: unknown) => this.log.warn({ err: error, runId }, "run log failed"),
      );
    this.logging.set(runId, line);
    void line.then(() => {
      if (this.logging.get(runId) === line) this.logging.delete(runId);
    });
    return line;
  }

  /** A write that must not be lost: tried again while the database is unavailable, until the server stops. */
  private persist<T>(work: () => Promise<T>): Promise<T> {
    return this.health.retry(work, () => this.closed);
  }

  /**
   * Trains a claimed run, in phases: prepare its examples, build its trainer job, run the trainer while
   * recording its progress, then settle the run by how the trainer ended.
   */
  private async train(active: ActiveRun): Promise<void> {
    const startedAt = performance.now();
    const { run } = active;
    const config = run.config;
    const lora = methodOf(run.config) === "lora" && config.method === "lora" ? config : undefined;
    const runDir = `runs/${run.id}`;
    const workDir = this.blobs.pathOf(`${runDir}/work`);
    const files: RunFiles = {
      runDir,
      workDir,
      lossesPath: `${workDir}/losses.jsonl`,
      // Kept across attempts (a restart resumes from it); removed once the run has ended.
      checkpointDir: `${runDir}/checkpoint`,
      // A LoRA run keeps only its adapter; it is served on the shared base model.
      outputPath: this.blobs.pathOf(`${runDir}/${lora ? "adapter" : "model"}.gguf`),
    };
    /** Set once the run turns out to be another attempt's: then nothing of its files is touched. */
    let lost = false;
    const leaveToTheNewAttempt = async () => {
      lost = true;
      await this.leaveToTheNewAttempt(run);
    };
    try {
      await this.appendLog(run.id, `training started on ${this.workerId} (attempt ${run.attempts})`);
      // The attempt's stats start afresh, with its start: the estimate counts down from it until the first step.
      const attemptStartedAt = timestamp();
      await this.runs
        .updateStats(run.id, this.workerId, { startedAt: attemptStartedAt })
        .catch((error: unknown) => this.health.saw(error));
      const base = this.models.resolve(config.baseModelName);
      if (!base) throw new Error(`base model "${config.baseModelName}" is no longer available`);
      const examples = await this.prepareSamples(run, base, files.workDir);
      await this.logExamples(run, examples, base.id);
      const job = await this.trainerJob(run, lora, base.path, examples, files);
      const progress = new ProgressRecorder(run.id, this.workerId, this.runs, this.events, attemptStartedAt);
      // Stopped while being prepared: no trainer to stop, and the run ends as a stopped trainer's would.
      const outcome = active.stopping
        ? ({ status: "cancelled" } as const)
        : await this.runTrainer(active, job, {
            onLog: (line) => void this.appendLog(run.id, line),
            onProgress: (p) => progress.record(p),
          });
      if (outcome.status === "completed") {
        if (!lora) await restoreContextLength(base.path, files.outputPath);
        const writing = performance.now();
        await writeExampleLosses(this.blobs.pathOf(`${runDir}/examples.jsonl`), examples, files.lossesPath);
        await this.appendLog(
          run.id,
          `saved each example's loss for the examples endpoint in ${((performance.now() - writing) / 1000).toFixed(1)} s`,
        );
        const checkpoints = await keepCheckpoints(this.blobs.pathOf(files.checkpointDir), files.outputPath);
        // The whole attempt, not just the trainer's part: what a run's estimate plans.
        await this.persist(() =>
          progress.writeFinal(outcome.stats, (performance.now() - startedAt) / 1000, checkpoints),
        );
        if (!(await this.finishReady(run, outcome.stats.outputBytes, lora !== undefined, base.id, files)))
          await leaveToTheNewAttempt();
      } else if (active.stopping === "lost") {
        await leaveToTheNewAttempt();
      } else if (active.stopping === "shutdown") {
        // The run is released back to the queue by close(); its checkpoint stays for the next attempt.
      } else if (active.stopping === "pause") {
        await this.endPaused(active, files);
      } else if (outcome.status === "cancelled" || active.stopping === "cancel") {
        await this.endCancelled(active, runDir);
      } else {
        if (!(await this.fail(run, outcome.reason, outcome.outOfSpace === true)))
          await leaveToTheNewAttempt();
      }
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      if (this.health.saw(error)) {
        // Not the run's fault: it goes back to the queue (its checkpoint kept) once the database is back.
        if (await this.persist(() => this.runs.release(run.id, this.workerId)))
          await this.appendLog(run.id, `run re-queued: the database was unavailable (${reason})`);
      } else if (!(await this.fail(run, reason, isOutOfSpace(error)))) await leaveToTheNewAttempt();
    } finally {
      if (!lost) await fsp.rm(files.workDir, { recursive: true, force: true }).catch(() => undefined);
    }
  }

  /** Logs that this worker lost the run's lease and leaves its files to the attempt that has it now. */
  private async leaveToTheNewAttempt(run: Run): Promise<void> {
    this.log.warn({ runId: run.id }, "lost the run's lease; trainer stopped");
    await this.appendLog(
      run.id,
      `${this.workerId} lost this run's lease (its heartbeat failed and the run was taken back); ` +
        `it stopped its trainer and leaves the run's files to the new attempt`,
    );
  }

  /** The run's log line about what it trains on (and one about examples trained in full, if any). */
  private async logExamples(run: Run, examples: ExampleFiles, baseId: string): Promise<void> {
    const config = run.config;
    await this.appendLog(
      run.id,
      `${examples.trainCount} training conversations` +
        (examples.validationCount === 0
          ? ""
          : examples.validationSource === "file"
            ? `, ${examples.validationCount} from validation file ${config.validationFileID} for eval loss`
            : `, ${examples.validationCount} held out for eval loss`) +
        `; ${config.trainOnInputs ? "trained on whole conversations (trainOnInputs)" : "trained on the answers only"}` +
        `; base model ${baseId}`,
    );
    if (examples.unsplit > 0)
      await this.appendLog(
        run.id,
        `${examples.unsplit} examples are trained on in full: the chat template's text did not show where their answer starts`,
      );
  }

  /** The trainer job of a run: its config, its prepared files, and where and with what this worker trains. */
  private trainerJob(
    run: Run,
    lora: LoraConfig | undefined,
    basePath: string,
    examples: ExampleFiles,
    files: RunFiles,
  ): Promise<AnyTrainerJob> {
    // The job built for trainer N is the registry's job for N, which TypeScript cannot follow through the union.
    return this.jobFor(
      trainerOf(run.config),
      run.config,
      lora,
      basePath,
      examples,
      files,
    ) as Promise<AnyTrainerJob>;
  }

  /** {@link trainerJob} on the run's trainer, whose options it asks for on this worker. */
  private async jobFor<N extends TrainerName>(
    trainer: N,
    config: RunConfig,
    lora: LoraConfig | undefined,
    basePath: string,
    examples: ExampleFiles,
    files: RunFiles,
  ): Promise<TrainerJob<TrainerOptions<N>> & { trainer: N }> {
    const backend: TrainerBackend<TrainerOptions<N>> = trainers[trainer];
    const host = this.options.host;
    const status = await backend.status(host);
    if (!status.available)
      throw new Error(
        `this run was created for the ${trainer} trainer, which ${this.workerId} cannot run: ${status.reason}`,
      );
    return {
      trainer,
      options: await backend.jobOptions(host),
      method: lora ? "lora" : "full",
      lora: lora ? { rank: lora.loraRank, alpha: lora.loraAlpha, targets: lora.loraTargets } : null,
      baseModelPath: basePath,
      outputPath: files.outputPath,
      workDir: files.workDir,
      samples: [],
      samplesFile: examples.train,
      evalSamples: [],
      evalSamplesFile: examples.validation,
      lossesFile: files.lossesPath,
      ...planSettingsOf(config, this.options.maxRunTokens ?? null),
      earlyStoppingPatience: config.earlyStoppingPatience ?? null,
      checkpointDir: this.blobs.pathOf(files.checkpointDir),
      optimizer: "adamw",
      learningRate: config.lr,
      complexity: config.complexity,
      threads: backend.threads(host.threads),
      outputType: config.outputType,
      lrSchedule: { kind: config.lrSchedule, warmupSteps: 0, minFraction: config.lrMinFraction },
      weightDecay: 0,
      preference: await this.preferenceOf(config),
    };
  }

  /**
   * A `dpo` run's preference settings: its β and the adapter it starts from (its starting run's, which must
   * still be READY with its file); `null` for a supervised run.
   */
  private async preferenceOf(config: RunConfig): Promise<PreferenceJobOptions | null> {
    const dpo = config.dpo;
    if (dpo === undefined) return null;
    if (dpo.fromRunID === null) return { beta: dpo.beta, initAdapterPath: null };
    const from = await this.runs.getById(dpo.fromRunID);
    if (from?.status !== "READY" || !from.modelPath)
      throw new Error(
        `run ${dpo.fromRunID}, whose adapter this run starts from, is ${from ? from.status : "deleted"}: ` +
          "its adapter is gone",
      );
    return { beta: dpo.beta, initAdapterPath: from.modelPath };
  }

  /**
   * Ends a trained run READY (its checkpoint removed); false when the run is another attempt's now. A run
   * cancelled (or deleted) while its files were being written loses them.
   */
  private async finishReady(
    run: Run,
    outputBytes: number,
    isLora: boolean,
    baseId: string,
    files: RunFiles,
  ): Promise<boolean> {
    await this.blobs.remove(files.checkpointDir);
    const finished = await this.persist(() =>
      this.runs.finish(run.id, this.workerId, {
        status: "READY",
        modelPath: files.outputPath,
        message: isLora
          ? `run READY: served as "${run.id}" (LoRA adapter of ${(outputBytes / 2 ** 20).toFixed(2)} MiB on ${baseId})`
          : `run READY: the fine-tuned model is served as "${run.id}"`,
      }),
    );
    if (finished) this.events.emit("ended", run.id, "READY");
    else if ((await this.persist(() => this.whyGone(run.id))) === "cancel")
      await this.blobs.remove(files.runDir);
    else return false;
    return true;
  }

  /**
   * A run stopped by a cancel (or before its trainer started): its files go, and its end is told. The run's own
   * log said so with the cancel (a line after the final status could be missed by a follower), so this goes to
   * the server's log.
   */
  private async endCancelled(active: ActiveRun, runDir: string): Promise<void> {
    const run = active.run;
    await this.blobs.remove(runDir);
    this.log.info(
      { runId: run.id },
      `${active.handle ? "trainer stopped" : "stopped before its trainer started"}; partial artifacts removed`,
    );
    // Cancelled by a user of this or another process (not a lost lease: the run goes on elsewhere).
    if ((await this.persist(() => this.runs.getById(run.id)))?.status === "CANCELLED")
      this.events.emit("ended", run.id, "CANCELLED");
  }

  /**
   * A run paused by a user, its trainer stopped: its checkpoint stays for when it is resumed, and the run is let
   * go (the next queued run takes the trainer). A run cancelled or deleted while it was pausing loses its files.
   */
  private async endPaused(active: ActiveRun, files: RunFiles): Promise<void> {
    const run = active.run;
    const step = await checkpointStep(this.blobs.pathOf(files.checkpointDir));
    const message =
      step === undefined
        ? "run paused: its trainer stopped before it had written a checkpoint; once resumed it starts again from the base model"
        : `run paused: its trainer stopped; once resumed it goes on from its checkpoint at step ${step}`;
    if (await this.persist(() => this.runs.settlePaused(run.id, this.workerId, message))) return;
    const now = await this.persist(() => this.runs.getById(run.id));
    if (!now || now.status === "CANCELLED") {
      await this.blobs.remove(files.runDir);
      if (now) this.events.emit("ended", run.id, "CANCELLED");
    }
  }

  /** Starts the run's trainer and waits for it; a stop that came while it was starting reaches it. */
  private async runTrainer(
    active: ActiveRun,
    job: AnyTrainerJob,
    handlers: TrainerHandlers,
  ): Promise<TrainerOutcome> {
    const handle = this.startTrainer(job, handlers);
    active.handle = handle;
    if (active.stopping === "cancel" || active.stopping === "pause") handle.cancel();
    else if (active.stopping !== undefined) handle.kill();
    return handle.done;
  }

  /** Fails a run this worker holds; returns false (touching nothing) when it is another attempt's now. */
  private async fail(run: Run, detail: string, outOfSpace = false): Promise<boolean> {
    const held = await this.persist(() => this.runs.heartbeat(run.id, this.workerId, this.leaseMs));
    if (!held && (await this.persist(() => this.whyGone(run.id))) === "lost") return false;
    this.log.warn({ runId: run.id, reason: detail }, "run failed");
    // A full disk is told as the API tells it (507 insufficient_storage); the system's own text (paths
    // included) stays in the server's log.
    const reason = outOfSpace ? OUT_OF_SPACE_RUN : detail;
    // The reason goes in the log before the status changes, so whoever sees FAILED finds it.
    await this.appendLog(run.id, `run failed: ${reason}`);
    if (
      await this.persist(() => this.runs.finish(run.id, this.workerId, { status: "FAILED", error: reason }))
    )
      this.events.emit("ended", run.id, "FAILED");
    // Nothing of a failed or cancelled run is kept (no empty directory either).
    await this.blobs.remove(`runs/${run.id}`).catch(() => undefined);
    return true;
  }

  /** Stops trainers and hands their runs back to the queue, so another start picks them up. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.events.off("changed", this.onChanged);
    await this.ticking;
    const running = [...this.active.values()];
    for (const active of running) this.stop(active, "shutdown");
    // Waits for `train` itself, not just the trainer: a run still being prepared has none yet,
    // and must be finished with the database before it closes.
    await Promise.all(running.map((active) => active.done));
    for (const active of running) {
      const released = await this.runs.release(active.run.id, this.workerId).catch((error: unknown) => {
        // Its lease runs out, and the next server to start (or another one) takes it back.
        this.log.warn({ err: error, runId: active.run.id }, "could not re-queue the run at shutdown");
        return false;
      });
      if (released)
        await this.appendLog(active.run.id, "run re-queued: the server shut down while it was training");
    }
  }
}

/**
 * llama.cpp's save writes the training window as the model's context length; the fine-tuned
 * model can attend as far as its base, so the base's value is put back (in place, same size).
 */
async function restoreContextLength(basePath: string, outputPath: string): Promise<void> {
  const { metadata } = await readGgufFileInfo(basePath, { readTensorInfo: false, logWarnings: false });
  const architecture = metadata.general?.architecture;
  if (!architecture) return;
  const base = (metadata as unknown as Record<string, { context_length?: unknown } | undefined>)[architecture]
    ?.context_length;
  if (typeof base === "number") await writeGgufUint32(outputPath, `${architecture}.context_length`, base);
}

/**
 * Moves a trained run's kept epoch-end checkpoints out of its checkpoint directory (removed once it is READY) to
 * `checkpoints/` beside its output, and returns them, oldest first. A checkpoint whose files are not both
 * there is left out.
 */
async function keepCheckpoints(checkpointDir: string, outputPath: string): Promise<RunCheckpoint[]> {
  const from = new CheckpointDir(checkpointDir).keptDir;
  const steps = keptSteps(from);
  if (steps.length === 0) return [];
  const to = path.join(path.dirname(outputPath), "checkpoints");
  await fsp.rm(to, { recursive: true, force: true });
  await fsp.rename(from, to);
  const kept: RunCheckpoint[] = [];
  for (const step of steps) {
    const json = path.join(to, `step-${step}.json`);
    const weights = await fsp.stat(path.join(to, `step-${step}.gguf`)).catch(() => undefined);
    const meta = await fsp
      .readFile(json, "utf8")
      .then((text) => JSON.parse(text) as KeptCheckpoint)
      .catch(() => undefined);
    if (!weights?.isFile() || meta === undefined) continue;
    kept.push({
      step: meta.step,
      epoch: meta.epoch,
      trainLoss: meta.trainLoss,
      ...(meta.evalLoss === undefined ? {} : { evalLoss: meta.evalLoss }),
      createdAt: timestamp(weights.mtime),
    });
  }
  return kept;
}

/** The step of a run's latest checkpoint (either trainer's), if it wrote one. */
async function checkpointStep(dir: string): Promise<number | undefined> {
  for (const name of ["latest.json", "torch-latest.json"]) {
    const state = await fsp
      .readFile(`${dir}/${name}`, "utf8")
      .then((text) => JSON.parse(text) as { step?: unknown })
      .catch(() => undefined);
    if (typeof state?.step === "number") return state.step;
  }
  return undefined;
}

/** At most `max` points, evenly thinned, always keeping the latest. */
function thin<T>(points: T[], max: number): T[] {
  if (points.length <= max) return points;
  const stride = points.length / max;
  const out: T[] = [];
  for (let i = 0; i < max - 1; i++) out.push(points[Math.floor(i * stride)] as T);
  out.push(points[points.length - 1] as T);
  return out;
}

/** Where a run's files go: its blob directory, the trainer's work directory, its checkpoint, its output. */
interface RunFiles {
  /** The run's blob directory (`runs/<id>`). */
  runDir: string;
  workDir: string;
  /** Where the trainer writes each example's loss. */
  lossesPath: string;
  /** Blob path of the checkpoint directory, kept across attempts. */
  checkpointDir: string;
  outputPath: string;
}

/**
 * A run's progress as its trainer reports it: told on the event bus, kept as loss series, and written into
 * the run's stats at most about once a second (and at every evaluation).
 */
class ProgressRecorder {
  private lastStatsWrite = 0;
  private readonly lossSeries: { step: number; trainLoss: number }[] = [];
  private readonly evalSeries: { step: number; epoch: number; evalLoss: number }[] = [];
  private latest: TrainerProgress | undefined;

  constructor(
    private readonly runId: string,
    private readonly workerId: string,
    private readonly runs: RunRepository,
    private readonly events: RunEventBus,
    /** When the attempt started (`stats.startedAt`), kept in every write. */
    private readonly startedAt: string,
  ) {}

  record(progress: TrainerProgress): void {
    this.latest = progress;
    this.events.emit("progress", this.runId, progress);
    this.lossSeries.push({ step: progress.step, trainLoss: progress.trainLoss });
    if (progress.evalLoss !== undefined)
      this.evalSeries.push({ step: progress.step, epoch: progress.epoch, evalLoss: progress.evalLoss });
    // A write that fails (the database away) is made good by the next one: the stats are the whole state.
    if (Date.now() - this.lastStatsWrite > 1000 || progress.evalLoss !== undefined)
      void this.write().catch(() => undefined);
  }

  /** The trainer's totals, with the whole attempt's seconds, the best evaluation's and the kept checkpoints. */
  writeFinal(stats: TrainingStats, runSeconds: number, checkpoints: RunCheckpoint[]): Promise<void> {
    const { bestEpoch, bestStep, bestEvalLoss, warnings, stoppedEarly } = stats;
    return this.write({
      final: { ...stats, runSeconds },
      checkpoints,
      bestEpoch,
      bestStep,
      bestEvalLoss,
      warnings,
      stoppedEarly,
    });
  }

  private async write(extra: Record<string, unknown> = {}): Promise<void> {
    if (!this.latest) return;
    this.lastStatsWrite = Date.now();
    await this.runs.updateStats(this.runId, this.workerId, {
      startedAt: this.startedAt,
      ...this.latest,
      lossSeries: thin(this.lossSeries, 500),
      evalLossSeries: this.evalSeries,
      ...extra,
    });
  }
}
