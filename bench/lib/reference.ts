// Where bench/setup.sh puts the raw llama.cpp reference tools and the benchmark models.
// Bench scripts import these instead of hard-coding paths; nothing here builds or downloads.
import { existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const cacheDir = join(repoRoot, ".cache");
/** `CONDUIT_BENCH_LLAMA_BIN` points elsewhere, e.g. at the CUDA build bench/gpu/run.sh unpacks. */
export const llamaBinDir =
  process.env["CONDUIT_BENCH_LLAMA_BIN"] || join(cacheDir, "llama.cpp", "build", "bin");
export const modelsDir = join(cacheDir, "models");

export type ReferenceTool = "llama-bench" | "llama-server" | "llama-cli" | "llama-finetune";
export type BenchModel = "stories260K" | "smollm2-135m" | "qwen2.5-coder-0.5b" | "qwen2.5-coder-1.5b";

const modelFiles: Record<BenchModel, string> = {
  stories260K: "stories260Ktok512.gguf",
  "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
  "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
  "qwen2.5-coder-1.5b": "qwen2.5-coder-1.5b-instruct.gguf",
};

export function toolPath(tool: ReferenceTool): string {
  return join(llamaBinDir, tool);
}

export function modelPath(model: BenchModel): string {
  return join(modelsDir, modelFiles[model]);
}

/** The path, or throws with the command that provides it. */
export function requireFile(path: string): string {
  if (!existsSync(path)) {
    throw new Error(`${path} not found: run \`bash bench/setup.sh\` first`);
  }
  return path;
}

/** Models that setup.sh provided on this machine (stories260K needs ../shared). */
export function availableModels(): BenchModel[] {
  return (Object.keys(modelFiles) as BenchModel[]).filter((m) => existsSync(modelPath(m)));
}
