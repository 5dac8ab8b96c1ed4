import { Worker } from "node:worker_threads";
import { ConduitError } from "../errors.ts";
import type { TokenizeAnswer, TokenizeJob } from "./tokenizerWorker.ts";

/** The worker loads `tokenizerWorker.ts` through tsx (registered there: workers do not inherit the main thread's hooks). */
const WORKER_SOURCE = `
const { workerData } = require("node:worker_threads");
import(workerData.tsx)
  .then(({ register }) => register())
  .then(() => import(workerData.module));
`;

/**
 * Tokenizes long prompts in a worker thread with the model's vocabulary loaded there alone: llama.cpp's tokenizer
 * is synchronous, and a prompt within a 2,048-token context's byte bound (512 KiB for Qwen2.5) took 0.19 s a pass,
 * three passes with the check for control-token text, on the event loop. One worker, started on the first long
 * prompt and kept; it does not keep the process alive while idle. `undefined` when the worker cannot answer (the
 * file changed since the engine loaded it, the worker failed): the caller tokenizes itself.
 */
export class TokenizerThread {
  private worker: Worker | undefined;
  private readonly pending = new Map<number, (answer: TokenizeAnswer | undefined) => void>();
  private nextId = 0;
  private disposed = false;

  async tokenize(path: string, identity: string, job: TokenizeJob): Promise<number[] | undefined> {
    // Disposed: the caller tokenizes itself (a worker started now would outlive the engine).
    if (this.disposed) return undefined;
    const worker = this.worker ?? this.start();
    const id = this.nextId++;
    const answer = await new Promise<TokenizeAnswer | undefined>((resolve) => {
      this.pending.set(id, resolve);
      if (this.pending.size === 1) worker.ref();
      worker.postMessage({ id, path, identity, job });
    });
    if (answer === undefined || "unavailable" in answer) return undefined;
    if ("refused" in answer)
      throw new ConduitError("invalid_request", answer.refused.message, { param: answer.refused.param });
    return Array.from(answer.tokens);
  }

  /** Stops the worker for good; tokenizations under way and later ones answer `undefined`. */
  async dispose(): Promise<void> {
    this.disposed = true;
    const worker = this.worker;
    this.worker = undefined;
    this.settleAll();
    await worker?.terminate();
  }

  private start(): Worker {
    const worker = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: {
        tsx: import.meta.resolve("tsx/esm/api"),
        module: new URL("./tokenizerWorker.ts", import.meta.url).href,
      },
    });
    worker.unref();
    worker.on("message", (answer: TokenizeAnswer) => {
      const resolve = this.pending.get(answer.id);
      if (!resolve) return;
      this.pending.delete(answer.id);
      if (this.pending.size === 0) worker.unref();
      resolve(answer);
    });
    const stopped = () => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      this.settleAll();
    };
    worker.on("error", stopped);
    worker.on("exit", stopped);
    this.worker = worker;
    return worker;
  }

  private settleAll(): void {
    for (const resolve of this.pending.values()) resolve(undefined);
    this.pending.clear();
  }
}
