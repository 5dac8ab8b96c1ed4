import { activeStatuses, type RunStats, type RunStatus } from "../contract/runs.ts";
import { ApiError, clientErrorCodes, errorOfEvent } from "./ApiError.ts";
import { readSse } from "./sse.ts";

/**
 * An event of `GET /conduit/finetuning/{id}/events`: a log line, the run's stats (`lossSeries` and
 * `evalLossSeries` hold only the points the stream has not sent yet; see `mergeStats`), or its status
 * (`DELETED` when the run is deleted while followed). `id` is the event's SSE id, when the server sends one.
 */
export type RunEvent = { id?: string } & (
  | { event: "log"; data: { line: string } }
  | { event: "stats"; data: RunStats }
  | { event: "status"; data: { status: RunStatus | "DELETED"; error: string | null } }
);

export interface RunEventsOptions {
  /** Stops following: the iteration ends with the signal's reason. */
  signal?: AbortSignal;
  /**
   * Reconnections in a row that may fail before the reader gives up and throws the last error.
   * Defaults to `5`.
   */
  retries?: number;
  /** Milliseconds to wait before reconnecting, unless the server's `retry:` says otherwise. Defaults to `2000`. */
  retryMs?: number;
  /** Called when the connection dropped, before each attempt to reconnect. */
  onRetry?: (error: ApiError) => void;
}

/** Opens the stream, with `Last-Event-ID` when the reader has one: the response body, or an ApiError. */
export type OpenRunEvents = (lastEventId: string | undefined) => Promise<ReadableStream<Uint8Array>>;

/** Errors after which following again may work: the connection, or a server going away or restarting. */
function droppedConnection(error: unknown): error is ApiError {
  return (
    error instanceof ApiError &&
    (error.code === clientErrorCodes.connectionFailed ||
      error.code === clientErrorCodes.connectionLost ||
      error.code === "unavailable" ||
      error.status === 502 ||
      error.status === 503 ||
      error.status === 504)
  );
}

function ended(status: RunStatus | "DELETED"): boolean {
  return status === "DELETED" || !activeStatuses.includes(status);
}

/**
 * Follows a run until it ends (READY, FAILED, CANCELLED, or deleted), reconnecting when an established
 * connection drops or the server goes away. A reconnection sends the last SSE id seen as `Last-Event-ID`,
 * so a server that honours it goes on where the stream stopped. A server that sends no ids replays the log
 * from its start: the lines already yielded are skipped then, so each log line comes once. A status comes
 * only when it changes. A first connection that fails throws at once (there is nothing to resume yet), as
 * does an error answer (a 404: the run is gone).
 */
export async function* followRunEvents(
  open: OpenRunEvents,
  { signal, retries = 5, retryMs = 2000, onRetry }: RunEventsOptions = {},
): AsyncGenerator<RunEvent> {
  let lastEventId: string | undefined;
  let logLines = 0;
  let status: RunStatus | "DELETED" | undefined;
  let connected = false;
  let failures = 0;
  let wait = retryMs;
  for (;;) {
    let dropped: ApiError;
    try {
      const body = await open(lastEventId);
      connected = true;
      // Without ids the server cannot resume: it replays the log, whose first lines were had already.
      let replayed = lastEventId === undefined ? logLines : 0;
      for await (const message of readSse(body, (ms) => (wait = ms))) {
        if (message.id !== undefined) lastEventId = message.id === "" ? undefined : message.id;
        const data = JSON.parse(message.data) as unknown;
        const error = errorOfEvent(data);
        if (error) throw error;
        failures = 0;
        const event = { ...(message.id ? { id: message.id } : {}), event: message.event, data } as RunEvent;
        if (event.event === "log") {
          if (replayed > 0) {
            replayed--;
            continue;
          }
          logLines++;
        } else if (event.event === "status") {
          if (event.data.status === status) continue;
          status = event.data.status;
        } else if (event.event !== "stats") continue; // an event this client does not know yet
        yield event;
        if (status !== undefined && ended(status)) return;
      }
      dropped = new ApiError(
        "The run's event stream ended before the run did.",
        0,
        clientErrorCodes.connectionLost,
      );
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      if (!connected || !droppedConnection(error)) throw error;
      dropped = error;
    }
    if (++failures > retries) throw dropped;
    onRetry?.(dropped);
    await sleep(wait, signal);
  }
}

/** Waits `ms`, or rejects with the signal's reason when it aborts first. */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const abort = () => {
      clearTimeout(timer);
      reject(signal?.reason as Error);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", abort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", abort, { once: true });
  });
}

/**
 * A run's stats after a `stats` event: its fields replace the old ones; each loss series keeps its points
 * before the event's first one and takes the event's after it. So an event with the new points only (the
 * stream's usual) appends them, and one that replays the series (a new connection's first) replaces it.
 * `seriesReset` (the run started over) replaces the series whatever their steps.
 */
export function mergeStats(previous: RunStats, event: RunStats): RunStats {
  const { seriesReset, ...fields } = event;
  const splice = <T extends { step: number }>(shown: T[] = [], added: T[] = []): T[] => {
    if (seriesReset === true) return added;
    const from = added[0]?.step;
    return from === undefined ? shown : [...shown.filter((p) => p.step < from), ...added];
  };
  return {
    ...previous,
    ...fields,
    lossSeries: splice(previous.lossSeries, event.lossSeries),
    evalLossSeries: splice(previous.evalLossSeries, event.evalLossSeries),
  };
}
