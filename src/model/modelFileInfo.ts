import fs from "node:fs/promises";
import { GgufFileType, readGgufFileInfo } from "node-llama-cpp";
import { identityOf } from "./fileIdentity.ts";

/** What a model file's GGUF header says about it, and its size. */
export interface ModelFileInfo {
  sizeBytes: number;
  /** Tokens of the model's training context (`{architecture}.context_length`); `null` when the header has none (a LoRA adapter). */
  contextLength: number | null;
  /** llama.cpp's name of the file type (`general.file_type`): `F32`, `F16`, `Q8_0`, `Q4_K_M`, …; `null` when the header has none. */
  quantization: string | null;
}

/** The header's big arrays, which none of the fields above need. */
const IGNORED_KEYS = [
  "tokenizer.ggml.tokens",
  "tokenizer.ggml.scores",
  "tokenizer.ggml.token_type",
  "tokenizer.ggml.merges",
];

/** `MOSTLY_Q4_K_M` → `Q4_K_M`, `ALL_F32` → `F32`. */
function quantizationName(fileType: unknown): string | null {
  if (typeof fileType !== "number") return null;
  const name = (GgufFileType as unknown as Record<number, string | undefined>)[fileType];
  return name ? name.replace(/^(MOSTLY|ALL)_/, "") : `file type ${fileType}`;
}

async function read(file: string, sizeBytes: number): Promise<ModelFileInfo> {
  try {
    const info = await readGgufFileInfo(file, {
      readTensorInfo: false,
      sourceType: "filesystem",
      ignoreKeys: IGNORED_KEYS,
      logWarnings: false,
    });
    const contextLength = (info.architectureMetadata as { context_length?: unknown }).context_length;
    return {
      sizeBytes,
      contextLength: typeof contextLength === "number" ? contextLength : null,
      quantization: quantizationName(info.metadata.general?.file_type),
    };
  } catch {
    // Not a readable GGUF: listing it must not fail; loading it will say why.
    return { sizeBytes, contextLength: null, quantization: null };
  }
}

/** Headers read, by path, while the file stays the same ({@link identityOf}). */
const cache = new Map<string, { stamp: string; info: Promise<ModelFileInfo> }>();
const CACHE_LIMIT = 1000;

/**
 * Reads a model file's size and header (once per version of the file: listings call this for
 * every model). `undefined` when there is no file.
 */
export async function readModelFileInfo(file: string): Promise<ModelFileInfo | undefined> {
  let stamp: string;
  let sizeBytes: number;
  try {
    const stat = await fs.stat(file);
    if (!stat.isFile()) return undefined;
    stamp = identityOf(stat);
    sizeBytes = stat.size;
  } catch {
    return undefined;
  }
  const cached = cache.get(file);
  if (cached?.stamp === stamp) return cached.info;
  const info = read(file, sizeBytes);
  cache.delete(file);
  if (cache.size >= CACHE_LIMIT) cache.delete(cache.keys().next().value as string);
  cache.set(file, { stamp, info });
  return info;
}
