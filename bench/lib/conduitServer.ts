// Starts a real `conduit serve` process for a bench script: a temp data dir whose models/ links the given
// GGUF files, one API key, a free port. The caller stops it with `stop()`.
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import net from "node:net";
import os from "node:os";
import path from "node:path";
import { repoRoot } from "./reference.ts";

export const BENCH_KEY = "bench-key-0000000000000000";

export interface RunningServer {
  url: string;
  child: ChildProcess;
  stop(): void;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const server = net.createServer().listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => resolve(typeof address === "object" && address ? address.port : 0));
    });
  });
}

/** Polls `url` until it answers 2xx (with the bench key), or throws when the child exits or dies or 2 minutes pass. */
export async function waitFor(url: string, child: ChildProcess, what: string): Promise<void> {
  const deadline = Date.now() + 120_000;
  while (Date.now() < deadline) {
    // A child killed by a signal (llama-server's SIGILL on an unsupported instruction) has no exit code.
    if (child.exitCode !== null || child.signalCode !== null)
      throw new Error(`${what} exited with ${child.signalCode ?? `code ${child.exitCode}`}`);
    try {
      if ((await fetch(url, { headers: { authorization: `Bearer ${BENCH_KEY}` } })).ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
  throw new Error(`${what} did not become ready at ${url}`);
}

/**
 * `conduit serve` with `models` (id → GGUF path) in its models directory and `env` on top of the bench
 * defaults (warnings only in the log).
 */
export async function startConduit(
  models: Record<string, string>,
  env: Record<string, string>,
): Promise<RunningServer> {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-"));
  fs.mkdirSync(path.join(dataDir, "models"));
  for (const [id, file] of Object.entries(models))
    fs.symlinkSync(path.resolve(file), path.join(dataDir, "models", `${id}.gguf`));
  const port = await freePort();
  const child = spawn(process.execPath, [path.join(repoRoot, "bin", "conduit.js"), "serve"], {
    env: {
      ...process.env,
      CONDUIT_DATA_DIR: dataDir,
      CONDUIT_PORT: String(port),
      CONDUIT_API_KEYS: `${BENCH_KEY}:bench`,
      CONDUIT_LOG_LEVEL: "warn",
      ...env,
    },
    stdio: ["ignore", "ignore", "inherit"],
  });
  const url = `http://127.0.0.1:${port}`;
  const removeDataDir = () => fs.rmSync(dataDir, { recursive: true, force: true });
  const stop = () => {
    if (child.exitCode !== null || child.signalCode !== null) return removeDataDir();
    child.once("exit", removeDataDir);
    child.kill("SIGTERM");
  };
  try {
    await waitFor(`${url}/healthz`, child, "conduit serve");
  } catch (error) {
    stop();
    throw error;
  }
  return { url, child, stop };
}

/** A JSON request to a Conduit server with the bench key; throws with the body on a non-2xx answer. */
export async function call<T>(
  server: RunningServer,
  method: string,
  route: string,
  body?: unknown,
): Promise<T> {
  const response = await fetch(`${server.url}${route}`, {
    method,
    headers: { authorization: `Bearer ${BENCH_KEY}`, "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${method} ${route}: ${response.status} ${text}`);
  return JSON.parse(text) as T;
}
