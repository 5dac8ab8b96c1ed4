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
  conflict: {
    status: 409,
    type: "conflict_error",
    doc: "The resource is in a state that does not allow the operation (e.g. cancelling a finished run).",
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
  rate_limited: {
    status: 429,
    type: "rate_limit_error",
    doc: "The generation queue is full; retry after the `Retry-After` seconds.",
  },
  internal_error: {
    status: 500,
    type: "server_error",
    doc: "An unexpected error; details are in the server log, never in the response.",
  },
  unavailable: {
    status: 503,
    type: "server_error",
    doc: "The service cannot do this now (e.g. shutting down, model failed to load).",
  },
} as const;

export type ErrorCode = keyof typeof errorCatalog;

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
