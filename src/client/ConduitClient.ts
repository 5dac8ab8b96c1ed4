import type {
  ChatRequest,
  ChatResultWire,
  EmbeddingListWire,
  EmbeddingsRequest,
  IoPairPreviewWire,
  LoadedModelEntryWire,
  MessageWire,
  ModelEntryWire,
  PageQueryWire,
} from "../contract/client.ts";
import type {
  CreateRunBodyWire,
  DatasetFileWire,
  DatasetWire,
  ExamplesQueryWire,
  RunCheckpointWire,
  RunExampleWire,
  RunSummaryWire,
  RunWire,
} from "../contract/schemas.ts";
import type {
  CreateEvalBodyWire,
  CreateEvalRunBodyWire,
  EvalResultWire,
  EvalRunWire,
  EvalWire,
} from "../contract/evals.ts";
import type { AdapterWire } from "../contract/adapters.ts";
import { ApiError, errorOfAnswer, unreachable } from "./ApiError.ts";
import { chatChunkText } from "./chatChunk.ts";
import { followRunEvents, type RunEvent, type RunEventsOptions } from "./runEvents.ts";
import { readSse } from "./sse.ts";

export interface ConduitClientOptions {
  /**
   * The server, e.g. `http://127.0.0.1:8080` (a path after it is kept as a prefix). Defaults to `""`:
   * paths relative to the page, for the dashboard that the server itself serves.
   */
  baseUrl?: string;
  /** The API key, or a function that reads it for each request. Defaults to none. */
  key?: string | (() => string | null | undefined);
  /** Called with each error answer before it is thrown (the dashboard signs out on a 401). Defaults to none. */
  onError?: (error: ApiError) => void;
  /**
   * Times a request answered `429` or `503` with a `Retry-After` is sent again once that wait is over (a full
   * generation queue, a model loading, a server restarting). A request whose body is a stream is not sent
   * again. Defaults to `3`.
   */
  retries?: number;
  /** The longest `Retry-After`, in seconds, waited for; a longer one is the error at once. Defaults to `60`. */
  maxRetryWaitSeconds?: number;
  /** Called before each such wait with the answer's error and the seconds it waits (the CLI says so). Defaults to none. */
  onRetry?: (error: ApiError, seconds: number) => void;
}

/** What `uploadFile` sends and how it reports. */
export interface UploadOptions {
  /** The file's name as the dataset lists it; its extension tells the format. */
  name: string;
  /** The body's size in bytes, for `onProgress` when the body is a stream. Defaults to unknown. */
  size?: number;
  /** Called as the body goes out with the bytes sent and the total, when known. Defaults to none. */
  onProgress?: (sentBytes: number, totalBytes: number | undefined) => void;
  signal?: AbortSignal;
}

/** A READY run's artifact on its way: the body to stream to disk, and what the headers say of it. */
export interface Artifact {
  body: ReadableStream<Uint8Array>;
  /** The plain file name the server suggests (`<run id>-lora.gguf`), if it gave one. */
  fileName: string | undefined;
  /** Its size in bytes, if the server said. */
  sizeBytes: number | undefined;
}

/** Media types of the raw upload bodies, by file extension; anything else goes as bytes and the server looks. */
const uploadTypes: Record<string, string> = {
  jsonl: "application/jsonl",
  ndjson: "application/jsonl",
  csv: "text/csv",
};

function uploadType(name: string): string {
  return uploadTypes[name.split(".").pop()?.toLowerCase() ?? ""] ?? "application/octet-stream";
}

/** `?a=1&b=2` of the defined values, or `""`. */
function query(params: Record<string, string | number | undefined>): string {
  const search = new URLSearchParams();
  for (const [name, value] of Object.entries(params))
    if (value !== undefined) search.set(name, String(value));
  const text = search.toString();
  return text ? `?${text}` : "";
}

const enc = encodeURIComponent;

/** The seconds a `Retry-After` header asks for (a number of seconds or an HTTP date), if it is one. */
export function retryAfterSeconds(header: string | null, now = Date.now()): number | undefined {
  if (header === null || header.trim() === "") return undefined;
  if (/^\s*\d+\s*$/.test(header)) return Number(header);
  const at = Date.parse(header);
  return Number.isNaN(at) ? undefined : Math.max(0, Math.ceil((at - now) / 1000));
}

/** Resolves after `ms`, or rejects with the signal's reason once it aborts. */
function wait(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", abort);
      resolve();
    }, ms);
    const abort = () => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    signal?.addEventListener("abort", abort, { once: true });
  });
}

/** The file name in `Content-Disposition: attachment; filename="..."`, if it is a plain one. */
function attachmentName(header: string | null): string | undefined {
  const name = /filename="([^"]+)"/.exec(header ?? "")?.[1];
  return name && /^[\w.-]+$/.test(name) && !name.startsWith(".") ? name : undefined;
}

/**
 * The one client of the Conduit API, for the CLI and the dashboard alike (fetch-based: Node 20 and
 * browsers). One method per endpoint; every failure is an `ApiError` in plain words, streams are async
 * iterables, and a run's events stream resumes after a dropped connection.
 */
export class ConduitClient {
  readonly baseUrl: string;
  private readonly key: ConduitClientOptions["key"];
  private readonly onError: ConduitClientOptions["onError"];
  private readonly retries: number;
  private readonly maxRetryWaitSeconds: number;
  private readonly onRetry: ConduitClientOptions["onRetry"];

  constructor({
    baseUrl = "",
    key,
    onError,
    retries = 3,
    maxRetryWaitSeconds = 60,
    onRetry,
  }: ConduitClientOptions = {}) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.key = key;
    this.onError = onError;
    this.retries = retries;
    this.maxRetryWaitSeconds = maxRetryWaitSeconds;
    this.onRetry = onRetry;
  }

  // Datasets and their files.

  listDatasets(page: PageQueryWire = {}): Promise<DatasetWire[]> {
    return this.json("GET", `/conduit/dataset${query(page)}`);
  }

  getDataset(id: string): Promise<DatasetWire> {
    return this.json("GET", `/conduit/dataset/${enc(id)}`);
  }

  createDataset(name: string): Promise<DatasetWire> {
    return this.json("POST", "/conduit/dataset", { name });
  }

  renameDataset(id: string, name: string): Promise<MessageWire> {
    return this.json("PATCH", `/conduit/dataset/${enc(id)}`, { name });
  }

  deleteDataset(id: string): Promise<MessageWire> {
    return this.json("DELETE", `/conduit/dataset/${enc(id)}`);
  }

  listFiles(datasetId: string, page: PageQueryWire = {}): Promise<DatasetFileWire[]> {
    return this.json("GET", `/conduit/dataset/${enc(datasetId)}/files${query(page)}`);
  }

  deleteFile(datasetId: string, fileId: string): Promise<MessageWire> {
    return this.json("DELETE", `/conduit/dataset/${enc(datasetId)}/file/${enc(fileId)}`);
  }

  /** A file's pairs as the server read them, each with its line number. */
  listPairs(datasetId: string, fileId: string, page: PageQueryWire = {}): Promise<IoPairPreviewWire[]> {
    return this.json("GET", `/conduit/dataset/${enc(datasetId)}/file/${enc(fileId)}/pairs${query(page)}`);
  }

  /**
   * Uploads a file of IO pairs as a raw body (`?name=`); the server validates it as it streams and a
   * refusal names the line. In a browser with `onProgress`, a Blob goes through XMLHttpRequest, the one
   * browser API that reports upload progress; a stream (Node) is counted as it is read.
   */
  async uploadFile(
    datasetId: string,
    body: Blob | ReadableStream<Uint8Array>,
    { name, size, onProgress, signal }: UploadOptions,
  ): Promise<DatasetFileWire> {
    const path = `/conduit/dataset/${enc(datasetId)}/upload${query({ name })}`;
    const type = uploadType(name);
    if (onProgress && body instanceof Blob && typeof XMLHttpRequest !== "undefined")
      return this.xhrUpload(path, type, body, onProgress, signal);
    let sent = 0;
    const total = body instanceof Blob ? body.size : size;
    const counted =
      onProgress && !(body instanceof Blob)
        ? body.pipeThrough(
            new TransformStream<Uint8Array, Uint8Array>({
              transform(chunk, controller) {
                sent += chunk.length;
                onProgress(sent, total);
                controller.enqueue(chunk);
              },
            }),
          )
        : body;
    const response = await this.send("POST", path, {
      headers: { "content-type": type },
      body: counted,
      signal,
    });
    if (onProgress && body instanceof Blob) onProgress(body.size, body.size);
    return (await response.json()) as DatasetFileWire;
  }

  // Fine-tuning runs.

  listRuns(page: PageQueryWire = {}): Promise<RunSummaryWire[]> {
    return this.json("GET", `/conduit/finetuning${query(page)}`);
  }

  getRun(id: string): Promise<RunWire> {
    return this.json("GET", `/conduit/finetuning/${enc(id)}`);
  }

  createRun(body: CreateRunBodyWire): Promise<RunWire> {
    return this.json("POST", "/conduit/finetuning", body);
  }

  cancelRun(id: string): Promise<MessageWire> {
    return this.json("POST", `/conduit/finetuning/${enc(id)}/cancel`);
  }

  /** Pauses a queued or running run (`PAUSED`); its trainer stops and its checkpoint is kept. */
  pauseRun(id: string): Promise<RunWire> {
    return this.json("POST", `/conduit/finetuning/${enc(id)}/pause`);
  }

  /** Resumes a paused run from its checkpoint (`QUEUED` again). */
  resumeRun(id: string): Promise<RunWire> {
    return this.json("POST", `/conduit/finetuning/${enc(id)}/resume`);
  }

  /** A READY run's kept checkpoints, newest first, each with the model name that serves it. */
  listCheckpoints(id: string): Promise<RunCheckpointWire[]> {
    return this.json("GET", `/conduit/finetuning/${enc(id)}/checkpoints`);
  }

  /** A kept checkpoint's LoRA adapter (`<run id>-step-<step>-lora.gguf`), to stream to disk. */
  async downloadCheckpoint(id: string, step: number, signal?: AbortSignal): Promise<Artifact> {
    const response = await this.send("GET", `/conduit/finetuning/${enc(id)}/checkpoints/${step}/artifact`, {
      signal,
    });
    return this.artifactOf(response);
  }

  deleteRun(id: string): Promise<MessageWire> {
    return this.json("DELETE", `/conduit/finetuning/${enc(id)}`);
  }

  /** A READY run's examples with their loss (by default the worst learned first), and how many there are in all. */
  async listExamples(
    id: string,
    options: Partial<ExamplesQueryWire> = {},
  ): Promise<{ items: RunExampleWire[]; total: number | undefined }> {
    const response = await this.send("GET", `/conduit/finetuning/${enc(id)}/examples${query(options)}`);
    const total = response.headers.get("x-total-count");
    return {
      items: (await response.json()) as RunExampleWire[],
      total: total === null ? undefined : Number(total),
    };
  }

  /**
   * A READY run's result (its LoRA adapter, or the model of a full run), to stream to disk; with `format`
   * `merged`, a LoRA run's adapter merged into its base.
   */
  async downloadArtifact(
    id: string,
    signal?: AbortSignal,
    format: "adapter" | "merged" = "adapter",
  ): Promise<Artifact> {
    const suffix = format === "merged" ? "?format=merged" : "";
    const response = await this.send("GET", `/conduit/finetuning/${enc(id)}/artifact${suffix}`, { signal });
    return this.artifactOf(response);
  }

  private artifactOf(response: Response): Artifact {
    const length = response.headers.get("content-length");
    return {
      body: this.bodyOf(response),
      fileName: attachmentName(response.headers.get("content-disposition")),
      sizeBytes: length === null ? undefined : Number(length),
    };
  }

  /**
   * Follows a run live: its log from the start, its stats and status as they change, until it ends.
   * A dropped connection is resumed (`Last-Event-ID`); see `followRunEvents`.
   */
  runEvents(id: string, options: RunEventsOptions = {}): AsyncGenerator<RunEvent> {
    const path = `/conduit/finetuning/${enc(id)}/events`;
    return followRunEvents(async (lastEventId) => {
      const response = await this.send("GET", path, {
        headers: { accept: "text/event-stream", ...(lastEventId ? { "last-event-id": lastEventId } : {}) },
        signal: options.signal,
      });
      return this.bodyOf(response);
    }, options);
  }

  // Evaluations.

  createEval(body: CreateEvalBodyWire): Promise<EvalWire> {
    return this.json("POST", "/conduit/evals", body);
  }

  listEvals(page: PageQueryWire = {}): Promise<EvalWire[]> {
    return this.json("GET", `/conduit/evals${query(page)}`);
  }

  getEval(id: string): Promise<EvalWire> {
    return this.json("GET", `/conduit/evals/${enc(id)}`);
  }

  deleteEval(id: string): Promise<MessageWire> {
    return this.json("DELETE", `/conduit/evals/${enc(id)}`);
  }

  createEvalRun(evalId: string, body: CreateEvalRunBodyWire): Promise<EvalRunWire> {
    return this.json("POST", `/conduit/evals/${enc(evalId)}/runs`, body);
  }

  listEvalRuns(evalId: string): Promise<EvalRunWire[]> {
    return this.json("GET", `/conduit/evals/${enc(evalId)}/runs`);
  }

  getEvalRun(evalId: string, runId: string): Promise<EvalRunWire> {
    return this.json("GET", `/conduit/evals/${enc(evalId)}/runs/${enc(runId)}`);
  }

  cancelEvalRun(evalId: string, runId: string): Promise<EvalRunWire> {
    return this.json("POST", `/conduit/evals/${enc(evalId)}/runs/${enc(runId)}/cancel`);
  }

  /** An eval run's answers with their scores, by model then item. */
  evalResults(
    evalId: string,
    runId: string,
    options: { model?: string; limit?: number; offset?: number } = {},
  ): Promise<EvalResultWire[]> {
    return this.json("GET", `/conduit/evals/${enc(evalId)}/runs/${enc(runId)}/results${query(options)}`);
  }

  /** Follows an eval run: `progress` events as answers are scored, `status` events, until it ends. */
  async *evalRunEvents(
    evalId: string,
    runId: string,
    signal?: AbortSignal,
  ): AsyncGenerator<
    | { event: "progress"; data: Pick<EvalRunWire, "progress" | "results"> }
    | { event: "status"; data: Pick<EvalRunWire, "status" | "error"> }
  > {
    const response = await this.send("GET", `/conduit/evals/${enc(evalId)}/runs/${enc(runId)}/events`, {
      headers: { accept: "text/event-stream" },
      signal,
    });
    for await (const event of readSse(this.bodyOf(response), undefined)) {
      if (event.event === "progress")
        yield {
          event: "progress",
          data: JSON.parse(event.data) as Pick<EvalRunWire, "progress" | "results">,
        };
      else if (event.event === "status")
        yield { event: "status", data: JSON.parse(event.data) as Pick<EvalRunWire, "status" | "error"> };
      else if (event.event === "message" && event.data.includes('"error"'))
        throw errorOfAnswer(500, "stream failed", event.data);
    }
  }

  // Models and generation.

  /** The models you can name: the server's base models and your READY runs. */
  async listModels(): Promise<ModelEntryWire[]> {
    return (await this.json<{ data: ModelEntryWire[] }>("GET", "/conduit/v1/models")).data;
  }

  /**
   * Imports a LoRA adapter for `baseModel`: a GGUF adapter (`file`), or a PEFT adapter's
   * `adapter_model.safetensors` and `adapter_config.json`. The server checks it against the base first.
   */
  async importAdapter(
    baseModel: string,
    files: { file: Blob } | { adapterModel: Blob; adapterConfig: Blob },
    name?: string,
  ): Promise<AdapterWire> {
    const form = new FormData();
    form.append("base_model", baseModel);
    if (name !== undefined) form.append("name", name);
    if ("file" in files) form.append("file", files.file, "adapter.gguf");
    else {
      form.append("adapter_model", files.adapterModel, "adapter_model.safetensors");
      form.append("adapter_config", files.adapterConfig, "adapter_config.json");
    }
    const response = await this.send("POST", "/conduit/models/adapters", { body: form });
    return (await response.json()) as AdapterWire;
  }

  /** Your imported adapters, oldest first. */
  listAdapters(): Promise<AdapterWire[]> {
    return this.json("GET", "/conduit/models/adapters");
  }

  /** Deletes an imported adapter and its file. */
  deleteAdapter(id: string): Promise<MessageWire> {
    return this.json("DELETE", `/conduit/models/adapters/${enc(id)}`);
  }

  /** One model you can name, as the list shows it. */
  async getModel(id: string): Promise<ModelEntryWire> {
    return this.json<ModelEntryWire>("GET", `/conduit/v1/models/${enc(id)}`);
  }

  /** The models in the server's memory now that you may see (base models and your fine-tunes). */
  async listLoadedModels(): Promise<LoadedModelEntryWire[]> {
    return (await this.json<{ data: LoadedModelEntryWire[] }>("GET", "/conduit/v1/models/loaded")).data;
  }

  /** One chat answer, whole. */
  chat(body: ChatRequest, signal?: AbortSignal): Promise<ChatResultWire> {
    return this.json("POST", "/conduit/v1/chat", { ...body, stream: false }, signal);
  }

  /** One vector per input (`POST /conduit/v1/embeddings`), in order. */
  embed(body: EmbeddingsRequest, signal?: AbortSignal): Promise<EmbeddingListWire> {
    return this.json("POST", "/conduit/v1/embeddings", body, signal);
  }

  /** One chat answer as it is generated: the text of each chunk, in order. An error mid-stream throws. */
  async *chatStream(body: ChatRequest, signal?: AbortSignal): AsyncGenerator<string> {
    const response = await this.send("POST", "/conduit/v1/chat", {
      headers: { "content-type": "application/json", accept: "text/event-stream" },
      body: JSON.stringify({ ...body, stream: true }),
      signal,
    });
    for await (const event of readSse(this.bodyOf(response))) {
      const text = chatChunkText(event.data);
      if (text === null) return;
      if (text !== "") yield text;
    }
  }

  // The transport.

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    const key = typeof this.key === "function" ? this.key() : this.key;
    return key ? { "x-api-key": key, ...extra } : extra;
  }

  private fail(error: ApiError): ApiError {
    this.onError?.(error);
    return error;
  }

  /**
   * A request whose answer is OK, or the ApiError it became. A `429` or `503` with a `Retry-After` (the server is
   * busy for a while) is sent again after that wait, up to `retries` times.
   */
  private async send(
    method: string,
    path: string,
    init: { headers?: Record<string, string>; body?: BodyInit; signal?: AbortSignal | undefined } = {},
  ): Promise<Response> {
    for (let attempt = 0; ; attempt++) {
      let response: Response;
      try {
        response = await fetch(`${this.baseUrl}${path}`, {
          method,
          headers: this.headers(init.headers),
          ...(init.body === undefined ? {} : { body: init.body }),
          ...(init.signal ? { signal: init.signal } : {}),
          // A streamed request body (an upload from Node) needs it.
          ...(init.body instanceof ReadableStream ? { duplex: "half" } : {}),
        } as RequestInit);
      } catch (error) {
        if (init.signal?.aborted) throw error;
        throw unreachable(this.baseUrl, error);
      }
      if (response.ok) return response;
      const error = errorOfAnswer(response.status, response.statusText, await response.text());
      const seconds =
        response.status === 429 || response.status === 503
          ? retryAfterSeconds(response.headers.get("retry-after"))
          : undefined;
      const again =
        seconds !== undefined &&
        seconds <= this.maxRetryWaitSeconds &&
        attempt < this.retries &&
        !(init.body instanceof ReadableStream);
      if (!again) throw this.fail(error);
      this.onRetry?.(error, seconds);
      await wait(seconds * 1000, init.signal);
    }
  }

  private async json<T>(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<T> {
    const response = await this.send(method, path, {
      ...(body === undefined
        ? {}
        : { headers: { "content-type": "application/json" }, body: JSON.stringify(body) }),
      signal,
    });
    return (await response.json()) as T;
  }

  private bodyOf(response: Response): ReadableStream<Uint8Array> {
    if (!response.body) throw unreachable(this.baseUrl, undefined);
    return response.body;
  }

  private xhrUpload(
    path: string,
    type: string,
    body: Blob,
    onProgress: NonNullable<UploadOptions["onProgress"]>,
    signal: AbortSignal | undefined,
  ): Promise<DatasetFileWire> {
    return new Promise((resolve, reject) => {
      const xhr = new XMLHttpRequest();
      xhr.open("POST", `${this.baseUrl}${path}`);
      for (const [name, value] of Object.entries(this.headers({ "content-type": type })))
        xhr.setRequestHeader(name, value);
      xhr.upload.onprogress = (event) =>
        onProgress(event.loaded, event.lengthComputable ? event.total : body.size);
      xhr.onload = () => {
        if (xhr.status >= 200 && xhr.status < 300) resolve(JSON.parse(xhr.responseText) as DatasetFileWire);
        else reject(this.fail(errorOfAnswer(xhr.status, xhr.statusText, xhr.responseText)));
      };
      xhr.onerror = () => reject(unreachable(this.baseUrl, undefined));
      xhr.onabort = () => reject(signal?.reason);
      signal?.addEventListener("abort", () => xhr.abort(), { once: true });
      xhr.send(body);
    });
  }
}
