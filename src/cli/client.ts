import { createParser, type EventSourceMessage } from "eventsource-parser";

/** An error answer from the server, with its catalog code. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly param: string | null = null,
  ) {
    super(message);
    this.name = "ApiError";
  }
}

/** The CLI's HTTP client: JSON in and out, errors as `ApiError`, SSE as async iterables. */
export class ApiClient {
  constructor(
    readonly baseUrl: string,
    private readonly key: string | undefined,
  ) {}

  private headers(extra: Record<string, string> = {}): Record<string, string> {
    return { ...(this.key ? { "x-api-key": this.key } : {}), ...extra };
  }

  private async fetch(path: string, init: RequestInit): Promise<Response> {
    let response: Response;
    try {
      response = await fetch(new URL(path, this.baseUrl), init);
    } catch (error) {
      throw new ApiError(
        0,
        "connection_failed",
        `cannot reach ${this.baseUrl} (${(error as Error & { cause?: Error }).cause?.message ?? (error as Error).message}); is \`conduit serve\` running?`,
      );
    }
    if (!response.ok) {
      const text = await response.text();
      let body: { error?: { message?: string; code?: string; param?: string | null } } = {};
      try {
        body = JSON.parse(text) as typeof body;
      } catch {
        // Not our JSON error shape (a proxy, say): report the status line.
      }
      throw new ApiError(
        response.status,
        body.error?.code ?? `http_${response.status}`,
        body.error?.message ?? `${response.status} ${response.statusText}`,
        body.error?.param ?? null,
      );
    }
    return response;
  }

  async request<T>(method: string, path: string, body?: unknown): Promise<T> {
    const response = await this.fetch(path, {
      method,
      headers: this.headers(body === undefined ? {} : { "content-type": "application/json" }),
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    });
    return (await response.json()) as T;
  }

  /** A GET of a list: its items, and the `x-total-count` header where the server sends one. */
  async list<T>(path: string): Promise<{ items: T[]; total: number | undefined }> {
    const response = await this.fetch(path, { method: "GET", headers: this.headers() });
    const total = response.headers.get("x-total-count");
    return { items: (await response.json()) as T[], total: total === null ? undefined : Number(total) };
  }

  /** Sends a body stream (uploads) and parses the JSON answer. */
  async send<T>(
    method: string,
    path: string,
    contentType: string,
    body: ReadableStream<Uint8Array>,
  ): Promise<T> {
    const response = await this.fetch(path, {
      method,
      headers: this.headers({ "content-type": contentType }),
      body,
      duplex: "half",
    } as RequestInit);
    return (await response.json()) as T;
  }

  /** A GET whose answer is a file: the response, with its headers and a body to stream to disk. */
  async download(path: string): Promise<Response> {
    return this.fetch(path, { method: "GET", headers: this.headers() });
  }

  /** Server-Sent Events of a GET or POST, as messages; ends with the stream. */
  async *events(
    method: string,
    path: string,
    body?: unknown,
    signal?: AbortSignal,
  ): AsyncGenerator<EventSourceMessage> {
    const response = await this.fetch(path, {
      method,
      headers: this.headers(
        body === undefined
          ? { accept: "text/event-stream" }
          : { "content-type": "application/json", accept: "text/event-stream" },
      ),
      ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      ...(signal ? { signal } : {}),
    });
    const queue: EventSourceMessage[] = [];
    const parser = createParser({ onEvent: (event) => queue.push(event) });
    const decoder = new TextDecoder();
    for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
      parser.feed(decoder.decode(chunk, { stream: true }));
      while (queue.length > 0) yield queue.shift() as EventSourceMessage;
    }
  }
}
