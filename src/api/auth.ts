import type { FastifyInstance, FastifyRequest } from "fastify";
import { ConduitError } from "../errors.ts";
import type { Core } from "../core.ts";

declare module "fastify" {
  interface FastifyRequest {
    /** The owner of the API key that authenticated this request. */
    userId: string;
  }
  interface FastifyContextConfig {
    /** Routes marked public skip the API key check (health, docs, dashboard assets). */
    public?: boolean;
  }
}

/** The key from `x-api-key`, or `Authorization: Token <key>` / `Bearer <key>`. */
export function apiKeyOf(request: FastifyRequest): string | undefined {
  const header = request.headers["x-api-key"];
  if (typeof header === "string" && header.trim() !== "") return header.trim();
  const authorization = request.headers.authorization;
  const match = authorization?.match(/^(?:Token|Bearer)\s+(\S+)\s*$/i);
  return match?.[1];
}

/** Clients remembered at once; past it the ones seen longest ago are forgotten. */
const MAX_CLIENTS = 10_000;
const WINDOW_MS = 60_000;

/**
 * Failed key checks per client address in fixed one-minute windows: past `limit` in a window the client is
 * refused (429 with the seconds left) until the window ends, and one warning is logged. Key guessing is
 * slowed to `limit` guesses a minute, and shows in the log.
 */
export class FailedKeys {
  private readonly clients = new Map<string, { since: number; count: number; warned: boolean }>();

  constructor(
    private readonly limit: number,
    private readonly warn: (message: string) => void,
  ) {}

  /** Seconds until `client` may try again, or undefined when it may now. */
  blockedFor(client: string, now = Date.now()): number | undefined {
    const entry = this.clients.get(client);
    if (this.limit === 0 || entry === undefined || entry.count < this.limit) return undefined;
    const left = entry.since + WINDOW_MS - now;
    return left > 0 ? Math.ceil(left / 1000) : undefined;
  }

  failed(client: string, now = Date.now()): void {
    if (this.limit === 0) return;
    let entry = this.clients.get(client);
    if (entry === undefined || now - entry.since >= WINDOW_MS) {
      entry = { since: now, count: 0, warned: false };
      this.clients.delete(client);
      this.clients.set(client, entry);
      if (this.clients.size > MAX_CLIENTS) this.clients.delete(this.clients.keys().next().value!);
    }
    entry.count += 1;
    if (entry.count >= this.limit && !entry.warned) {
      entry.warned = true;
      this.warn(
        `${entry.count} failed API keys from ${client} within a minute: its requests get 429 until ` +
          `${new Date(entry.since + WINDOW_MS).toISOString()} (CONDUIT_MAX_KEY_FAILURES)`,
      );
    }
  }
}

/**
 * Every route needs a valid key unless its config says `public: true`. The key is checked before the client's
 * failures: a valid key is served even from an address that sent too many wrong ones (behind a NAT or a proxy
 * others share it), and only missing and wrong keys from such an address get the 429. Key guessing is then not
 * slowed, but it is hopeless: a generated key holds 256 random bits (keys given in `CONDUIT_API_KEYS` should
 * too), and every address past the limit is in the log.
 */
export function registerAuth(app: FastifyInstance, keys: Core["keys"], maxKeyFailures: number): void {
  const failures = new FailedKeys(maxKeyFailures, (message) => app.log.warn(message));
  app.decorateRequest("userId", "");
  app.addHook("onRequest", async (request) => {
    if (request.routeOptions.config.public) return;
    // Unknown routes fall through to the 404 handler only for authenticated callers, so route
    // names are not an oracle for anonymous ones.
    const key = apiKeyOf(request);
    const found = key ? await keys.authenticate(key) : undefined;
    if (found) {
      request.userId = found.userId;
      return;
    }
    const blocked = failures.blockedFor(request.ip);
    if (blocked !== undefined)
      throw new ConduitError(
        "rate_limited",
        `too many failed API keys from this client; retry in ${blocked} s`,
        { retryAfter: blocked },
      );
    failures.failed(request.ip);
    throw new ConduitError(
      "unauthorized",
      key ? "invalid API key" : "missing API key: send `x-api-key: <key>` or `Authorization: Token <key>`",
    );
  });
}
