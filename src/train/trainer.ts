/**
 * Parent side of the trainer: starts one child process per job (`trainerProcess.ts`), relays its logs
 * and progress, and turns however it ends (a final message, a cancel, a crash) into one outcome.
 */
import { fork } from "node:child_process";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { LLAMA_CPP_LORA_TARGETS, LORA_TARGETS, runDefaults, TRAINER_OUTPUT_TYPES } from "../contract/runs.ts";
import { killedBy } from "./killedBy.ts";
import {
  type ChildMessage,
  type ExampleLoss,
  type ParentMessage,
  type ResolvedTrainerJob,
  type TrainerJob,
  type TrainerProgress,
  type TrainingStats,
} from "./protocol.ts";

/** Per-example losses of a completed job, in the order of its `samples` and `evalSamples`. */
export type TrainingExamples = { train: ExampleLoss[]; eval: ExampleLoss[] };

export type {
  ExampleLoss,
  SampleSegment,
  TrainingSample,
  LearningRateSchedule,
  LoraJobOptions,
  TrainerJob,
  TrainerProgress,
  TrainingStats,
} from "./protocol.ts";

export interface TrainerHandlers {
  /** The trainer's own log lines (phases, one summary per epoch). */
  onLog?: (line: string) => void;
  /** Progress, at most about twice a second and once at the end of every epoch. */
  onProgress?: (progress: TrainerProgress) => void;
  /** llama.cpp's native log (model loading, quantization), line by line; verbose. */
  onNativeLog?: (line: string) => void;
}

export interface StartTrainerOptions {
  /** After `cancel()`, how long the child gets to stop at a step boundary before it is killed. Defaults to `10_000`. */
  cancelGraceMs?: number;
}

export type TrainerOutcome =
  | { status: "completed"; outputPath: string; stats: TrainingStats; examples: TrainingExamples }
  /** Stopped by `cancel()` or `kill()`. */
  | { status: "cancelled" }
  /** The job failed (`exitCode` 1 with the trainer's message) or the process died (`signal`, or an unexpected code). */
  | {
      status: "failed";
      reason: string;
      exitCode: number | null;
      signal: NodeJS.Signals | null;
      /** The disk (or quota) was full: the trainer could not write its files. */
      outOfSpace?: boolean;
    };

export interface TrainerHandle {
  /** The child's process id (undefined if it could not be started). */
  readonly pid: number | undefined;
  /** Asks the trainer to stop at the next step boundary; it is killed if it has not after the grace period. */
  cancel(): void;
  /** Stops the trainer at once (SIGKILL). The outcome is `cancelled`. */
  kill(): void;
  /** Settles once the child process has exited; never rejects. */
  readonly done: Promise<TrainerOutcome>;
}

/**
 * How the scheduler starts a trainer: {@link startTrainer} in production, an in-memory fake in the
 * scheduler's tests. Logs and progress come through `handlers`; `done` says how it ended.
 */
export type TrainerLauncher = (job: TrainerJob, handlers: TrainerHandlers) => TrainerHandle;

/** Native log lines kept to explain a crash (an assert message is printed just before the abort). */
const NATIVE_TAIL_LINES = 8;

/**
 * Applies defaults and validates a job; throws a RangeError naming the bad field. A run's settings default
 * from `runDefaults`, the one table the API documents; the rest (optimizer, threads, ...) are the trainer's own.
 */
export function resolveTrainerJob(job: TrainerJob): ResolvedTrainerJob {
  const check = (ok: boolean, field: string, rule: string) => {
    if (!ok) throw new RangeError(`trainer job: ${field} ${rule}`);
  };
  const isPositiveInteger = (value: number) => Number.isInteger(value) && value >= 1;
  const method = job.method ?? runDefaults.method;
  const backend = job.backend ?? "llama.cpp";
  const resolved: ResolvedTrainerJob = {
    backend,
    torch:
      backend === "torch" && job.torch !== undefined
        ? {
            python: job.torch.python,
            device: job.torch.device ?? "auto",
            dtype: job.torch.dtype ?? "auto",
            probe: job.torch.probe ?? null,
            cacheDir: job.torch.cacheDir ?? null,
          }
        : null,
    method,
    lora: method === "lora" ? (job.lora ?? null) : null,
    baseModelPath: job.baseModelPath,
    outputPath: job.outputPath,
    workDir: job.workDir,
    samples: job.samples ?? [],
    samplesFile: job.samplesFile ?? null,
    evalSamples: job.evalSamples ?? [],
    evalSamplesFile: job.evalSamplesFile ?? null,
    lossesFile: job.lossesFile ?? null,
    maxTrainTokens: job.maxTrainTokens ?? null,
    earlyStoppingPatience: job.earlyStoppingPatience ?? null,
    checkpointDir: job.checkpointDir ?? null,
    optimizer: job.optimizer ?? "adamw",
    packing: job.packing ?? true,
    learningRate: job.learningRate,
    epochs: job.epochs,
    maxSteps: job.maxSteps ?? null,
    complexity: job.complexity ?? runDefaults.complexity,
    contextSize: job.contextSize ?? runDefaults.contextSize,
    threads: job.threads ?? 1,
    gpu: job.gpu ?? { backend: "cpu", layers: 0 },
    blasLibrary: job.blasLibrary ?? null,
    blasThreads: job.blasThreads ?? job.threads ?? 1,
    outputType: job.outputType ?? runDefaults.outputType,
    seed: job.seed ?? runDefaults.seed,
    lrSchedule: {
      kind: job.lrSchedule?.kind ?? runDefaults.lrSchedule,
      warmupSteps: job.lrSchedule?.warmupSteps ?? 0,
      minFraction: job.lrSchedule?.minFraction ?? runDefaults.lrMinFraction,
    },
    weightDecay: job.weightDecay ?? 0,
  };
  check(method === "lora" || method === "full", "method", 'must be "lora" or "full"');
  check(backend === "llama.cpp" || backend === "torch", "backend", 'must be "llama.cpp" or "torch"');
  if (backend === "torch") {
    check(resolved.torch !== null, "torch", 'is required with backend "torch"');
    check(method === "lora", "method", 'must be "lora" with backend "torch"');
  }
  if (method === "lora") {
    const lora = resolved.lora;
    check(lora !== null, "lora", 'is required with method "lora"');
    check(isPositiveInteger(lora!.rank), "lora.rank", "must be an integer >= 1");
    check(Number.isFinite(lora!.alpha) && lora!.alpha > 0, "lora.alpha", "must be > 0");
    const targets: readonly string[] = backend === "torch" ? LORA_TARGETS : LLAMA_CPP_LORA_TARGETS;
    check(
      lora!.targets.length > 0 && lora!.targets.every((t) => targets.includes(t)),
      "lora.targets",
      `must be a non-empty list of ${targets.join(", ")}${backend === "torch" ? "" : " (the llama.cpp trainer's)"}`,
    );
  }
  if (resolved.samplesFile === null) check(resolved.samples.length > 0, "samples", "must not be empty");
  else check(resolved.samples.length === 0, "samples", "must be left out with samplesFile");
  check(
    resolved.maxTrainTokens === null || isPositiveInteger(resolved.maxTrainTokens),
    "maxTrainTokens",
    "must be an integer >= 1 or null",
  );
  check(
    resolved.evalSamplesFile === null || resolved.evalSamples.length === 0,
    "evalSamples",
    "must be left out with evalSamplesFile",
  );
  check(Number.isFinite(resolved.learningRate) && resolved.learningRate > 0, "learningRate", "must be > 0");
  check(isPositiveInteger(resolved.epochs), "epochs", "must be an integer >= 1");
  check(
    resolved.maxSteps === null || isPositiveInteger(resolved.maxSteps),
    "maxSteps",
    "must be an integer >= 1",
  );
  check(resolved.complexity > 0 && resolved.complexity <= 1, "complexity", "must be in (0, 1]");
  check(isPositiveInteger(resolved.contextSize), "contextSize", "must be an integer >= 1");
  check(isPositiveInteger(resolved.threads), "threads", "must be an integer >= 1");
  check(
    ["cpu", "cuda", "vulkan"].includes(resolved.gpu.backend),
    "gpu.backend",
    'must be "cpu", "cuda" or "vulkan"',
  );
  check(
    resolved.gpu.layers === "all" || (Number.isInteger(resolved.gpu.layers) && resolved.gpu.layers >= 0),
    "gpu.layers",
    'must be "all" or an integer >= 0',
  );
  check(
    TRAINER_OUTPUT_TYPES.includes(resolved.outputType),
    "outputType",
    `must be one of ${TRAINER_OUTPUT_TYPES.join(", ")}`,
  );
  check(Number.isInteger(resolved.seed), "seed", "must be an integer");
  check(
    resolved.earlyStoppingPatience === null || isPositiveInteger(resolved.earlyStoppingPatience),
    "earlyStoppingPatience",
    "must be an integer >= 1 or null",
  );
  check(["adamw", "sgd"].includes(resolved.optimizer), "optimizer", 'must be "adamw" or "sgd"');
  check(["constant", "linear", "cosine"].includes(resolved.lrSchedule.kind), "lrSchedule.kind", "is unknown");
  check(
    Number.isInteger(resolved.lrSchedule.warmupSteps) && resolved.lrSchedule.warmupSteps >= 0,
    "lrSchedule.warmupSteps",
    "must be an integer >= 0",
  );
  check(
    resolved.lrSchedule.minFraction >= 0 && resolved.lrSchedule.minFraction <= 1,
    "lrSchedule.minFraction",
    "must be in [0, 1]",
  );
  check(resolved.weightDecay >= 0 && resolved.weightDecay <= 1, "weightDecay", "must be in [0, 1]");
  return resolved;
}

/** The child's entry file and the Node flags that let it load TypeScript (tsx, resolved from here). */
function childEntry(): { file: string; execArgv: string[] } {
  const file = fileURLToPath(new URL("./trainerProcess.ts", import.meta.url));
  // Resolved to an absolute URL so the child finds tsx whatever its working directory is.
  return { file, execArgv: ["--import", import.meta.resolve("tsx")] };
}

/**
 * Starts a training job in a child process. Throws (RangeError) only for an invalid job; everything
 * that goes wrong later, including a native crash, ends as a `failed` outcome.
 */
export function startTrainer(
  job: TrainerJob,
  handlers: TrainerHandlers = {},
  options: StartTrainerOptions = {},
): TrainerHandle {
  const resolved = resolveTrainerJob(job);
  const cancelGraceMs = options.cancelGraceMs ?? 10_000;
  const { file, execArgv } = childEntry();
  const child = fork(file, [], { execArgv, stdio: ["ignore", "pipe", "pipe", "ipc"] });

  let final: ChildMessage | undefined;
  let stopRequested = false;
  let killTimer: NodeJS.Timeout | undefined;
  let spawnError: Error | undefined;
  const nativeTail: string[] = [];

  const onNativeLine = (line: string) => {
    nativeTail.push(line);
    if (nativeTail.length > NATIVE_TAIL_LINES) nativeTail.shift();
    handlers.onNativeLog?.(line);
  };
  for (const stream of [child.stdout, child.stderr]) {
    if (stream !== null)
      readline.createInterface({ input: stream, crlfDelay: Infinity }).on("line", onNativeLine);
  }

  child.on("message", (message: ChildMessage) => {
    switch (message.type) {
      case "log":
        handlers.onLog?.(message.line);
        break;
      case "progress": {
        const { type: _type, ...progress } = message;
        handlers.onProgress?.(progress);
        break;
      }
      default:
        final = message;
    }
  });
  child.on("error", (error) => {
    spawnError ??= error;
  });

  const sendToChild = (message: ParentMessage) => {
    if (child.connected) child.send(message, (error) => void error); // a closed channel is handled on exit
  };
  sendToChild({ type: "job", job: resolved });

  const done = new Promise<TrainerOutcome>((resolve) => {
    // `close` comes after `exit` once stdout/stderr are drained, so the native tail is complete.
    child.on("close", (exitCode, signal) => {
      clearTimeout(killTimer);
      resolve(outcome(exitCode, signal));
    });
  });

  const outcome = (exitCode: number | null, signal: NodeJS.Signals | null): TrainerOutcome => {
    if (final?.type === "done")
      return {
        status: "completed",
        outputPath: final.outputPath,
        stats: final.stats,
        examples: final.examples,
      };
    if (final?.type === "cancelled") return { status: "cancelled" };
    if (final?.type === "error")
      return {
        status: "failed",
        reason: final.message,
        exitCode,
        signal,
        outOfSpace: final.outOfSpace === true,
      };
    if (stopRequested) return { status: "cancelled" };
    const how =
      spawnError !== undefined
        ? `could not be started: ${spawnError.message}`
        : signal !== null
          ? killedBy(signal)
          : `exited with code ${exitCode}`;
    const tail = nativeTail.length > 0 ? `; last output: ${nativeTail.join(" | ")}` : "";
    return { status: "failed", reason: `trainer process ${how}${tail}`, exitCode, signal };
  };

  return {
    pid: child.pid,
    cancel() {
      if (stopRequested) return;
      stopRequested = true;
      sendToChild({ type: "cancel" });
      killTimer = setTimeout(() => child.kill("SIGKILL"), cancelGraceMs);
    },
    kill() {
      stopRequested = true;
      child.kill("SIGKILL");
    },
    done,
  };
}
