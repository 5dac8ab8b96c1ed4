/**
 * The one error catalog. Every error a client can see has a code here, an HTTP status and a
 * safe message; the API's error handler turns a `ConduitError` into
 * `{"error":{"message","type","param","code"}}`. Anything that is not a `ConduitError` is a 500
 * whose body never carries internal text.
 */
export const errorCatalog = {
  invalid_request: {
    status: 400,
    type: "invalid_request_error",
    doc: "The request body, query or path is malformed or a field is invalid; `param` names the field.",
  },
  invalid_json: { status: 400, type: "invalid_request_error", doc: "The body is not valid JSON." },
  invalid_file: {
    status: 400,
    type: "invalid_request_error",
    doc: "An uploaded file is not valid IO-pair data; the message names the line and the reason.",
  },
  unauthorized: { status: 401, type: "authentication_error", doc: "The API key is missing or wrong." },
  forbidden: {
    status: 403,
    type: "permission_error",
    doc: "The key is valid but its user may not do this (`/metrics` is for the users in `CONDUIT_METRICS_USERS`).",
  },
  not_found: {
    status: 404,
    type: "not_found_error",
    doc: "No such resource for this user (other users' resources are never revealed).",
  },
  model_not_found: {
    status: 404,
    type: "not_found_error",
    doc: "The named model is neither in the models directory nor a READY run of this user.",
  },
  method_not_allowed: {
    status: 405,
    type: "invalid_request_error",
    doc: "The path exists, but not with this method; the `Allow` header lists the ones it takes.",
  },
  conflict: {
    status: 409,
    type: "conflict_error",
    doc: "The resource is in a state that does not allow the operation (e.g. cancelling a finished run).",
  },
  request_timeout: {
    status: 408,
    type: "invalid_request_error",
    doc: "The request's headers or body did not arrive in time (`CONDUIT_HEADERS_TIMEOUT_MS`, `CONDUIT_BODY_TIMEOUT_MS`, `CONDUIT_REQUEST_TIMEOUT_MS`); the connection is closed.",
  },
  payload_too_large: {
    status: 413,
    type: "invalid_request_error",
    doc: "The body or uploaded file is larger than the configured limit.",
  },
  unsupported_media_type: {
    status: 415,
    type: "invalid_request_error",
    doc: "The Content-Type is not accepted by this endpoint.",
  },
  uri_too_long: {
    status: 414,
    type: "invalid_request_error",
    doc: "A path segment is longer than 1024 characters (an id that long is no id).",
  },
  rate_limited: {
    status: 429,
    type: "rate_limit_error",
    doc: "Too many requests: the generation queue is full, this client sent too many wrong API keys in a minute, or this user has too many run event streams open; retry after the `Retry-After` seconds.",
  },
  headers_too_large: {
    status: 431,
    type: "invalid_request_error",
    doc: "The request line and headers are larger than 16 KiB.",
  },
  internal_error: {
    status: 500,
    type: "server_error",
    doc: "An unexpected error; details are in the server log, never in the response.",
  },
  unavailable: {
    status: 503,
    type: "server_error",
    doc: "The service cannot do this now (e.g. shutting down, a model failed to load, the database is unreachable or restarting); retry after the `Retry-After` seconds when given.",
  },
  insufficient_storage: {
    status: 507,
    type: "server_error",
    doc: "The disk of the data directory (or the database) is full; nothing was stored. Retry once space is freed.",
  },
} as const;

export type ErrorCode = keyof typeof errorCatalog;

/**
 * The fields the service, inference and the engine blame (`ConduitError.param`) in the domain's own names. Each
 * API face maps them to its wire names through one table (`conduitFields`, `openAiFields`), in its error handler.
 */
export const domainFields = [
  "runId",
  "evalId",
  "evalRunId",
  "maxTokens",
  "temperature",
  "topP",
  "topK",
  "presencePenalty",
  "frequencyPenalty",
  "seed",
] as const;

export type DomainField = (typeof domainFields)[number];

/** A face's table from domain field names to its own. */
export type FieldNames = Record<DomainField, string>;

/** An error naming its field as a face's table says (errors blaming no domain field pass unchanged). */
export function inFaceNames(
  error: ConduitError,
  names: Readonly<Partial<Record<string, string>>>,
): ConduitError {
  const param =
    error.param !== null && Object.hasOwn(names, error.param) ? (names[error.param] ?? null) : null;
  if (param === null) return error;
  return new ConduitError(error.code, error.message, {
    param,
    ...(error.retryAfter !== undefined ? { retryAfter: error.retryAfter } : {}),
    cause: error,
  });
}

export class ConduitError extends Error {
  readonly code: ErrorCode;
  readonly param: string | null;
  /** Seconds for a `Retry-After` header, for 429/503. */
  readonly retryAfter: number | undefined;

  constructor(
    code: ErrorCode,
    message: string,
    options: { param?: string | null; retryAfter?: number; cause?: unknown } = {},
  ) {
    super(message, { cause: options.cause });
    this.name = "ConduitError";
    this.code = code;
    this.param = options.param ?? null;
    this.retryAfter = options.retryAfter;
  }

  get status(): number {
    return errorCatalog[this.code].status;
  }
}

/** What a 507 says: the same words for a request and for a run that failed on a full disk. */
export const OUT_OF_SPACE =
  "the server's storage is full, so nothing was stored; retry once space has been freed";

/** A run's error when its trainer found the disk full. */
export const OUT_OF_SPACE_RUN =
  "insufficient_storage: the server's storage is full, so the run could not write its files; start it again " +
  "once space has been freed";

/** Error codes of a write that found no space: the file system's, SQLite's and PostgreSQL's. */
const outOfSpaceCodes = new Set(["ENOSPC", "EDQUOT", "SQLITE_FULL", "53100"]);

/**
 * Whether `error` (or one of its causes) says the disk or the database is full, so the answer is a
 * 507 that says so rather than a bare 500.
 */
export function isOutOfSpace(error: unknown): boolean {
  for (let e = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && outOfSpaceCodes.has(code)) return true;
  }
  return false;
}

/**
 * Error codes of a database that went away or cannot answer now: PostgreSQL's connection exceptions (class 08),
 * a server shutting down or starting (57P01–57P03), too many connections (53300); a socket's; SQLite's busy,
 * locked and I/O errors.
 */
const unavailableCodes = new Set([
  "57P01",
  "57P02",
  "57P03",
  "53300",
  "ECONNREFUSED",
  "ECONNRESET",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "SQLITE_BUSY",
  "SQLITE_LOCKED",
  "SQLITE_CANTOPEN",
  "SQLITE_PROTOCOL",
]);

/** What node-postgres says of a connection that broke or never came, where it gives no code. */
const unavailableMessages =
  /^(Connection terminated|Client has encountered a connection error|Client was closed|timeout exceeded when trying to connect|Connection terminated due to connection timeout)/;

/**
 * Whether `error` (or one of its causes) says the database cannot be reached now: the answer is a 503 with
 * `Retry-After`, and background work tries again later, rather than a 500 or a crash.
 */
export function isDatabaseUnavailable(error: unknown): boolean {
  for (let e = error, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && (unavailableCodes.has(code) || /^08|^SQLITE_IOERR/.test(code)))
      return true;
    if (unavailableMessages.test(e.message)) return true;
  }
  return false;
}

/** Seconds a client is told to wait when the database is unavailable (a restart takes a few). */
export const DATABASE_RETRY_AFTER_S = 5;
