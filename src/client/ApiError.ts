import type { ErrorBodyWire } from "../contract/client.ts";

/**
 * An error of the Conduit API, as a client meets it: an error answer (`{"error":{message,type,param,code}}`),
 * an error event inside a stream, or no answer at all. `message` is plain words to show as they are.
 */
export class ApiError extends Error {
  constructor(
    message: string,
    /** The HTTP status; `0` when none came with the error (no answer, or an error event in a stream). */
    readonly status: number,
    /** The API's error code (`not_found`, `invalid_request`, ...), or the client's own for what never reached it. */
    readonly code: string,
    /** The field the error is about, when the API names one. */
    readonly param: string | null = null,
    /** The API's error type (`invalid_request_error`, ...), when it sent one. */
    readonly type: string | null = null,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** The client's codes for errors that did not come from the API. */
export const clientErrorCodes = {
  /** The server could not be reached: nothing listens there, the name does not resolve, ... */
  connectionFailed: "connection_failed",
  /** An event stream ended before what it follows did (the connection dropped). */
  connectionLost: "connection_lost",
} as const;

/** The `error` of an API error body, if `value` is one. */
function errorField(value: unknown): Partial<ErrorBodyWire["error"]> | undefined {
  if (typeof value !== "object" || value === null || !("error" in value)) return undefined;
  const error = (value as { error: unknown }).error;
  return typeof error === "object" && error !== null ? (error as Partial<ErrorBodyWire["error"]>) : undefined;
}

/** An `ApiError` from an error body's `error` field, whatever status came with it. */
function fromField(field: Partial<ErrorBodyWire["error"]>, status: number, fallback: string): ApiError {
  return new ApiError(
    typeof field.message === "string" && field.message !== "" ? field.message : fallback,
    status,
    typeof field.code === "string" ? field.code : status === 0 ? "failed" : `http_${status}`,
    typeof field.param === "string" ? field.param : null,
    typeof field.type === "string" ? field.type : null,
  );
}

/** The error of a failed answer, from its status and body text (not always ours: a proxy's page, say). */
export function errorOfAnswer(status: number, statusText: string, text: string): ApiError {
  let body: unknown;
  try {
    body = JSON.parse(text);
  } catch {
    // Not JSON: the status line says what there is to say.
  }
  const fallback = `The server answered ${status}${statusText ? ` ${statusText}` : ""}.`;
  return fromField(errorField(body) ?? {}, status, fallback);
}

/** The error an event stream sent as `data: {"error":{...}}`, if `data` (parsed JSON) is one. */
export function errorOfEvent(data: unknown): ApiError | undefined {
  const field = errorField(data);
  return field && fromField(field, 0, "The stream failed.");
}

/** No answer from `baseUrl`: said in plain words, with the network's reason where the runtime gives one. */
export function unreachable(baseUrl: string, error: unknown): ApiError {
  // Node's fetch says "fetch failed" and puts the reason (ECONNREFUSED ...) in `cause`; browsers give no reason.
  const cause = (error as { cause?: { message?: unknown } } | undefined)?.cause?.message;
  const message = baseUrl
    ? `Cannot reach ${baseUrl}${typeof cause === "string" ? ` (${cause})` : ""}. Is the Conduit server running?`
    : "Cannot reach the Conduit server. Is it running?";
  return new ApiError(message, 0, clientErrorCodes.connectionFailed);
}
