/**
 * The grading thread's entry: scores one answer with one grader per message (see `GraderThread`). A grader
 * that throws answers with its message.
 */
import { parentPort } from "node:worker_threads";
import type { EvalGrader } from "../contract/evals.ts";
import { grade } from "./graders.ts";

interface Job {
  id: number;
  grader: EvalGrader;
  answer: string;
  expected: string;
}

parentPort?.on("message", ({ id, grader, answer, expected }: Job) => {
  try {
    parentPort?.postMessage({ id, score: grade(grader, answer, expected) });
  } catch (error) {
    parentPort?.postMessage({ id, error: error instanceof Error ? error.message : String(error) });
  }
});
// Loaded: deadlines count from here, not from the thread's start.
parentPort?.postMessage({ ready: true });
