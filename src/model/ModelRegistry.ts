import fs from "node:fs";
import path from "node:path";
import { resolveModelFile } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import type { ModelRef } from "./types.ts";

/** A model file in the models directory. */
export interface ModelInfo extends ModelRef {
  sizeBytes: number;
  modifiedAt: Date;
}

/** Progress of a `pull`, as bytes; `totalBytes` is 0 until the server has said how big the file is. */
export interface PullProgress {
  downloadedBytes: number;
  totalBytes: number;
}

export interface ModelRegistryOptions {
  /** Directory of `*.gguf` files; created when missing. Every file is a model whose id is its name without `.gguf`. */
  modelsDir: string;
}

/**
 * Ids are file names, so they are the only user input that reaches the file system here. Allowing just
 * this alphabet (no `/`, `\`, NUL, leading dot) means an id can never name a path outside the models
 * directory, whatever the platform's path rules are.
 */
const MODEL_ID = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$/;

/** Whether `id` is a well-formed model id (a file name stem that cannot escape the models directory). */
export function isValidModelId(id: string): boolean {
  return MODEL_ID.test(id) && !id.includes("..");
}

/** The models directory: every `*.gguf` file is a model; `hf:` and URL references are downloaded into it. */
export class ModelRegistry {
  readonly modelsDir: string;

  constructor(options: ModelRegistryOptions) {
    this.modelsDir = path.resolve(options.modelsDir);
    fs.mkdirSync(this.modelsDir, { recursive: true });
  }

  /** Every model in the directory, sorted by id. Files whose names are not valid ids are skipped. */
  list(): ModelInfo[] {
    const models: ModelInfo[] = [];
    for (const entry of fs.readdirSync(this.modelsDir, { withFileTypes: true })) {
      // Symlinks count: an operator may link models kept elsewhere; statModel checks the target is a file.
      if (!(entry.isFile() || entry.isSymbolicLink()) || !entry.name.endsWith(".gguf")) continue;
      const info = this.statModel(entry.name.slice(0, -".gguf".length));
      if (info) models.push(info);
    }
    return models.sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
  }

  /** The model with this id, or `undefined` when there is none (or the id is malformed). */
  resolve(id: string): ModelRef | undefined {
    const info = this.statModel(id);
    return info ? { id: info.id, path: info.path } : undefined;
  }

  /** Like `resolve` with the file's size and time, or `undefined`. */
  info(id: string): ModelInfo | undefined {
    return this.statModel(id);
  }

  /** Like `resolve`, but throws `model_not_found` (with `param`) instead of returning `undefined`. */
  require(id: string, param = "model"): ModelRef {
    const ref = this.resolve(id);
    if (!ref) throw new ConduitError("model_not_found", `The model '${id}' does not exist.`, { param });
    return ref;
  }

  /**
   * Downloads a model into the directory and returns it. `ref` is anything node-llama-cpp resolves:
   * `hf:user/repo:quant`, `hf:user/repo/file.gguf` or an `https://` URL. A file that is already there
   * is not downloaded again. Split models resolve to their first part. `options.id` names the file
   * (`{id}.gguf`); without it node-llama-cpp names it after the repository and quantization.
   */
  async pull(
    ref: string,
    onProgress?: (progress: PullProgress) => void,
    options: { signal?: AbortSignal; id?: string } = {},
  ): Promise<ModelInfo> {
    if (!/^(hf:|https?:\/\/)/.test(ref))
      throw new ConduitError("invalid_request", "A model reference starts with `hf:` or `https://`.", {
        param: "model",
      });
    if (options.id !== undefined && !isValidModelId(options.id))
      throw new ConduitError("invalid_request", "A model id is letters, digits, `.`, `_` and `-`.", {
        param: "id",
      });
    let filePath: string;
    try {
      filePath = await resolveModelFile(ref, {
        directory: this.modelsDir,
        download: "auto",
        cli: false,
        ...(options.id !== undefined ? { fileName: `${options.id}.gguf` } : {}),
        signal: options.signal,
        onProgress: onProgress
          ? ({ downloadedSize, totalSize }) =>
              onProgress({ downloadedBytes: downloadedSize, totalBytes: totalSize })
          : undefined,
      });
    } catch (error) {
      if (options.signal?.aborted) throw error;
      throw new ConduitError("unavailable", `Could not download '${ref}'.`, { cause: error });
    }
    let name = path.basename(filePath);
    // node-llama-cpp names downloads after the repository; make sure the name is a valid id.
    const safe = name.replace(/[^A-Za-z0-9._-]/g, "_").replace(/^[._-]+/, "");
    if (safe !== name && safe.endsWith(".gguf") && path.dirname(filePath) === this.modelsDir) {
      fs.renameSync(filePath, path.join(this.modelsDir, safe));
      name = safe;
    }
    const info = name.endsWith(".gguf") ? this.statModel(name.slice(0, -".gguf".length)) : undefined;
    if (!info || path.dirname(filePath) !== this.modelsDir)
      throw new ConduitError(
        "unavailable",
        `'${ref}' did not resolve to a GGUF file in the models directory.`,
      );
    return info;
  }

  private statModel(id: string): ModelInfo | undefined {
    if (!isValidModelId(id)) return undefined;
    const filePath = path.join(this.modelsDir, `${id}.gguf`);
    // Belt and braces: the id alphabet already rules this out.
    if (path.dirname(filePath) !== this.modelsDir) return undefined;
    try {
      const stat = fs.statSync(filePath);
      if (!stat.isFile()) return undefined;
      return { id, path: filePath, sizeBytes: stat.size, modifiedAt: stat.mtime };
    } catch {
      return undefined;
    }
  }
}
