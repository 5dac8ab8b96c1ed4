/**
 * The torch trainer: the PyTorch + PEFT worker (`worker.py`, `npm run setup:torch`), fed by the trainer child
 * process (`runTorchTraining.ts`) with the windows Conduit tokenized and planned. LoRA only; every LoRA target.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Type } from "@sinclair/typebox";
import { LORA_TARGETS } from "../../contract/runs.ts";
import {
  memoryOf,
  type MemoryLine,
  type TrainerBackend,
  type TrainerHealth,
} from "../core/TrainerBackend.ts";
import { runTorchTraining } from "./runTorchTraining.ts";
import { describeTorch, TORCH_SETUP_COMMAND, torchStatus } from "./torchStatus.ts";

/** The torch trainer's settings for a job. */
export interface TorchOptions {
  /** The Python executable that has the pinned PyTorch, transformers, PEFT and gguf packages. */
  python: string;
  /** `auto` uses CUDA when PyTorch sees a GPU. */
  device: "auto" | "cpu" | "cuda";
  /** Type of the base weights: `auto` is bf16 where the hardware computes it natively, else F32. */
  dtype: "auto" | "bf16" | "f32";
  /**
   * For tests and benches: after training, the trained model's logits for these tokens (one sequence) are
   * written to `file`, raw F32 `[tokens, vocab]`, to compare with llama.cpp serving the exported adapter.
   * `null`: none.
   */
  probe: { tokens: number[]; file: string } | null;
  /**
   * For exports and tests: a folder where the worker also saves the trained adapter as PEFT writes it
   * (`save_pretrained`: `adapter_model.safetensors` + `adapter_config.json`, Hugging Face's layout). `null`: none.
   */
  peftDir?: string | null;
  /**
   * Where the worker keeps a dequantized copy of each base it loads (transformers parses and dequantizes a GGUF
   * in Python on every load: 15–40 s for small models), so that the next run on the same file loads in about
   * a second. `null`: every run loads the GGUF.
   */
  cacheDir: string | null;
  /**
   * Data-parallel processes (`torchrun` ranks) on this machine: each trains a share of every step's windows, and
   * their gradients are summed before the step. Defaults to `1` (the worker alone, without `torchrun`).
   */
  ranks: number;
  /**
   * Machines the run trains on, `ranks` each: this one first (rank 0, which writes everything), the others joining
   * through `rendezvous` (`torchrun … worker.py --follow`). Defaults to `1`.
   */
  nodes: number;
  /** Where the other machines reach this one (`torchrun`'s master address and port); `null` with one machine. */
  rendezvous: { host: string; port: number } | null;
  /**
   * Windows one optimizer step averages the gradients of (each window's mean loss weighs the same). Defaults to
   * `ranks` × `nodes`: one window per rank a step; one rank with a larger count trains as that many ranks would.
   */
  windowsPerStep: number;
  /**
   * Whether the worker chooses its CPU threads between steps by timing them (worker.py's `ThreadTuner`, the policy
   * of `threadTuner.ts`): one fewer than `threads` first, which leaves a core to the server, then all of them; the
   * faster kept. PyTorch's threads spin-wait: two on 2 idle cores trained the 1.5B base 1.67× faster than one,
   * while on cores busy elsewhere two trained SmolLM2 8× slower than one (bench/README.md). `CONDUIT_TRAIN_THREADS=auto`
   * does; one rank of several does not (the ranks step together). Defaults to false.
   */
  tuneThreads?: boolean;
}

/**
 * Its rate at one thread in training tokens per CPU-second, falling with the parameters as a power, with the
 * defaults (rank 32 on every target and the output head); capped for tiny models (the test model trained at about
 * 25,000 tokens per second on the worker's 2 threads here). bench/README.md, `readyTime.ts`:
 * - bf16 (a CPU with AVX512-BF16 or AMX): fitted so that the estimates at creation of the 200-pair runs on
 *   SmolLM2-135M, Qwen2.5-Coder-0.5B and Qwen2.5-Coder-1.5B land on their actual times (they were 1.41×, 1.37× and
 *   0.70× of them with one curve for both types: the larger bases train slower than PEFT's F32 slope says);
 * - F32: PEFT LoRA's slope between SmolLM2-135M and the ~1B model (#27: 192.3 → 70.9 at rank 16), at the rate the
 *   defaults trained SmolLM2 at on a CPU without bf16 (86.4 tokens per second, one thread).
 */
const RATE = {
  referenceParameters: 134_515_008,
  bf16: { lora: 302, exponent: 0.75 },
  f32: { lora: 90, exponent: 0.47 },
  most: 18_000,
  /** 2 threads trained SmolLM2 1.35× faster than 1 on 2 cores (`CONDUIT_TRAIN_THREADS`). */
  threadExponent: Math.log2(1.35),
} as const;

/** The prior's training tokens per second on a base of `parameters`, in bf16 or F32, with `threads`. */
export function torchRate(parameters: number, bf16: boolean, threads: number): number {
  const curve = bf16 ? RATE.bf16 : RATE.f32;
  const scale = parameters > 0 ? parameters / RATE.referenceParameters : 1;
  const perThread = Math.min(RATE.most, curve.lora * scale ** -curve.exponent);
  return perThread * Math.max(1, threads) ** RATE.threadExponent;
}

const GIB = 2 ** 30;

/**
 * The worker's peak RSS (bench/README.md, `trainTorch.ts` and `readyTime.ts`): bf16, SmolLM2-135M 1.31 GB and
 * Qwen2.5-Coder-1.5B 7.96 GB (its first run: converting the GGUF, 256-token windows, rank 32 on every target and the
 * output head of a 151,936-token vocabulary); F32, SmolLM2-135M 1.90 GB and ~1.1B of TinyLlama's shape 7.98 GB.
 * Lines through those points. Those first runs kept the GGUF mapped throughout (1.17 GB of the 1.5B's peak); the
 * worker lets it go after the load since, so the lines are that much on the safe side for a first run's base.
 */
const TORCH_MEMORY = {
  bf16: { fixed: 0.67e9, perParameter: 4.73 },
  f32: { fixed: 1.05e9, perParameter: 6.3 },
} satisfies Record<string, MemoryLine>;

/** Where the worker keeps its dequantized copies of base models, with everything else the server keeps. */
function torchCacheDir(serverCacheDir: string): string {
  return path.join(serverCacheDir, "torch");
}

/**
 * Whether the worker kept a copy of this base already (worker.py's `base_cache_dir`: a folder named after the file,
 * then a key of its path, size, time, weight type and transformers' version), so its next load converts nothing.
 * A copy of an older version of the file counts too: rare, and then the estimate is short by one conversion.
 */
export function hasBaseCopy(cacheDir: string, modelFile: string): boolean {
  let name: string;
  try {
    name = path.basename(fs.realpathSync(modelFile)).replace(/\.gguf$/, "");
    return fs
      .readdirSync(cacheDir)
      .some(
        (entry) =>
          entry.startsWith(`${name}-`) &&
          /^[0-9a-f]{16}$/.test(entry.slice(name.length + 1)) &&
          fs.existsSync(path.join(cacheDir, entry, "config.json")),
      );
  } catch {
    return false;
  }
}

const TorchHealth = Type.Object(
  {
    available: Type.Boolean(),
    checking: Type.Optional(
      Type.Boolean({
        description:
          "A check (importing PyTorch) is running: the first, or one after its Python's packages changed " +
          "(`npm run setup:torch` while the server runs); the other fields are the last check's.",
      }),
    ),
    python: Type.Union([Type.String(), Type.Null()], {
      description: "The Python it runs with (`CONDUIT_PYTHON`).",
    }),
    detail: Type.Optional(Type.String({ description: "Versions, device and weight type, when available." })),
    reason: Type.Optional(Type.String({ description: "Why it is not available." })),
  },
  { description: "The PyTorch + PEFT trainer (`npm run setup:torch`)." },
);

/**
 * The torch trainer as last checked; a check is started here (never awaited) when there was none, or when the
 * Python's install changed since the last one: `checking` says one is running.
 */
const torchHealth = {
  schema: TorchHealth,
  now(host) {
    const torch = torchStatus(host.python);
    const { status, checking } = torch.peek();
    const running = checking ? { checking: true } : {};
    if (status === undefined) return { available: false, checking: true, python: torch.python };
    return status.available
      ? { available: true, ...running, python: status.python, detail: describeTorch(status.probe) }
      : { available: false, ...running, python: status.python, reason: status.reason };
  },
} satisfies TrainerHealth<typeof TorchHealth>;

export const torchTrainer: TrainerBackend<TorchOptions> = {
  name: "torch",
  setupCommand: TORCH_SETUP_COMMAND,
  health: torchHealth,
  async status(host) {
    const status = await torchStatus(host.python).check();
    return status.available
      ? { available: true, detail: describeTorch(status.probe) }
      : { available: false, reason: status.reason };
  },
  cannotTrain: ({ method }) =>
    method === "lora"
      ? undefined
      : { param: "method", why: 'the torch trainer trains LoRA adapters only ("method": "lora")' },
  loraTargets: LORA_TARGETS,
  // auto: every core, the worker choosing between steps that or one fewer (`tuneThreads`).
  threads: (setting) => (setting === "auto" ? os.availableParallelism() : setting),
  prior: (host) => ({
    tokensPerSecond(_method, model, threads) {
      // The type the worker trains in, from the last check of the install (a run's creation checks it first);
      // F32 (the slower) before any check.
      const status = torchStatus(host.python).current();
      return torchRate(model.parameters, status?.available === true && status.probe.bf16, threads);
    },
    // Starting Python and loading the base; the first time, reading the GGUF and dequantizing it into the copy
    // the next runs load (bench/README.md: SmolLM2's 94 MiB 9 s, Qwen2.5-Coder-1.5B's 1,066 MiB 31 s, one thread).
    overheadSeconds: (model) =>
      8 +
      (hasBaseCopy(torchCacheDir(host.cacheDir), model.file) ? 0 : 7 + 0.023 * (model.sizeBytes / 2 ** 20)),
    // A forward pass costs about a third of a training step in PyTorch.
    forwardShare: 1 / 3,
  }),
  async memoryNeed(_method, model, host) {
    const status = await torchStatus(host.python).check();
    const bf16 = status.available && status.probe.bf16;
    // The worker holds the base in bf16 where the CPU computes it natively, else in F32; on a GPU the weights
    // live there, and the host holds about what the first load of the GGUF takes.
    if (status.available && status.probe.cuda && host.gpu !== "off") return GIB + 2 * model.sizeBytes;
    return memoryOf(bf16 ? TORCH_MEMORY.bf16 : TORCH_MEMORY.f32, model.parameters);
  },
  async jobOptions(host) {
    const status = await torchStatus(host.python).check();
    if (!status.available) throw new Error(status.reason);
    return {
      python: status.python,
      device: host.gpu === "off" ? "cpu" : "auto",
      dtype: "auto",
      probe: null,
      // The worker's dequantized copies of base models live with everything else the server keeps.
      cacheDir: torchCacheDir(host.cacheDir),
      ranks: host.ranks,
      nodes: host.nodes,
      rendezvous: host.rendezvous,
      windowsPerStep: host.ranks * host.nodes,
      tuneThreads: host.threads === "auto",
    };
  },
  run: runTorchTraining,
};
