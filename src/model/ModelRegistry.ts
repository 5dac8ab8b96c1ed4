import fs from "node:fs";
import path from "node:path";
import { pipeline } from "node:stream/promises";
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
  require(id: string, param: string): ModelRef {
    const ref = this.resolve(id);
    if (!ref) throw new ConduitError("model_not_found", `The model '${id}' does not exist.`, { param });
    return ref;
  }

  /**
   * Downloads a model into the directory and returns it. `ref` is an `http(s)://` URL of a GGUF file, or
   * anything node-llama-cpp resolves: `hf:user/repo:quant`, `hf:user/repo/file.gguf`. A file that is
   * already there is not downloaded again. Split models resolve to their first part. `options.id` names
   * the file (`{id}.gguf`); without it a URL's file keeps its name, and node-llama-cpp names an `hf:` one
   * after the repository and quantization. Fails with `unavailable` naming the reason (a host that does not
   * resolve, a refused connection, an HTTP status, `timeoutMs` without an answer or without more bytes).
   */
  async pull(
    ref: string,
    onProgress?: (progress: PullProgress) => void,
    options: { signal?: AbortSignal; id?: string; timeoutMs?: number } = {},
  ): Promise<ModelInfo> {
    if (!/^(hf:|https?:\/\/)/.test(ref))
      throw new ConduitError("invalid_request", "A model reference starts with `hf:` or `https://`.", {
        param: "model",
      });
    if (options.id !== undefined && !isValidModelId(options.id))
      throw new ConduitError("invalid_request", "A model id is letters, digits, `.`, `_` and `-`.", {
        param: "id",
      });
    const timeoutMs = options.timeoutMs ?? 20_000;
    // Split models (`-00001-of-00003.gguf`) need node-llama-cpp's resolver, which fetches every part.
    const filePath =
      /^https?:/.test(ref) && !/-\d{5}-of-\d{5}\.gguf$/i.test(new URL(ref).pathname)
        ? await this.download(ref, onProgress, { ...options, timeoutMs })
        : await this.resolveWithLlamaCpp(ref, onProgress, { ...options, timeoutMs });
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

  /** Streams a GGUF file from `url` into the directory (through a `.part` file, so a failure leaves nothing). */
  private async download(
    url: string,
    onProgress: ((progress: PullProgress) => void) | undefined,
    options: { signal?: AbortSignal; id?: string; timeoutMs: number },
  ): Promise<string> {
    const fileName = options.id !== undefined ? `${options.id}.gguf` : fileNameOfUrl(url);
    const target = path.join(this.modelsDir, fileName);
    if (path.dirname(target) !== this.modelsDir) throw new Error(`unsafe file name ${fileName}`);
    if (fs.existsSync(target)) return target;
    const part = `${target}.${process.pid}.part`;
    const stall = new Stall(options.timeoutMs, options.signal);
    let downloaded = 0;
    let out: fs.WriteStream | undefined;
    try {
      stall.phase = `no answer from ${new URL(url).host}`;
      const response = await fetch(url, { signal: stall.signal, redirect: "follow" });
      if (!response.ok || !response.body)
        throw new ConduitError(
          "unavailable",
          `Could not download '${url}': HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ""}.`,
        );
      const total = Number(response.headers.get("content-length") ?? 0) || 0;
      stall.phase = "no more bytes";
      stall.touch();
      let head = Buffer.alloc(0);
      await pipeline(
        response.body as unknown as AsyncIterable<Uint8Array>,
        async function* (source: AsyncIterable<Uint8Array>) {
          for await (const chunk of source) {
            stall.touch();
            if (head.length < 4) {
              head = Buffer.concat([head, chunk]).subarray(0, 4);
              if (head.length === 4 && head.toString("latin1") !== "GGUF")
                throw new ConduitError(
                  "unavailable",
                  `Could not download '${url}': the answer is not a GGUF file (it starts with ${JSON.stringify(head.toString("latin1"))}).`,
                );
            }
            downloaded += chunk.length;
            onProgress?.({ downloadedBytes: downloaded, totalBytes: total });
            yield chunk;
          }
        },
        (out = fs.createWriteStream(part)),
        { signal: stall.signal },
      );
      if (total > 0 && downloaded !== total)
        throw new ConduitError(
          "unavailable",
          `Could not download '${url}': the answer ended after ${downloaded} of ${total} bytes.`,
        );
      if (downloaded < 4)
        throw new ConduitError("unavailable", `Could not download '${url}': the answer is not a GGUF file.`);
      fs.renameSync(part, target);
      return target;
    } catch (error) {
      // The file may still be opening when the pipeline fails: remove it once the stream has closed.
      const stream = out;
      if (stream && !stream.closed)
        await new Promise<void>((resolve) => stream.once("close", () => resolve()));
      fs.rmSync(part, { force: true });
      if (options.signal?.aborted) throw error;
      if (error instanceof ConduitError) throw error;
      throw new ConduitError(
        "unavailable",
        `Could not download '${url}': ${stall.reason(error, downloaded)}.`,
        { cause: error },
      );
    } finally {
      stall.clear();
    }
  }

  /** `hf:` references (and split files): node-llama-cpp's resolver, stopped when nothing moves for `timeoutMs`. */
  private async resolveWithLlamaCpp(
    ref: string,
    onProgress: ((progress: PullProgress) => void) | undefined,
    options: { signal?: AbortSignal; id?: string; timeoutMs: number },
  ): Promise<string> {
    const stall = new Stall(options.timeoutMs, options.signal);
    stall.phase = ref.startsWith("hf:") ? "no answer from Hugging Face" : "no answer";
    let downloaded = 0;
    try {
      return await resolveModelFile(ref, {
        directory: this.modelsDir,
        download: "auto",
        cli: false,
        ...(options.id !== undefined ? { fileName: `${options.id}.gguf` } : {}),
        signal: stall.signal,
        onProgress: ({ downloadedSize, totalSize }) => {
          stall.phase = "no more bytes";
          stall.touch();
          downloaded = downloadedSize;
          onProgress?.({ downloadedBytes: downloadedSize, totalBytes: totalSize });
        },
      });
    } catch (error) {
      if (options.signal?.aborted) throw error;
      const reason = stall.timedOut
        ? stall.reason(error, downloaded)
        : ref.startsWith("hf:")
          ? await huggingFaceReason(ref, error, options.timeoutMs)
          : stall.reason(error, downloaded);
      throw new ConduitError("unavailable", `Could not download '${ref}': ${reason}.`, { cause: error });
    } finally {
      stall.clear();
    }
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

/** The file a URL names, as a model file name: `…/SmolLM2-135M.Q8_0.gguf?download=true` → `SmolLM2-135M.Q8_0.gguf`. */
function fileNameOfUrl(url: string): string {
  let base = path.posix.basename(new URL(url).pathname);
  try {
    base = decodeURIComponent(base);
  } catch {
    // Keep it encoded; the clean-up below makes it a valid name either way.
  }
  const stem = base
    .replace(/\.gguf$/i, "")
    .replace(/[^A-Za-z0-9._-]/g, "_")
    .replace(/^[._-]+/, "")
    .slice(0, 195);
  if (!isValidModelId(stem))
    throw new ConduitError(
      "invalid_request",
      `The URL names no usable file name ('${base}'); give the model an id.`,
      { param: "id" },
    );
  return `${stem}.gguf`;
}

/**
 * A watchdog for a download: aborts `signal` when `timeoutMs` pass without `touch()` (no answer yet, or no
 * new bytes), or when the caller's signal aborts; says why a failed fetch failed, in words.
 */
class Stall {
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout | undefined;
  /** What a timeout now would mean (`no answer from host`, `no more bytes`). */
  phase = "no answer";
  timedOut = false;

  constructor(
    private readonly timeoutMs: number,
    outer: AbortSignal | undefined,
  ) {
    if (outer?.aborted) this.controller.abort(outer.reason);
    outer?.addEventListener("abort", () => this.controller.abort(outer.reason), { once: true });
    this.touch();
  }

  get signal(): AbortSignal {
    return this.controller.signal;
  }

  touch(): void {
    clearTimeout(this.timer);
    this.timer = setTimeout(() => {
      this.timedOut = true;
      this.controller.abort(new Error(`${this.phase} for ${formatMs(this.timeoutMs)}`));
    }, this.timeoutMs);
    this.timer.unref();
  }

  clear(): void {
    clearTimeout(this.timer);
  }

  reason(error: unknown, downloaded: number): string {
    if (this.timedOut)
      return `${this.phase} for ${formatMs(this.timeoutMs)}${downloaded > 0 ? ` (after ${downloaded} bytes)` : ""}; giving up (CONDUIT_PULL_TIMEOUT_MS)`;
    return networkReason(error);
  }
}

function formatMs(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000} s` : `${ms} ms`;
}

/** A failed fetch in words: the system error under undici's `fetch failed`. */
export function networkReason(error: unknown): string {
  for (let e = error as (Error & { code?: string; cause?: unknown; hostname?: string }) | undefined; e;) {
    const host = e.hostname ? ` ${e.hostname}` : "";
    switch (e.code) {
      case "ENOTFOUND":
        return `cannot resolve host${host}`;
      case "EAI_AGAIN":
        return `cannot resolve host${host} (no DNS answer: is the network up?)`;
      case "ECONNREFUSED":
        return "the connection was refused (nothing listens there)";
      case "ECONNRESET":
        return "the connection was reset";
      case "ETIMEDOUT":
      case "UND_ERR_CONNECT_TIMEOUT":
        return "the connection timed out";
      case "ENETUNREACH":
      case "EHOSTUNREACH":
        return "the network is unreachable";
      case "CERT_HAS_EXPIRED":
      case "DEPTH_ZERO_SELF_SIGNED_CERT":
      case "UNABLE_TO_VERIFY_LEAF_SIGNATURE":
        return `the server's TLS certificate was refused (${e.code})`;
    }
    const next = (e instanceof AggregateError && e.errors.length > 0 ? e.errors[0] : e.cause) as typeof e;
    // undici's own words are "fetch failed"; the innermost message says more ("bad port").
    if (!next) return e.message;
    e = next;
  }
  return String(error);
}

/**
 * Why an `hf:` reference failed: node-llama-cpp folds the cause into its message ("fetch failed"), so ask
 * Hugging Face about the repository once more and report what that says (the network error, or the status).
 */
async function huggingFaceReason(ref: string, error: unknown, timeoutMs: number): Promise<string> {
  const original = error instanceof Error ? error.message : String(error);
  const repo = /^hf:([^/:]+\/[^/:]+)/.exec(ref)?.[1];
  if (!repo) return original;
  const url = `https://huggingface.co/api/models/${repo}`;
  let response: Response;
  try {
    response = await fetch(url, { method: "GET", signal: AbortSignal.timeout(timeoutMs) });
  } catch (probe) {
    const timedOut = (probe as Error).name === "TimeoutError";
    return `${timedOut ? `no answer from huggingface.co for ${formatMs(timeoutMs)}` : `huggingface.co: ${networkReason(probe)}`}`;
  }
  await response.body?.cancel();
  if (response.status === 401 || response.status === 404)
    return `Hugging Face answers HTTP ${response.status} for the repository ${repo}: it does not exist, or it is private or gated (set HF_TOKEN)`;
  if (!response.ok) return `Hugging Face answers HTTP ${response.status} for the repository ${repo}`;
  return original;
}
