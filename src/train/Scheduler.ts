import { randomBytes } from "node:crypto";
import fsp from "node:fs/promises";
import os from "node:os";
import type { Logger } from "pino";
import type { DatasetService } from "../datasets/DatasetService.ts";
import { formatChat } from "../model/chatTemplate.ts";
import { readGgufFileInfo } from "node-llama-cpp";
import { writeGgufUint32 } from "../model/gguf/GgufPatch.ts";
import type { ChatMessage, ModelRef } from "../model/types.ts";
import type { BlobStore } from "../store/BlobStore.ts";
import type { Run, RunRepository } from "../store/RunRepository.ts";
import type { TrainerOutputType, TrainerProgress } from "./protocol.ts";
import { methodOf, type ModelCatalog, type RunConfig, type RunService } from "./RunService.ts";
import { startTrainer, type TrainerHandle } from "./trainer.ts";

export interface SchedulerOptions {
  /** Runs trained at once by this process. Defaults to `1`. */
  concurrency: number;
  /** llama.cpp threads of each trainer process. Defaults to `1`. */
  threads: number;
  /** How long a claimed run stays ours without a heartbeat. Defaults to `30000` ms. */
  leaseMs?: number;
  /** Heartbeat and queue poll interval. Defaults to `2000` ms. */
  pollMs?: number;
  /** Starts before a run whose trainer keeps dying is FAILED. Defaults to `3`. */
  maxAttempts?: number;
  /** Minimum pairs before some are held out for eval loss. Defaults to `50`. */
  minPairsForEval?: number;
}

/** The system prompt (if any), the user's input, and, for training, the answer. */
export function conversation(systemPrompt: string, input: string, output?: string): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (systemPrompt) messages.push({ role: "system", content: systemPrompt });
  messages.push({ role: "user", content: input });
  if (output !== undefined) messages.push({ role: "assistant", content: output });
  return messages;
}

/** Deterministic shuffle (mulberry32), so a run's eval split is the same on every attempt. */
function shuffled<T>(items: T[], seed: number): T[] {
  const out = [...items];
  let state = seed >>> 0;
  const next = () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [out[i], out[j]] = [out[j] as T, out[i] as T];
  }
  return out;
}

interface ActiveRun {
  run: Run;
  handle?: TrainerHandle;
  stopping?: "cancel" | "shutdown";
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
  private readonly minPairsForEval: number;
  private readonly onChanged = (runId: string) => {
    const active = this.active.get(runId);
    if (active) void this.checkCancelled(active);
    else void this.tick();
  };

  constructor(
    private readonly runs: RunRepository,
    private readonly runService: RunService,
    private readonly datasets: DatasetService,
    private readonly models: ModelCatalog,
    private readonly blobs: BlobStore,
    private readonly log: Logger,
    private readonly options: SchedulerOptions,
  ) {
    this.leaseMs = options.leaseMs ?? 30_000;
    this.pollMs = options.pollMs ?? 2_000;
    this.maxAttempts = options.maxAttempts ?? 3;
    this.minPairsForEval = options.minPairsForEval ?? 50;
  }

  start(): void {
    if (this.options.concurrency <= 0) return;
    this.runService.events.on("changed", this.onChanged);
    this.timer = setInterval(() => void this.tick(), this.pollMs);
    void this.tick();
  }

  /** One pass: recover dead workers' runs, renew our leases, start queued runs while there is room. */
  tick(): Promise<void> {
    this.ticking ??= this.doTick().finally(() => (this.ticking = undefined));
    return this.ticking;
  }

  private async doTick(): Promise<void> {
    try {
      await this.runs.recoverExpired(this.maxAttempts);
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
    } catch (error) {
      this.log.error({ err: error }, "scheduler tick failed");
    }
  }

  private async renew(active: ActiveRun): Promise<void> {
    if (!(await this.runs.heartbeat(active.run.id, this.workerId, this.leaseMs))) this.stop(active, "cancel");
  }

  private async checkCancelled(active: ActiveRun): Promise<void> {
    const run = await this.runs.getById(active.run.id);
    if (!run || run.status !== "RUNNING") this.stop(active, "cancel");
  }

  private stop(active: ActiveRun, why: "cancel" | "shutdown"): void {
    if (active.stopping) return;
    active.stopping = why;
    if (why === "cancel") active.handle?.cancel();
    else active.handle?.kill();
  }

  private async appendLog(runId: string, message: string): Promise<void> {
    await this.runs
      .appendLog(runId, message)
      .catch((error: unknown) => this.log.warn({ err: error, runId }, "run log failed"));
  }

  private async train(active: ActiveRun): Promise<void> {
    const { run } = active;
    const config = run.config as unknown as RunConfig;
    const lora = methodOf(run.config) === "lora" && config.method === "lora" ? config : undefined;
    const runDir = `runs/${run.id}`;
    const workDir = this.blobs.pathOf(`${runDir}/work`);
    // A LoRA run keeps only its adapter; it is served on the shared base model.
    const outputPath = this.blobs.pathOf(`${runDir}/${lora ? "adapter" : "model"}.gguf`);
    try {
      await this.appendLog(run.id, `training started on ${this.workerId} (attempt ${run.attempts})`);
      const base = this.models.resolve(config.baseModelName);
      if (!base) throw new Error(`base model "${config.baseModelName}" is no longer available`);
      const { samples, evalSamples } = await this.samples(run, config, base);
      await this.appendLog(
        run.id,
        `${samples.length} training conversations${evalSamples.length ? `, ${evalSamples.length} held out for eval loss` : ""}; base model ${base.id}`,
      );
      await fsp.mkdir(workDir, { recursive: true });

      let lastStatsWrite = 0;
      const lossSeries: { step: number; trainLoss: number }[] = [];
      const evalSeries: { step: number; epoch: number; evalLoss: number }[] = [];
      let latest: TrainerProgress | undefined;
      const writeStats = async (extra: Record<string, unknown> = {}) => {
        if (!latest) return;
        lastStatsWrite = Date.now();
        await this.runs.updateStats(run.id, this.workerId, {
          ...latest,
          lossSeries: thin(lossSeries, 500),
          evalLossSeries: evalSeries,
          ...extra,
        });
      };

      if (active.stopping) return;
      const handle = startTrainer(
        {
          method: lora ? "lora" : "full",
          ...(lora
            ? { lora: { rank: lora.loraRank, alpha: lora.loraAlpha, targets: lora.loraTargets } }
            : {}),
          baseModelPath: base.path,
          outputPath,
          workDir,
          samples,
          evalSamples,
          learningRate: config.lr,
          epochs: config.epochs,
          ...(config.steps ? { maxSteps: config.steps } : {}),
          complexity: config.complexity,
          contextSize: config.contextSize,
          lrSchedule: { kind: config.lrSchedule, minFraction: config.lrMinFraction },
          threads: this.options.threads,
          outputType: config.outputType as TrainerOutputType,
          seed: config.seed,
        },
        {
          onLog: (line) => void this.appendLog(run.id, line),
          onProgress: (progress) => {
            latest = progress;
            lossSeries.push({ step: progress.step, trainLoss: progress.trainLoss });
            if (progress.evalLoss !== undefined)
              evalSeries.push({ step: progress.step, epoch: progress.epoch, evalLoss: progress.evalLoss });
            if (Date.now() - lastStatsWrite > 1000 || progress.evalLoss !== undefined) void writeStats();
          },
        },
      );
      active.handle = handle;
      // A cancel or shutdown that came while the trainer was starting.
      if (active.stopping === "cancel") handle.cancel();
      else if (active.stopping === "shutdown") handle.kill();
      const outcome = await handle.done;

      if (outcome.status === "completed") {
        if (!lora) await restoreContextLength(base.path, outputPath);
        await writeStats({ final: outcome.stats });
        const finished = await this.runs.finish(run.id, this.workerId, {
          status: "READY",
          modelPath: outputPath,
        });
        if (finished)
          await this.appendLog(
            run.id,
            lora
              ? `run READY: served as "${run.id}" (LoRA adapter of ${(outcome.stats.outputBytes / 2 ** 20).toFixed(2)} MiB on ${base.id})`
              : `run READY: the fine-tuned model is served as "${run.id}"`,
          );
        else await this.blobs.remove(runDir);
      } else if (outcome.status === "cancelled" || active.stopping === "cancel") {
        await this.blobs.remove(runDir);
        await this.appendLog(run.id, "trainer stopped; partial artifacts removed");
      } else if (active.stopping === "shutdown") {
        // The run is released back to the queue by close().
      } else {
        await this.fail(run, outcome.reason);
      }
    } catch (error) {
      await this.fail(run, error instanceof Error ? error.message : String(error));
    } finally {
      await fsp.rm(workDir, { recursive: true, force: true }).catch(() => undefined);
    }
  }

  private async fail(run: Run, reason: string): Promise<void> {
    this.log.warn({ runId: run.id, reason }, "run failed");
    await this.appendLog(run.id, `run failed: ${reason}`);
    await this.runs.finish(run.id, this.workerId, { status: "FAILED", error: reason });
    for (const file of ["model.gguf", "adapter.gguf"])
      await this.blobs.remove(`runs/${run.id}/${file}`).catch(() => undefined);
  }

  /** Each pair as a conversation in the base model's chat template: exactly what inference will format. */
  private async samples(
    run: Run,
    config: RunConfig,
    base: ModelRef,
  ): Promise<{ samples: string[]; evalSamples: string[] }> {
    const texts: string[] = [];
    try {
      for await (const pair of this.datasets.pairs(run.userId, run.datasetId))
        texts.push(
          await formatChat(base, conversation(config.systemPrompt, pair.input, pair.output), {
            addGenerationPrompt: false,
          }),
        );
    } catch (error) {
      throw new Error(`could not read dataset ${run.datasetId}: ${(error as Error).message}`, {
        cause: error,
      });
    }
    if (texts.length === 0)
      throw new Error(`dataset ${run.datasetId} has no IO pairs (was it deleted or emptied?)`);
    if (texts.length < this.minPairsForEval || config.evalFraction <= 0)
      return { samples: texts, evalSamples: [] };
    const order = shuffled(texts, config.seed);
    const held = Math.max(1, Math.floor(texts.length * config.evalFraction));
    return { samples: order.slice(held), evalSamples: order.slice(0, held) };
  }

  /** Stops trainers and hands their runs back to the queue, so another start picks them up. */
  async close(): Promise<void> {
    this.closed = true;
    if (this.timer) clearInterval(this.timer);
    this.runService.events.off("changed", this.onChanged);
    await this.ticking;
    const running = [...this.active.values()];
    for (const active of running) this.stop(active, "shutdown");
    // Waits for `train` itself, not just the trainer: a run still being prepared has none yet,
    // and must be finished with the database before it closes.
    await Promise.all(running.map((active) => active.done));
    for (const active of running)
      if (await this.runs.release(active.run.id, this.workerId))
        await this.appendLog(active.run.id, "run re-queued: the server shut down while it was training");
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

/** At most `max` points, evenly thinned, always keeping the latest. */
function thin<T>(points: T[], max: number): T[] {
  if (points.length <= max) return points;
  const stride = points.length / max;
  const out: T[] = [];
  for (let i = 0; i < max - 1; i++) out.push(points[Math.floor(i * stride)] as T);
  out.push(points[points.length - 1] as T);
  return out;
}
