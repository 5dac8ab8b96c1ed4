/**
 * The embedded trainer's BLAS backend: ggml's BLAS backend compiled against OpenBLAS as a plugin of
 * node-llama-cpp's prebuilt ggml (`npm run setup:trainer`, bin/setup-trainer.sh). Loaded into the trainer
 * process with `ggml_backend_load`, it takes the matrix products of F32 weights, among them the backward pass's
 * `OUT_PROD` (the gradient to the activations of every frozen weight), which the CPU backend computes with
 * vector loops: LoRA on an F32 base then trains 2–2.5× faster (bench/README.md). Built with oneDNN, on a CPU with
 * AVX512-BF16, it runs every product through oneDNN instead, those of non-F32 weights in bf16
 * (bin/patches/ggml-blas-bf16.diff). Generation never loads it.
 */
import koffi from "koffi";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { loadLlamaLib, type LlamaLib } from "../libllama/llamaLib.ts";
import { nodeLlamaCppVersion } from "../../model/nodeLlamaCpp.ts";

/** What `npm run setup:trainer` writes. */
export const PROJECT_BLAS_LIBRARY = fileURLToPath(
  new URL("../../../.cache/trainer-blas/libggml-blas.so", import.meta.url),
);

/** The setup command, for messages. */
export const TRAINER_SETUP_COMMAND = "npm run setup:trainer";

export type BlasStatus =
  | {
      available: true;
      library: string;
      /**
       * Whether it takes the products of quantized (and F16) weights too, the backward pass's `OUT_PROD` included
       * (bin/patches/ggml-blas-out-prod-quantized.diff, recorded in `build.json`): a LoRA base then trains as it is.
       */
      quantized: boolean;
      /**
       * Whether it computes the products of weights that are not F32 (a LoRA base trained as it is) in bf16:
       * compiled with oneDNN (bin/patches/ggml-blas-bf16.diff, `build.json`), on a CPU that multiplies bf16
       * natively (AVX512-BF16), and not turned off (`GGML_BLAS_BF16=0`).
       */
      bf16: boolean;
    }
  | { available: false; library: string | null; reason: string };

/**
 * Whether the trainer has a BLAS backend to load, from `CONDUIT_TRAINER_BLAS`: `off`, a library's path, or
 * unset (the project's own, when `npm run setup:trainer` made it). Cheap: a stat and the setup's `build.json`,
 * whose node-llama-cpp version must be the installed one (the plugin is compiled against its ggml).
 */
export function blasStatus(setting: string | undefined): BlasStatus {
  if (setting?.toLowerCase() === "off")
    return { available: false, library: null, reason: "CONDUIT_TRAINER_BLAS is off" };
  const library = setting ?? PROJECT_BLAS_LIBRARY;
  if (!fs.existsSync(library))
    return {
      available: false,
      library: setting ?? null,
      reason:
        setting === undefined
          ? `no BLAS backend (${TRAINER_SETUP_COMMAND} makes one)`
          : `CONDUIT_TRAINER_BLAS names ${library}, which does not exist`,
    };
  const { nodeLlamaCpp: built, quantized, bf16 } = buildOf(library);
  const installed = nodeLlamaCppVersion();
  if (built !== undefined && installed !== undefined && built !== installed)
    return {
      available: false,
      library,
      reason:
        `the BLAS backend was compiled for node-llama-cpp ${built}, and ${installed} is installed: ` +
        `run ${TRAINER_SETUP_COMMAND} again`,
    };
  return { available: true, library, quantized, bf16: bf16 && bf16Products() };
}

/** Whether this CPU multiplies bf16 natively (AVX512-BF16), and `GGML_BLAS_BF16` does not turn it off. */
export function bf16Products(): boolean {
  if (process.env.GGML_BLAS_BF16 === "0") return false;
  cpuBf16 ??= (() => {
    try {
      return /^flags\s*:.*\bavx512_bf16\b/m.test(fs.readFileSync("/proc/cpuinfo", "utf8"));
    } catch {
      return false;
    }
  })();
  return cpuBf16;
}
let cpuBf16: boolean | undefined;

/** The products a backend of this status takes (loraBase.ts's `blas`). */
export function blasKind(status: BlasStatus): "none" | "f32" | "any" {
  return !status.available ? "none" : status.quantized ? "any" : "f32";
}

/**
 * What `build.json` beside the library says: the node-llama-cpp version it was compiled for and whether it takes
 * products of quantized weights. A library without one (built elsewhere) is taken as ggml's own: F32 only.
 */
export function buildOf(library: string): { nodeLlamaCpp?: string; quantized: boolean; bf16: boolean } {
  try {
    const build = JSON.parse(fs.readFileSync(path.join(path.dirname(library), "build.json"), "utf8")) as {
      nodeLlamaCpp?: unknown;
      quantizedOutProd?: unknown;
      bf16?: unknown;
    };
    return {
      ...(typeof build.nodeLlamaCpp === "string" ? { nodeLlamaCpp: build.nodeLlamaCpp } : {}),
      quantized: build.quantizedOutProd === true,
      bf16: build.quantizedOutProd === true && build.bf16 === true,
    };
  } catch {
    return { quantized: false, bf16: false };
  }
}

/**
 * Registers the BLAS backend in this process's ggml (after `ggml_backend_load_all_from_path`, before any
 * context): llama.cpp then schedules the products it supports on it, OpenBLAS on `threads` threads unless the
 * environment sets `OPENBLAS_NUM_THREADS` (OpenBLAS reads it when it loads). Returns the device's description,
 * or `undefined` with the reason logged when it did not load.
 */
export function loadBlasBackend(
  lib: LlamaLib,
  library: string,
  threads: number,
  log: (line: string) => void,
): string | undefined {
  process.env.OPENBLAS_NUM_THREADS ??= String(threads);
  // A backend built with oneDNN runs its products on OpenMP threads (bin/patches/ggml-blas-bf16.diff), which by
  // default spin a while after each product, on the cores ggml's own ops and other users need: SmolLM2 trained at
  // 136 tok/s so (112 always spinning), 192 with them asleep (bench/README.md). libgomp reads this when it loads.
  process.env.OMP_WAIT_POLICY ??= "PASSIVE";
  const before = lib.ggml_backend_dev_count();
  if (lib.ggml_backend_load(library) === null) {
    log(`trainer: the BLAS backend ${library} did not load (llama.cpp's log says why); training without it`);
    return undefined;
  }
  for (let i = before; i < lib.ggml_backend_dev_count(); i++) {
    const device = lib.ggml_backend_dev_get(i);
    if (lib.ggml_backend_dev_name(device) === "BLAS") return lib.ggml_backend_dev_description(device);
  }
  log(`trainer: ${library} registered no BLAS device; training without it`);
  return undefined;
}

/**
 * Sets OpenBLAS's threads between calls (`openblas_set_num_threads` of the libopenblas the backend loaded; the
 * backend itself leaves them alone, bin/setup-trainer.sh), or `undefined` where that library is not OpenBLAS.
 */
export function openBlasThreads(): ((threads: number) => void) | undefined {
  try {
    const set = koffi.load("libopenblas.so.0").func("void openblas_set_num_threads(int)") as (
      n: number,
    ) => void;
    return (threads) => set(threads);
  } catch {
    return undefined;
  }
}

/** For the setup's check: loads the trainer's llama.cpp and `library` into this process; throws when it fails. */
export function probeBlasBackend(library: string): string {
  const lib = loadLlamaLib();
  lib.ggml_backend_load_all_from_path(lib.binDir);
  const lines: string[] = [];
  const description = loadBlasBackend(lib, library, 1, (line) => lines.push(line));
  if (description === undefined) throw new Error(lines.join("\n"));
  return `the trainer's llama.cpp (${lib.binDir}) loads ${library}: ${description}`;
}
