import { Worker } from "node:worker_threads";

/**
 * node-llama-cpp's JSON-schema → GBNF translation, the JavaScript half of `createGrammarForJsonSchema` (the other
 * half, llama.cpp parsing the text, needs the main thread's `Llama`). The package does not export it, so it is
 * loaded from its file in the pinned release.
 */
const TRANSLATOR = new URL(
  "./utils/gbnfJson/getGbnfGrammarForGbnfJsonSchema.js",
  import.meta.resolve("node-llama-cpp"),
).href;

// Plain JavaScript, so the worker needs no TypeScript loader.
const WORKER_SOURCE = `
const { parentPort } = require("node:worker_threads");
const translator = import(${JSON.stringify(TRANSLATOR)});
parentPort.on("message", async ({ id, schema }) => {
  try {
    const { getGbnfGrammarForGbnfJsonSchema } = await translator;
    parentPort.postMessage({ id, gbnf: getGbnfGrammarForGbnfJsonSchema(schema) });
  } catch (error) {
    parentPort.postMessage({ id, error: error instanceof Error ? error.message : String(error) });
  }
});
`;

/** The worker stopped (it crashed or was disposed) before it answered: not the schema's fault. */
export class GbnfWriterStopped extends Error {
  constructor(reason: string) {
    super(`the grammar writer's worker thread stopped: ${reason}`);
    this.name = "GbnfWriterStopped";
  }
}

interface Answer {
  id: number;
  gbnf?: string;
  error?: string;
}

/**
 * Writes the GBNF grammar of a JSON schema in a worker thread, so that a large schema's translation (tens of
 * microseconds per subschema, some shapes more; `bench/eventLoop.ts --phases`) never holds the event loop. One
 * worker, started on first use and kept; it does not keep the process alive while idle. A translation error
 * rejects with the translator's message.
 */
export class GbnfWriter {
  private worker: Worker | undefined;
  private readonly pending = new Map<number, { resolve(gbnf: string): void; reject(error: Error): void }>();
  private nextId = 0;

  write(schema: unknown): Promise<string> {
    const worker = this.worker ?? this.start();
    const id = this.nextId++;
    return new Promise<string>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      if (this.pending.size === 1) worker.ref();
      worker.postMessage({ id, schema });
    });
  }

  /** Stops the worker; translations still running reject with {@link GbnfWriterStopped}. */
  async dispose(): Promise<void> {
    const worker = this.worker;
    this.worker = undefined;
    this.fail(new GbnfWriterStopped("the engine is shutting down"));
    await worker?.terminate();
  }

  private start(): Worker {
    const worker = new Worker(WORKER_SOURCE, { eval: true });
    worker.unref();
    worker.on("message", ({ id, gbnf, error }: Answer) => {
      const waiter = this.pending.get(id);
      if (!waiter) return;
      this.pending.delete(id);
      if (this.pending.size === 0) worker.unref();
      if (gbnf !== undefined) waiter.resolve(gbnf);
      else waiter.reject(new Error(error));
    });
    const stopped = (reason: string) => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      this.fail(new GbnfWriterStopped(reason));
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
