import { Worker } from "node:worker_threads";
import type { EvalGrader, GraderScore } from "../contract/evals.ts";

/** The grading thread loads TypeScript through tsx, as the server does. */
const BOOT = `import(${JSON.stringify(import.meta.resolve("tsx/esm/api"))})
  .then(({ register }) => { register(); return import(${JSON.stringify(new URL("./gradingThread.ts", import.meta.url).href)}); })`;

interface Job {
  grader: EvalGrader;
  answer: string;
  expected: string;
  resolve(graded: Graded): void;
}

/** A grader's score, and whether it was stopped at its deadline. */
export interface Graded {
  score: GraderScore;
  timedOut: boolean;
}

interface Answer {
  ready?: true;
  id: number;
  score?: GraderScore;
  error?: string;
}

export interface GraderThreadOptions {
  /** How long one grader may take on one answer before it is stopped and the item scored as an error. Defaults to `2000`. */
  timeoutMs?: number;
}

/**
 * Scores answers with the graders whose cost depends on what a user supplied (a regex, a JSON schema, a long
 * reference for a similarity) on a thread of their own, one at a time, each with a deadline: the event loop is
 * never held, and a grader past its deadline is stopped (the thread is ended and a new one started) and the
 * answer scored as an error that says so. One thread, started on first use, that does not keep the process alive
 * while idle.
 */
export class GraderThread {
  private worker: Worker | undefined;
  /** The thread has loaded its code: jobs are sent (and their deadlines start) only then. */
  private ready = false;
  private readonly queue: Job[] = [];
  private current: { id: number; job: Job; timer: NodeJS.Timeout } | undefined;
  private nextId = 0;
  private disposed = false;
  readonly timeoutMs: number;

  constructor(options: GraderThreadOptions = {}) {
    this.timeoutMs = options.timeoutMs ?? 2000;
  }

  /** One grader's score of one answer; never rejects: a failure is a score of 0 with its `error`. */
  score(grader: EvalGrader, answer: string, expected: string): Promise<Graded> {
    if (this.disposed) return Promise.resolve(failed(grader, "the server is shutting down"));
    return new Promise((resolve) => {
      this.queue.push({ grader, answer, expected, resolve });
      this.next();
    });
  }

  async dispose(): Promise<void> {
    this.disposed = true;
    const worker = this.worker;
    this.worker = undefined;
    if (this.current) {
      clearTimeout(this.current.timer);
      this.current.job.resolve(failed(this.current.job.grader, "the server is shutting down"));
      this.current = undefined;
    }
    for (const job of this.queue.splice(0)) job.resolve(failed(job.grader, "the server is shutting down"));
    await worker?.terminate();
  }

  private next(): void {
    if (this.current || this.disposed) return;
    if (this.queue.length === 0) {
      this.worker?.unref();
      return;
    }
    const worker = this.worker ?? this.start();
    worker.ref();
    if (!this.ready) return;
    const job = this.queue.shift() as Job;
    const id = this.nextId++;
    const timer = setTimeout(() => {
      // Stopped mid-computation: the thread goes, and a new one takes the next job.
      const stuck = this.worker;
      this.worker = undefined;
      void stuck?.terminate();
      this.finish(
        id,
        failed(
          job.grader,
          `the ${job.grader.type} grader ran past its ${this.timeoutMs / 1000} s limit on this answer`,
          true,
        ),
      );
    }, this.timeoutMs);
    this.current = { id, job, timer };
    worker.postMessage({ id, grader: job.grader, answer: job.answer, expected: job.expected });
  }

  private finish(id: number, graded: Graded): void {
    if (this.current?.id !== id) return;
    clearTimeout(this.current.timer);
    const { job } = this.current;
    this.current = undefined;
    job.resolve(graded);
    this.next();
  }

  private start(): Worker {
    const worker = new Worker(BOOT, { eval: true });
    this.ready = false;
    worker.on("message", ({ ready, id, score, error }: Answer) => {
      if (ready) {
        if (this.worker === worker) {
          this.ready = true;
          this.next();
        }
        return;
      }
      const job = this.current?.id === id ? this.current.job : undefined;
      if (job)
        this.finish(
          id,
          score ? { score, timedOut: false } : failed(job.grader, error ?? "the grader failed"),
        );
    });
    const stopped = (reason: string) => {
      if (this.worker !== worker) return;
      this.worker = undefined;
      if (!this.ready) {
        // It never loaded: starting another would fail the same way.
        for (const job of this.queue.splice(0))
          job.resolve(failed(job.grader, `the grading thread could not start (${reason})`));
        return;
      }
      if (this.current)
        this.finish(
          this.current.id,
          failed(this.current.job.grader, `the grading thread stopped (${reason})`),
        );
    };
    worker.on("error", (error) => stopped(error.message));
    worker.on("exit", (code) => stopped(`exit code ${code}`));
    this.worker = worker;
    return worker;
  }
}

function failed(grader: EvalGrader, error: string, timedOut = false): Graded {
  return { score: { name: grader.name, score: 0, passed: false, error }, timedOut };
}
