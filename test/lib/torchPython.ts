/** The Python of the torch trainer backend for tests: `CONDUIT_TEST_TORCH_PYTHON`, or the venv `npm run setup:torch` makes. */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import { TORCH_WORKER } from "../../src/train/torch/runTorchTraining.ts";

export type TorchPython = { ok: true; python: string } | { ok: false; reason: string };

let found: TorchPython | undefined;

export function torchPythonForTests(): TorchPython {
  if (found !== undefined) return found;
  const candidates = [process.env.CONDUIT_TEST_TORCH_PYTHON, ".cache/torch-venv/bin/python"].filter(
    (c): c is string => c !== undefined && c !== "",
  );
  const tried: string[] = [];
  for (const python of candidates) {
    if (!fs.existsSync(python)) {
      tried.push(`${python}: not there`);
      continue;
    }
    const probe = spawnSync(python, [TORCH_WORKER, "--probe"], { encoding: "utf8", timeout: 120_000 });
    if (probe.status === 0) return (found = { ok: true, python });
    tried.push(`${python}: ${(probe.stderr || probe.error?.message || "").trim().split("\n").at(-1)}`);
  }
  return (found = {
    ok: false,
    reason: `no Python with the torch trainer's packages (npm run setup:torch, or set CONDUIT_TEST_TORCH_PYTHON); tried ${tried.join("; ") || "nothing"}`,
  });
}
