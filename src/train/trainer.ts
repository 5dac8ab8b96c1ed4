/**
 * Parent side of the trainer: starts one child process per job (`trainerProcess.ts`), relays its logs
 * and progress, and turns however it ends (a final message, a cancel, a crash) into one outcome.
 */
import { fork } from "node:child_process";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { killedBy } from "./core/killedBy.ts";
import type { ExampleLoss, TrainerProgress, TrainingStats } from "./core/trainerJob.ts";
import type { ChildMessage, ParentMessage } from "./protocol.ts";
import type { AnyTrainerJob } from "./trainers.ts";

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
} from "./core/trainerJob.ts";
export type { AnyTrainerJob } from "./trainers.ts";

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
export type TrainerLauncher = (job: AnyTrainerJob, handlers: TrainerHandlers) => TrainerHandle;

/** Native log lines kept to explain a crash (an assert message is printed just before the abort). */
const NATIVE_TAIL_LINES = 8;

/** The child's entry file and the Node flags that let it load TypeScript (tsx, resolved from here). */
function childEntry(): { file: string; execArgv: string[] } {
  const file = fileURLToPath(new URL("./trainerProcess.ts", import.meta.url));
  // Resolved to an absolute URL so the child finds tsx whatever its working directory is.
  return { file, execArgv: ["--import", import.meta.resolve("tsx")] };
}

/**
 * Starts a training job in a child process. Everything that goes wrong, from a job the trainer refuses to a
 * native crash, ends as a `failed` outcome.
 */
export function startTrainer(
  job: AnyTrainerJob,
  handlers: TrainerHandlers = {},
  options: StartTrainerOptions = {},
): TrainerHandle {
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
  sendToChild({ type: "job", job });

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
