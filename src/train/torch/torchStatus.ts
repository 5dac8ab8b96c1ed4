/**
 * Whether the torch trainer can run here: the configured Python (`CONDUIT_PYTHON`, else the project's own
 * venv from `npm run setup:torch`) imports the worker's packages. Asked once at start in the background
 * (importing PyTorch takes seconds), and again as soon as the Python's install changes (the venv made, a package
 * installed or removed: its `site-packages` folders' times), so a venv made while the server runs is found
 * without a restart; an unavailable answer is also asked again at most once a minute.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { TORCH_WORKER } from "./runTorchTraining.ts";

/** The venv `npm run setup:torch` makes. */
export const PROJECT_TORCH_PYTHON = fileURLToPath(
  new URL("../../../.cache/torch-venv/bin/python", import.meta.url),
);

/** The setup command, for messages. */
export const TORCH_SETUP_COMMAND = "npm run setup:torch";

/** What `worker.py --probe` reports. */
export interface TorchProbe {
  python: string;
  torch: string;
  transformers: string;
  peft: string;
  gguf: string;
  cuda: boolean;
  cudaDevice: string | null;
  /** Whether the worker trains in bf16 here (a CUDA GPU with bf16, or a CPU with AVX512-BF16 or AMX). */
  bf16: boolean;
}

export type TorchStatus =
  | { available: true; python: string; probe: TorchProbe }
  | { available: false; python: string | null; reason: string };

const RECHECK_MS = 60_000;
const PROBE_TIMEOUT_MS = 120_000;

const statuses = new Map<string, TorchTrainerStatus>();

/** The status of the torch trainer with `CONDUIT_PYTHON` set to `python`: one per setting in a process. */
export function torchStatus(python: string | undefined): TorchTrainerStatus {
  let status = statuses.get(python ?? "");
  if (status === undefined) statuses.set(python ?? "", (status = new TorchTrainerStatus(python)));
  return status;
}

export class TorchTrainerStatus {
  private pending: Promise<TorchStatus> | undefined;
  private settled: TorchStatus | undefined;
  private checkedAt = 0;
  /** The install the pending (or last) check looked at (`installStamp`). */
  private checkedStamp = "";
  private checking = false;

  /** @param configured `CONDUIT_PYTHON`; unset means the project's venv when it exists. */
  constructor(private readonly configured: string | undefined) {}

  /** The Python this server would run the worker with, or null when there is none. */
  get python(): string | null {
    if (this.configured !== undefined) return this.configured;
    return fs.existsSync(PROJECT_TORCH_PYTHON) ? PROJECT_TORCH_PYTHON : null;
  }

  /** The last answer, without waiting (undefined while the first check runs). */
  current(): TorchStatus | undefined {
    return this.settled;
  }

  /**
   * The last answer without waiting, and whether a check is running; starts one in the background when the
   * answer is stale (`/healthz`: a venv made while the server runs shows there without a run being created).
   */
  peek(): { status: TorchStatus | undefined; checking: boolean } {
    if (this.isStale()) void this.check();
    return { status: this.settled, checking: this.checking };
  }

  /**
   * The answer, checking (again) when there is none yet, when the Python's install changed since the last check,
   * or when the last one is an "unavailable" older than a minute.
   */
  check(): Promise<TorchStatus> {
    if (this.pending === undefined || (!this.checking && this.isStale())) {
      const python = this.python;
      this.checkedAt = Date.now();
      this.checkedStamp = installStamp(python);
      this.checking = true;
      this.pending = probeTorch(python).then((status) => {
        this.checking = false;
        return (this.settled = status);
      });
    }
    return this.pending;
  }

  private isStale(): boolean {
    if (this.pending === undefined) return true;
    if (this.checking) return false;
    if (installStamp(this.python) !== this.checkedStamp) return true;
    return this.settled !== undefined && !this.settled.available && Date.now() - this.checkedAt > RECHECK_MS;
  }
}

/**
 * What changes when a Python's packages do: the executable's and its `lib/python3.*\/site-packages` folders'
 * modification times (pip adds and removes folders there). Reads a few directory entries; "" for no Python.
 */
export function installStamp(python: string | null): string {
  if (python === null) return "";
  const parts: string[] = [];
  const time = (file: string) => {
    try {
      parts.push(`${file}:${fs.statSync(file).mtimeMs}`);
    } catch {
      parts.push(`${file}:-`);
    }
  };
  time(python);
  const lib = path.join(path.dirname(python), "..", "lib");
  try {
    for (const entry of fs.readdirSync(lib))
      if (entry.startsWith("python")) time(path.join(lib, entry, "site-packages"));
  } catch {
    // not a venv's layout: the executable alone
  }
  return parts.join("|");
}

/** Runs `worker.py --probe` with `python`. */
export async function probeTorch(python: string | null): Promise<TorchStatus> {
  if (python === null)
    return {
      available: false,
      python,
      reason: `no Python for the torch trainer (CONDUIT_PYTHON is unset and there is no .cache/torch-venv; ${TORCH_SETUP_COMMAND} makes it)`,
    };
  if (!fs.existsSync(python))
    return {
      available: false,
      python,
      reason: `CONDUIT_PYTHON ${python} does not exist (${TORCH_SETUP_COMMAND} makes .cache/torch-venv)`,
    };
  const { code, stdout, stderr } = await new Promise<{ code: number | null; stdout: string; stderr: string }>(
    (resolve) => {
      const child = spawn(python, [TORCH_WORKER, "--probe"], {
        stdio: ["ignore", "pipe", "pipe"],
        timeout: PROBE_TIMEOUT_MS,
        env: { ...process.env, HF_HUB_OFFLINE: "1", TRANSFORMERS_OFFLINE: "1" },
      });
      let out = "";
      let err = "";
      child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
      child.stderr.on("data", (chunk: Buffer) => (err += chunk.toString()));
      child.on("error", (error) => resolve({ code: null, stdout: out, stderr: error.message }));
      child.on("close", (exitCode) => resolve({ code: exitCode, stdout: out, stderr: err }));
    },
  );
  if (code === 0)
    try {
      return {
        available: true,
        python,
        probe: JSON.parse(stdout.trim().split("\n").at(-1) ?? "") as TorchProbe,
      };
    } catch {
      // fall through: not the worker's answer
    }
  const last = stderr.trim().split("\n").at(-1) ?? "";
  return {
    available: false,
    python,
    reason: `${python} cannot run the torch trainer (${last || `exit code ${code}`}); ${TORCH_SETUP_COMMAND} installs its packages`,
  };
}

/** One line on what the torch trainer computes with, for logs and `/healthz`. */
export function describeTorch(probe: TorchProbe): string {
  const where = probe.cuda ? `CUDA (${probe.cudaDevice ?? "GPU"})` : "the CPU";
  return `PyTorch ${probe.torch} + PEFT ${probe.peft} on ${where}, ${probe.bf16 ? "bf16" : "F32"}`;
}
