import { Worker } from "node:worker_threads";
import type { ParsedJsonBody } from "./jsonBody.ts";

/** The worker loads `jsonBody.ts` through tsx (registered there: workers do not inherit the main thread's hooks). */
const WORKER_SOURCE = `
const { parentPort, workerData } = require("node:worker_threads");
const parser = import(workerData.tsx)
  .then(({ register }) => register())
  .then(() => import(workerData.module));
parentPort.on("message", async ({ id, bytes }) => {
  try {
    const { parseJsonBody } = await parser;
    parentPort.postMessage({ id, parsed: parseJsonBody(bytes) });
  } catch (error) {
    parentPort.postMessage({ id, failed: error instanceof Error ? error.message : String(error) });
  }
});
`;

interface Answer {
  id: number;
  parsed?: ParsedJsonBody;
  failed?: string;
}

/**
 * Parses big JSON bodies in a worker thread ({@link parseJsonBody}: UTF-8 check, parse, lone surrogates), so that
 * a stream of them cannot hold the event loop: a 0.9 MB body of 100,000 values took 25–55 ms to parse on the loop,
 * and what is left there is taking the value back (a structured clone, a few ms). One worker, started on first use
 * and kept; it does not keep the process alive while idle. Bodies are parsed in the order they come.
 */
export class JsonParserThread {
  private worker: Worker | undefined;
  private readonly pending = new Map<
    number,
    { resolve(parsed: ParsedJsonBody): void; reject(error: Error): void }
  >();
  private nextId = 0;

  parse(bytes: Uint8Array): Promise<ParsedJsonBody> {
    const worker = this.worker ?? this.start();
    const id = this.nextId++;
    return new Promise<ParsedJsonBody>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      if (this.pending.size === 1) worker.ref();
      // A copy: the body's bytes may be a slice of a buffer that Node reuses.
      worker.postMessage({ id, bytes: new Uint8Array(bytes) });
    });
  }

  /** Stops the worker; parses still running reject. */
  async dispose(): Promise<void> {
    const worker = this.worker;
    this.worker = undefined;
    this.fail(new Error("the JSON parser's worker thread stopped: the server is shutting down"));
    await worker?.terminate();
  }

  private start(): Worker {
    const worker = new Worker(WORKER_SOURCE, {
      eval: true,
      workerData: {
        tsx: import.meta.resolve("tsx/esm/api"),
        module: new URL("./jsonBody.ts", import.meta.url).href,
      },
    });
    worker.unref();
    worker.on("message", ({ id, parsed, failed }: Answer) => {
      const waiter = this.pending.get(id);
      if (!waiter) return;
      this.pending.delete(id);
      if (this.pending.size === 0) worker.unref();
      if (parsed !== undefined) waiter.resolve(parsed);
      else waiter.reject(new Error(`the JSON parser's worker thread failed: ${failed}`));
    });
    const stopped = (reason: string) => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      this.fail(new Error(`the JSON parser's worker thread stopped: ${reason}`));
    };
    worker.on("error", (error) => stopped(error.message));
    worker.on("exit", (code) => stopped(`exit code ${code}`));
    this.worker = worker;
    return worker;
  }

  private fail(error: Error): void {
    for (const waiter of this.pending.values()) waiter.reject(error);
    this.pending.clear();
  }
}
