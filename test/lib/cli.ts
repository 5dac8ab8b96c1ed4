import { execFile } from "node:child_process";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { buildTestApp, KEY_A, testEnv } from "./helper.ts";

/** The real `conduit` entry point. */
export const bin = fileURLToPath(new URL("../../bin/conduit.js", import.meta.url));

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the real `conduit` binary, with `input` on its stdin (or none). */
export function conduitWithInput(
  env: Record<string, string>,
  input: string | undefined,
  ...args: string[]
): Promise<CliResult> {
  return new Promise((resolve) => {
    const child = execFile(
      process.execPath,
      [bin, ...args],
      { env: { PATH: process.env.PATH ?? "", ...env }, timeout: 240_000 },
      (error, stdout, stderr) =>
        resolve({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr }),
    );
    child.stdin?.end(input);
  });
}

/** Runs the real `conduit` binary with `args`, its environment `env` (and PATH) alone. */
export function conduit(env: Record<string, string>, ...args: string[]): Promise<CliResult> {
  return conduitWithInput(env, undefined, ...args);
}

/** `--json` output: one JSON document a line. */
export function jsonLines<T>(stdout: string): T[] {
  return stdout
    .trim()
    .split("\n")
    .map((line) => JSON.parse(line) as T);
}

/** A listening server on a fresh data dir, and the environment that points the CLI at it as alice. */
export async function cliServer(t: TestContext) {
  const environment = await testEnv(t);
  const { app, core } = await buildTestApp(t, environment);
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  const env = {
    CONDUIT_DATA_DIR: environment.dataDir,
    CONDUIT_LOG_LEVEL: "silent",
    CONDUIT_URL: url,
    CONDUIT_API_KEY: KEY_A,
  };
  return { environment, core, env };
}
