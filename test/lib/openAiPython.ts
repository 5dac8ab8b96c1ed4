import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";

/** A Python with the official `openai` package: `CONDUIT_TEST_OPENAI_PYTHON`, or `.ci/run`'s venv. */
export function openAiPython(): string | undefined {
  const candidates = [process.env.CONDUIT_TEST_OPENAI_PYTHON, ".cache/openai-venv/bin/python"];
  for (const candidate of candidates) {
    if (candidate === undefined || candidate === "" || !fs.existsSync(candidate)) continue;
    if (spawnSync(candidate, ["-c", "import openai"]).status === 0) return candidate;
  }
  return undefined;
}

/** Why a test of the Python client is skipped, or `false` when it can run. */
export function skipWithoutOpenAiPython(python: string | undefined): string | false {
  return python === undefined
    ? "no Python with the openai package (set CONDUIT_TEST_OPENAI_PYTHON, or run .ci/run, which makes .cache/openai-venv)"
    : false;
}

/** Runs a Python script with arguments; its exit status and output. */
export function runPython(
  python: string,
  script: string,
  args: string[],
): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const child = spawn(python, ["-c", script, ...args]);
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.on("close", (status: number | null) => resolve({ status, stdout, stderr }));
  });
}
