/**
 * Whether the torch trainer can run here: the configured Python (`CONDUIT_PYTHON`, else the project's own
 * venv from `npm run setup:torch`) imports the worker's packages. Asked once at start in the background
 * (importing PyTorch takes seconds); an unavailable answer is asked again at most once a minute, so a venv
 * made while the server runs is found without a restart.
 */
import { spawn } from "node:child_process";
import fs from "node:fs";
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

  /** The answer, checking (again) when there is none yet or the last one is a stale "unavailable". */
  check(): Promise<TorchStatus> {
    const stale =
      this.settled !== undefined && !this.settled.available && Date.now() - this.checkedAt > RECHECK_MS;
    if (this.pending === undefined || stale) {
      this.checkedAt = Date.now();
      this.pending = probeTorch(this.python).then((status) => (this.settled = status));
    }
    return this.pending;
  }
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
