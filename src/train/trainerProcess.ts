/**
 * Entry point of the trainer child process (`child_process.fork`, see `trainer.ts`). It receives one
 * job, trains, answers with exactly one of `done` / `cancelled` / `error`, and exits. llama.cpp's own
 * logging goes to this process's stderr, which the parent reads; a native crash kills only this
 * process, and the parent sees its exit code or signal.
 */
import { isOutOfSpace } from "../errors.ts";
import type { ChildMessage, ParentMessage } from "./protocol.ts";
import { runJob, type AnyTrainerJob } from "./trainers.ts";

const send = process.send?.bind(process);
if (send === undefined) {
  process.stderr.write("trainerProcess: must be started with child_process.fork (no IPC channel)\n");
  process.exit(2);
}

let cancelRequested = false;
let started = false;

/** Sends a message and resolves once it has been handed to the channel. */
function post(message: ChildMessage): Promise<void> {
  return new Promise((resolve) => {
    if (!process.connected) return resolve();
    send!(message, undefined, undefined, () => resolve());
  });
}

async function finish(message: ChildMessage, exitCode: number): Promise<never> {
  await post(message);
  process.exit(exitCode);
}

async function run(job: AnyTrainerJob): Promise<void> {
  try {
    const result = await runJob(job, {
      log: (line) => void post({ type: "log", line }),
      progress: (progress) => void post({ type: "progress", ...progress }),
      isCancelled: () => cancelRequested,
      // One macrotask turn runs the poll phase, where a pending IPC message (a cancel) is read.
      yieldToEventLoop: () => new Promise((resolve) => setImmediate(resolve)),
    });
    if (result.status === "cancelled") await finish({ type: "cancelled" }, 0);
    else
      await finish(
        { type: "done", outputPath: result.outputPath, stats: result.stats, examples: result.examples },
        0,
      );
  } catch (error) {
    await finish(
      {
        type: "error",
        message: error instanceof Error ? error.message : String(error),
        outOfSpace: isOutOfSpace(error),
      },
      1,
    );
  }
}

process.on("message", (message: ParentMessage) => {
  if (message.type === "cancel") cancelRequested = true;
  else if (message.type === "job" && !started) {
    started = true;
    void run(message.job);
  }
});

// The parent is gone (crashed or killed): nobody wants the result, and the run must not go on alone.
process.on("disconnect", () => process.exit(1));

process.on("uncaughtException", (error) => {
  void finish({ type: "error", message: `trainer: ${error.message}`, outOfSpace: isOutOfSpace(error) }, 1);
});
