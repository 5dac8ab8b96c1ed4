import type {
  DatasetFileWire,
  DatasetWire,
  RunExampleWire,
  RunSummaryWire,
  RunWire,
  CreateRunBodyWire,
} from "../../src/contract/schemas.ts";
import { activeStatuses } from "../../src/contract/runs.ts";
import { samplingDefaults } from "../../src/contract/sampling.ts";
import { apiKey, signOut } from "./auth.ts";
import { readSse, type SseEvent } from "./sse.ts";

/** The wire types are the API's own schemas (src/contract/), shared rather than copied. */
export type Dataset = DatasetWire;
export type DatasetFile = DatasetFileWire;
export type Run = RunWire;
/** A run as the list shows it: no log, no loss series. */
export type RunSummary = RunSummaryWire;
export type CreateRunBody = CreateRunBodyWire;
/** A training or validation pair of a READY run, with its loss under the served weights. */
export type RunExample = RunExampleWire;
export type RunStatus = Run["status"];

export interface IoPairPreview {
  input: string;
  output: string;
  line: number;
}

export interface Model {
  id: string;
  kind: "base" | "fine-tuned";
  created: number;
}

/** What the trainer reports on a run (`run.stats`, and the `stats` events); fields appear as training goes. */
export type { RunStats } from "../../src/contract/runs.ts";

/** The Conduit API's sampling parameters, with its defaults. */
export interface Sampling {
  max_tokens: number;
  temperature: number;
  top_k: number;
  top_p: number;
  presence_penalty: number;
  frequency_penalty: number;
}

export const defaultSampling: Sampling = samplingDefaults;

export function isLive(status: RunStatus): boolean {
  return activeStatuses.includes(status);
}

/** An API error in plain words: the server's `error.message` (or what went wrong reaching it). */
export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code: string,
  ) {
    super(message);
  }
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const key = apiKey();
  return key ? { "x-api-key": key, ...extra } : extra;
}

/** Turns a failed response into an ApiError; a refused key signs the user out. */
function errorOf(status: number, text: string): ApiError {
  let message = `The server answered ${status}.`;
  let code = "unknown";
  try {
    const body = JSON.parse(text) as { error?: { message?: string; code?: string } };
    if (body.error?.message) message = body.error.message;
    if (body.error?.code) code = body.error.code;
  } catch {
    // Not JSON (a proxy's page, say): keep the generic message.
  }
  if (status === 401) signOut("The server did not accept the API key. Sign in again.");
  return new ApiError(message, status, code);
}

const unreachable = () => new ApiError("Cannot reach the Conduit server. Is it running?", 0, "network");

async function send(method: string, path: string, body?: unknown, signal?: AbortSignal): Promise<Response> {
  let response: Response;
  try {
    response = await fetch(path, {
      method,
      headers: headers(body === undefined ? {} : { "content-type": "application/json" }),
      body: body === undefined ? null : JSON.stringify(body),
      signal: signal ?? null,
    });
  } catch (error) {
    if (signal?.aborted) throw error;
    throw unreachable();
  }
  if (!response.ok) throw errorOf(response.status, await response.text());
  return response;
}

async function json<T>(method: string, path: string, body?: unknown): Promise<T> {
  return (await (await send(method, path, body)).json()) as T;
}

/** Opens a Server-Sent Events endpoint with the key header (EventSource cannot send one). */
async function* stream(
  method: string,
  path: string,
  body: unknown,
  signal: AbortSignal,
): AsyncGenerator<SseEvent> {
  const response = await send(method, path, body, signal);
  if (!response.body) throw unreachable();
  yield* readSse(response.body);
}

const enc = encodeURIComponent;

export const api = {
  datasets: () => json<Dataset[]>("GET", "/conduit/dataset?limit=1000"),
  dataset: (id: string) => json<Dataset>("GET", `/conduit/dataset/${enc(id)}`),
  createDataset: (name: string) => json<Dataset>("POST", "/conduit/dataset", { name }),
  renameDataset: (id: string, name: string) => json("PATCH", `/conduit/dataset/${enc(id)}`, { name }),
  deleteDataset: (id: string) => json("DELETE", `/conduit/dataset/${enc(id)}`),
  files: (datasetId: string) =>
    json<DatasetFile[]>("GET", `/conduit/dataset/${enc(datasetId)}/files?limit=1000`),
  deleteFile: (datasetId: string, fileId: string) =>
    json("DELETE", `/conduit/dataset/${enc(datasetId)}/file/${enc(fileId)}`),
  pairs: (datasetId: string, fileId: string, limit: number, offset = 0) =>
    json<IoPairPreview[]>(
      "GET",
      `/conduit/dataset/${enc(datasetId)}/file/${enc(fileId)}/pairs?limit=${limit}&offset=${offset}`,
    ),
  runs: () => json<RunSummary[]>("GET", "/conduit/finetuning?limit=1000"),
  run: (id: string) => json<Run>("GET", `/conduit/finetuning/${enc(id)}`),
  createRun: (body: CreateRunBody) => json<Run>("POST", "/conduit/finetuning", body),
  cancelRun: (id: string) => json("POST", `/conduit/finetuning/${enc(id)}/cancel`),
  /** A READY run's examples, the worst learned (highest loss) first. */
  worstExamples: (id: string, limit: number) =>
    json<RunExample[]>("GET", `/conduit/finetuning/${enc(id)}/examples?sort=loss&limit=${limit}`),
  deleteRun: (id: string) => json("DELETE", `/conduit/finetuning/${enc(id)}`),
  models: async () => (await json<{ data: Model[] }>("GET", "/conduit/v1/models")).data,
  /** Follows a run: `log`, `stats` and `status` events until it ends. */
  runEvents: (id: string, signal: AbortSignal) =>
    stream("GET", `/conduit/finetuning/${enc(id)}/events`, undefined, signal),
  /** Streams a chat answer: OpenAI-style chunks, then `[DONE]`. */
  chat: (
    body: { model: string; prompt: string; system_prompt?: string; history: string[] } & Sampling,
    signal: AbortSignal,
  ) => stream("POST", "/conduit/v1/chat", { ...body, stream: true }, signal),
};

/**
 * Uploads a dataset file as multipart (field `file`) with XMLHttpRequest, the one browser API
 * that reports upload progress. `onProgress` gets the fraction sent, 0 to 1.
 */
export function uploadFile(
  datasetId: string,
  file: File,
  onProgress: (fraction: number) => void,
): Promise<DatasetFile> {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", `/conduit/dataset/${enc(datasetId)}/upload`);
    for (const [name, value] of Object.entries(headers())) xhr.setRequestHeader(name, value);
    xhr.upload.onprogress = (event) => {
      if (event.lengthComputable && event.total > 0) onProgress(event.loaded / event.total);
    };
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve(JSON.parse(xhr.responseText) as DatasetFile);
      else reject(errorOf(xhr.status, xhr.responseText));
    };
    xhr.onerror = () => reject(unreachable());
    const form = new FormData();
    form.append("file", file, file.name);
    xhr.send(form);
  });
}

/** Checks a key before keeping it: any authenticated read will do. */
export async function checkKey(key: string): Promise<void> {
  let response: Response;
  try {
    response = await fetch("/conduit/dataset?limit=1", { headers: { "x-api-key": key } });
  } catch {
    throw unreachable();
  }
  if (response.status === 401) throw new ApiError("That API key was not accepted.", 401, "unauthorized");
  if (!response.ok) throw errorOf(response.status, await response.text());
}
