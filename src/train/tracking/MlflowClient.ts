/**
 * The few calls of MLflow's REST API 2.0 (`/api/2.0/mlflow/...`) that mirror a run, over plain
 * `fetch`: there is no maintained npm client. Auth as MLflow's own clients do it: a bearer token
 * (`MLFLOW_TRACKING_TOKEN`) or basic auth (`MLFLOW_TRACKING_USERNAME`/`MLFLOW_TRACKING_PASSWORD`).
 */

/** What MLflow takes in one `runs/log-batch` call (its documented limits). */
export const mlflowLimits = {
  paramsPerBatch: 100,
  metricsPerBatch: 1000,
  /** Params, metrics and tags together. */
  entriesPerBatch: 1000,
  paramKeyLength: 250,
  paramValueLength: 6000,
  tagValueLength: 8000,
} as const;

export interface MlflowMetric {
  key: string;
  value: number;
  /** Milliseconds since the epoch. */
  timestamp: number;
  step: number;
}

export interface MlflowParam {
  key: string;
  value: string;
}

export type MlflowRunStatus = "RUNNING" | "FINISHED" | "FAILED" | "KILLED";

export interface MlflowClientOptions {
  /** The tracking server, without a trailing slash. */
  uri: string;
  token?: string | undefined;
  username?: string | undefined;
  password?: string | undefined;
  /** Longest wait for one answer. Defaults to `10000` ms. */
  requestTimeoutMs?: number;
}

/**
 * A call that did not succeed. `retryable`: no answer, a timeout, a 5xx, 408 or 429 (worth trying
 * again); otherwise MLflow refused the request itself and the same request would be refused again.
 */
export class MlflowError extends Error {
  override name = "MlflowError";

  constructor(
    message: string,
    readonly retryable: boolean,
    /** MLflow's `error_code` (`RESOURCE_ALREADY_EXISTS`, …), when it answered with one. */
    readonly code?: string,
    readonly status?: number,
  ) {
    super(message);
  }
}

export class MlflowClient {
  private readonly headers: Record<string, string>;
  private readonly requestTimeoutMs: number;

  constructor(private readonly options: MlflowClientOptions) {
    this.headers = { "content-type": "application/json" };
    if (options.token) this.headers.authorization = `Bearer ${options.token}`;
    else if (options.username !== undefined || options.password !== undefined)
      this.headers.authorization = `Basic ${Buffer.from(`${options.username ?? ""}:${options.password ?? ""}`).toString("base64")}`;
    this.requestTimeoutMs = options.requestTimeoutMs ?? 10_000;
  }

  /** The run's page in the MLflow UI. */
  runPageUrl(experimentId: string, runId: string): string {
    return `${this.options.uri}/#/experiments/${encodeURIComponent(experimentId)}/runs/${encodeURIComponent(runId)}`;
  }

  /** The experiment of that name, deleted ones included; undefined when there is none. */
  async experimentByName(
    name: string,
    signal?: AbortSignal,
  ): Promise<{ experimentId: string; lifecycleStage: string } | undefined> {
    try {
      const answer = await this.call<{ experiment: { experiment_id: string; lifecycle_stage: string } }>(
        "GET",
        `experiments/get-by-name?experiment_name=${encodeURIComponent(name)}`,
        undefined,
        signal,
      );
      return {
        experimentId: answer.experiment.experiment_id,
        lifecycleStage: answer.experiment.lifecycle_stage,
      };
    } catch (error) {
      if (error instanceof MlflowError && error.code === "RESOURCE_DOES_NOT_EXIST") return undefined;
      throw error;
    }
  }

  async createExperiment(name: string, signal?: AbortSignal): Promise<string> {
    const answer = await this.call<{ experiment_id: string }>("POST", "experiments/create", { name }, signal);
    return answer.experiment_id;
  }

  /** Starts a run (status RUNNING); returns its id. */
  async createRun(
    run: { experimentId: string; runName: string; startTime: number; tags: MlflowParam[] },
    signal?: AbortSignal,
  ): Promise<string> {
    const answer = await this.call<{ run: { info: { run_id: string } } }>(
      "POST",
      "runs/create",
      { experiment_id: run.experimentId, run_name: run.runName, start_time: run.startTime, tags: run.tags },
      signal,
    );
    return answer.run.info.run_id;
  }

  /** Logs params and metrics in one call; the caller keeps within `mlflowLimits`. */
  async logBatch(
    runId: string,
    batch: { params?: MlflowParam[]; metrics?: MlflowMetric[] },
    signal?: AbortSignal,
  ): Promise<void> {
    await this.call("POST", "runs/log-batch", { run_id: runId, ...batch }, signal);
  }

  async updateRun(
    runId: string,
    status: MlflowRunStatus,
    endTime: number,
    signal?: AbortSignal,
  ): Promise<void> {
    await this.call("POST", "runs/update", { run_id: runId, status, end_time: endTime }, signal);
  }

  async deleteRun(runId: string, signal?: AbortSignal): Promise<void> {
    await this.call("POST", "runs/delete", { run_id: runId }, signal);
  }

  private async call<T>(
    method: "GET" | "POST",
    path: string,
    body: unknown,
    signal?: AbortSignal,
  ): Promise<T> {
    const endpoint = path.replace(/\?.*$/, "");
    const timeout = AbortSignal.timeout(this.requestTimeoutMs);
    let response: Response;
    try {
      response = await fetch(`${this.options.uri}/api/2.0/mlflow/${path}`, {
        method,
        headers: this.headers,
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
      });
    } catch (error) {
      throw new MlflowError(`${endpoint}: ${networkReason(error, timeout, this.requestTimeoutMs)}`, true);
    }
    const text = await response.text().catch(() => "");
    if (response.ok) return (text ? JSON.parse(text) : {}) as T;
    let code: string | undefined;
    let message = text.slice(0, 300);
    try {
      const parsed = JSON.parse(text) as { error_code?: unknown; message?: unknown };
      if (typeof parsed.error_code === "string") code = parsed.error_code;
      if (typeof parsed.message === "string") message = parsed.message.split("\n")[0]?.slice(0, 300) ?? "";
    } catch {
      // Not MLflow's JSON error (a proxy's page): the start of the text says enough.
    }
    const retryable = response.status >= 500 || response.status === 408 || response.status === 429;
    throw new MlflowError(
      `${endpoint} answered ${response.status}${code ? ` ${code}` : ""}${message ? `: ${message}` : ""}`,
      retryable,
      code,
      response.status,
    );
  }
}

/** Why a request got no answer, in a few words: "connect ECONNREFUSED 127.0.0.1:5000", "no answer within 10 s". */
function networkReason(error: unknown, timeout: AbortSignal, timeoutMs: number): string {
  if (timeout.aborted) return `no answer within ${timeoutMs / 1000} s`;
  const cause = (error as { cause?: { message?: unknown } } | undefined)?.cause;
  if (cause && typeof cause.message === "string" && cause.message) return cause.message;
  return error instanceof Error ? error.message : String(error);
}
