import { STATUS_CODES, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { BlockList, isIPv4, type Socket } from "node:net";
import type {
  FastifyError,
  FastifyInstance,
  FastifyReply,
  FastifyRequest,
  FastifyHttpOptions,
} from "fastify";
import type { Config, TrustProxy } from "../config.ts";
import { ConduitError } from "../errors.ts";
import { errorBody, toConduitError } from "./errorHandler.ts";

/**
 * Hostile or broken clients and shutdown. Node's HTTP server limits the time for a request's
 * headers (`headersTimeout`) and for the whole request (`requestTimeout`) and closes idle
 * keep-alive connections (its `keepAliveTimeout`, our `idleTimeout`); `ConnectionGuard` adds a
 * limit on pauses while a body arrives, and a shutdown that closes idle and stalled connections
 * at once and every other one after `shutdownTimeout`. Each answers, while an answer is still
 * possible, in the documented error shape. None applies to a response once its request has
 * arrived, so a stream runs as long as it has something to say.
 */
export type ConnectionSettings = Pick<
  Config,
  | "headersTimeout"
  | "bodyTimeout"
  | "minBodyRate"
  | "requestTimeout"
  | "idleTimeout"
  | "shutdownTimeout"
  | "maxConnections"
  | "maxConnectionsPerAddress"
  | "trustProxy"
>;

/**
 * Whether the peer `hop` steps from the server (0: the connection's, then `X-Forwarded-For` from the right) at
 * `address` is a proxy to believe, as Fastify's `trustProxy` function takes it: the nearest `hops`, or those at the
 * listed addresses and ranges (an IPv4 one also matches its IPv6-mapped form). Undefined: no proxy is believed.
 */
export function proxyTrust(
  setting: TrustProxy | undefined,
): ((address: string, hop: number) => boolean) | undefined {
  if (setting === undefined) return undefined;
  if ("hops" in setting) return (_address, hop) => hop < setting.hops;
  const trusted = new BlockList();
  for (const entry of setting.addresses) {
    const [address = "", prefix] = entry.split("/");
    const type = isIPv4(address) ? "ipv4" : "ipv6";
    if (prefix === undefined) trusted.addAddress(address, type);
    else trusted.addSubnet(address, Number(prefix), type);
  }
  return (address) => {
    try {
      return trusted.check(address, isIPv4(address) ? "ipv4" : "ipv6");
    } catch {
      // Not an address at all (a garbled X-Forwarded-For entry): not a proxy.
      return false;
    }
  };
}

/**
 * Longest path segment the router takes; a longer one is a 414. Above every id and name a path
 * carries (names are up to 256 characters), so that one a little too long is a 400 naming it.
 */
const MAX_PARAM_LENGTH = 1024;

/** A whole HTTP/1.1 error response, written on the socket itself. */
function rawErrorResponse(error: ConduitError, requestId?: string): string {
  const body = JSON.stringify(errorBody(error));
  return (
    `HTTP/1.1 ${error.status} ${STATUS_CODES[error.status] ?? error.code}\r\n` +
    `content-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\n` +
    (requestId ? `x-request-id: ${requestId}\r\n` : "") +
    `connection: close\r\n\r\n${body}`
  );
}

/**
 * Answers `error` on the socket of a request that is still arriving, unless an answer has
 * begun, and closes it. Written on the socket, as Node answers its own timeouts: the request then
 * ends aborted, so whatever reads its body (an upload) fails, cleans up and finds nobody to answer.
 */
function answerAndClose(
  socket: Socket,
  response: ServerResponse | undefined,
  error: ConduitError,
  requestId?: string,
) {
  if (socket.writable && !response?.headersSent) {
    socket.write(rawErrorResponse(error, requestId));
    socket.destroySoon();
  } else socket.destroy();
}

/** What Node's parser reports about a connection it gives up on, as a catalog error. */
function clientError(error: Error & { code?: string }): ConduitError {
  if (error.code === "ERR_HTTP_REQUEST_TIMEOUT")
    return new ConduitError(
      "request_timeout",
      "the request did not arrive in time; the connection is closed",
    );
  if (error.code === "HPE_HEADER_OVERFLOW")
    return new ConduitError("headers_too_large", "the request line and headers are larger than 16 KiB");
  return new ConduitError("invalid_request", "the request is not valid HTTP");
}

interface Tracked {
  request: IncomingMessage;
  reply: FastifyReply;
  /** `socket.bytesRead` when last seen, and when it last moved. */
  bytesRead: number;
  movedAt: number;
  /** `socket.bytesRead` and the time when the request began. */
  startBytes: number;
  startedAt: number;
}

/**
 * Tracks the server's connections and the request each one is answering: a request whose body
 * stops arriving for `bodyTimeout` is answered 408 and its connection closed, and on close idle
 * and stalled connections are closed at once, the others when their response is done or after
 * `shutdownTimeout`. Pass `serverOptions()` to `Fastify()`, then call `register` before any other
 * `onRequest` hook.
 */
export class ConnectionGuard {
  private readonly sockets = new Set<Socket>();
  private readonly current = new Map<Socket, Tracked>();
  /** Open connections by client address (those of trusted proxies are not counted). */
  private readonly perAddress = new Map<string, number>();
  /** When each address at its share was last warned about (at most one warning a minute for each). */
  private readonly warnedAt = new Map<string, number>();
  private readonly trust: ((address: string, hop: number) => boolean) | undefined;
  private closing = false;
  private bodyTimer: NodeJS.Timeout | undefined;

  constructor(private readonly settings: ConnectionSettings) {
    this.trust = proxyTrust(settings.trustProxy);
  }

  /** Server options for the timeouts, and the framework's errors (408, 414, 431) in the documented shape. */
  serverOptions(): Partial<FastifyHttpOptions<Server>> {
    const { headersTimeout, requestTimeout, idleTimeout } = this.settings;
    const shortest = requestTimeout > 0 ? Math.min(requestTimeout, headersTimeout) : headersTimeout;
    return {
      // The client address of a request (key throttling, logs): through the trusted proxies' X-Forwarded-For.
      ...(this.trust ? { trustProxy: this.trust } : {}),
      keepAliveTimeout: idleTimeout,
      requestTimeout,
      // `requestTimeout` here too: Node checks it against `headersTimeout` when it creates the server.
      http: {
        headersTimeout,
        requestTimeout,
        // How often Node looks for requests past their time (its default, 30 s, would make a 30 s
        // limit up to a 60 s one).
        connectionsCheckingInterval: checkInterval(shortest),
      },
      // Requests that arrive while closing get the catalog's 503 from `register`'s hook instead.
      return503OnClosing: false,
      routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
      frameworkErrors: (error: FastifyError, request: FastifyRequest, reply: FastifyReply) => {
        const conduitError = toConduitError(error) ?? new ConduitError("invalid_request", "invalid request");
        void reply
          .header("x-request-id", request.id)
          .status(conduitError.status)
          .send(errorBody(conduitError));
      },
      // Node's own timeouts and parse errors, answered while nothing else was written on the socket.
      clientErrorHandler: (error: Error & { code?: string }, socket: Socket) => {
        if (error.code === "ECONNRESET" || socket.destroyed) return;
        const tracked = this.current.get(socket);
        answerAndClose(socket, tracked?.reply.raw, clientError(error), tracked?.reply.request.id);
      },
    };
  }

  register(app: FastifyInstance): void {
    const { sockets, current } = this;
    // Node closes a connection that arrives past the limit at once.
    if (this.settings.maxConnections > 0) app.server.maxConnections = this.settings.maxConnections;
    app.server.on("connection", (socket: Socket) => {
      if (!this.admit(socket, app)) return;
      sockets.add(socket);
      socket.once("close", () => {
        sockets.delete(socket);
        current.delete(socket);
      });
    });

    // A callback hook, not an async one: it runs for every request and has nothing to wait for.
    app.addHook("onRequest", (request, reply, done) => {
      const socket = request.raw.socket;
      // `inject` requests have no real socket.
      if (sockets.has(socket)) {
        const now = Date.now();
        const tracked: Tracked = {
          request: request.raw,
          reply,
          bytesRead: socket.bytesRead,
          movedAt: now,
          startBytes: socket.bytesRead,
          startedAt: now,
        };
        current.set(socket, tracked);
        reply.raw.once("close", () => {
          if (current.get(socket) === tracked) current.delete(socket);
        });
      }
      done(this.closing ? new ConduitError("unavailable", "the server is shutting down") : undefined);
    });

    this.bodyTimer = setInterval(() => this.checkBodies(), checkInterval(this.settings.bodyTimeout));
    this.bodyTimer.unref();

    app.addHook("preClose", async () => this.close(app));
  }

  /**
   * Counts a new connection against its address's share of the connections (`maxConnectionsPerAddress`), or
   * closes it at once, as Node closes one past the whole cap, when the address holds its share already. A
   * warning names the address, at most once a minute. A trusted proxy's connections carry many clients'
   * requests, so they are not counted.
   */
  private admit(socket: Socket, app: FastifyInstance): boolean {
    const share = this.settings.maxConnectionsPerAddress;
    const address = socket.remoteAddress;
    if (share === 0 || address === undefined || this.trust?.(address, 0)) return true;
    const open = this.perAddress.get(address) ?? 0;
    if (open >= share) {
      socket.destroy();
      const now = Date.now();
      if (now - (this.warnedAt.get(address) ?? -Infinity) >= 60_000) {
        this.warnedAt.delete(address);
        this.warnedAt.set(address, now);
        // Remembered for the latest 10,000 addresses: past that, the oldest is forgotten.
        if (this.warnedAt.size > 10_000) this.warnedAt.delete(this.warnedAt.keys().next().value!);
        app.log.warn(
          `${address} holds ${open} connections, its share (CONDUIT_CONNECTIONS_PER_IP): ` +
            "more from it are closed as they arrive",
        );
      }
      return false;
    }
    this.perAddress.set(address, open + 1);
    socket.once("close", () => {
      const left = (this.perAddress.get(address) ?? 1) - 1;
      if (left > 0) this.perAddress.set(address, left);
      else this.perAddress.delete(address);
    });
    return true;
  }

  /** One timer for every request whose body is still arriving: it looks at how far each has got. */
  private checkBodies(): void {
    const now = Date.now();
    for (const [socket, tracked] of this.current) {
      if (tracked.request.complete || tracked.reply.raw.headersSent) continue;
      if (socket.bytesRead !== tracked.bytesRead) {
        tracked.bytesRead = socket.bytesRead;
        tracked.movedAt = now;
      }
      // Once a body has taken the pause limit, it must also have come at the least rate on average: a byte
      // every few seconds never pauses long, but would hold the connection for as long as the request may take.
      const elapsed = now - tracked.startedAt;
      const rate = ((socket.bytesRead - tracked.startBytes) * 1000) / Math.max(1, elapsed);
      const stalled = now - tracked.movedAt >= this.settings.bodyTimeout;
      const slow =
        this.settings.minBodyRate > 0 &&
        elapsed >= this.settings.bodyTimeout &&
        rate < this.settings.minBodyRate;
      if (!stalled && !slow) continue;
      this.current.delete(socket);
      tracked.reply.log.info(
        stalled
          ? "the request body stalled: answered 408 and closed the connection"
          : `the request body arrived at ${rate.toFixed(0)} B/s: answered 408 and closed the connection`,
      );
      const error = new ConduitError(
        "request_timeout",
        stalled
          ? `the request body stopped arriving for ${this.settings.bodyTimeout} ms; the connection is closed`
          : `the request body arrives at ${rate.toFixed(0)} bytes/s, slower than ${this.settings.minBodyRate} ` +
              "(CONDUIT_MIN_BODY_RATE); the connection is closed",
      );
      answerAndClose(socket, tracked.reply.raw, error, tracked.reply.request.id);
    }
  }

  private close(app: FastifyInstance): void {
    this.closing = true;
    clearInterval(this.bodyTimer);
    for (const socket of this.sockets) {
      const tracked = this.current.get(socket);
      // Idle, or still sending its request: nothing is lost by closing it now.
      if (!tracked?.request.complete || tracked.reply.raw.writableFinished) socket.destroy();
      // A response under way ends its connection when it is done.
      else tracked.reply.raw.once("finish", () => socket.destroySoon());
    }
    const force = setTimeout(() => {
      for (const socket of this.sockets) socket.destroy();
    }, this.settings.shutdownTimeout);
    force.unref();
    app.server.once("close", () => clearTimeout(force));
  }
}

/** How often to look for requests past a limit of `ms`: a quarter of it, between 10 ms and 1 s. */
function checkInterval(ms: number): number {
  return Math.max(10, Math.min(1000, Math.floor(ms / 4)));
}
