import type { FastifyInstance, FastifyReply } from "fastify";
import { ConduitError } from "../errors.ts";

declare module "fastify" {
  interface FastifyInstance {
    /** The run event streams open now, per user (`CONDUIT_MAX_STREAMS_PER_USER`). */
    eventStreams: StreamLimit;
  }
}

/**
 * Seconds a client refused for too many open streams is told to wait. A place frees when one of its own
 * streams ends, which the server cannot foresee; a few seconds is as long as a reconnecting client waits.
 */
const RETRY_AFTER_S = 5;

/**
 * Open run event streams per user. A stream holds a connection for as long as its run lasts (hours), and
 * nothing else bounds how many a user opens, so past `max` a user's next one is refused (429 with
 * `Retry-After`) until one of theirs closes. Streamed generations are not counted: each holds a sequence or a
 * place in the generation queue, which are bounded already, and ends with its generation.
 */
export class StreamLimit {
  private readonly open = new Map<string, number>();
  private count = 0;

  /** @param max streams one user may hold open at once; `0`: no limit. */
  constructor(private readonly max: number) {}

  /**
   * Counts a stream of `userId` until the connection of `reply` closes (the stream ended, or the client
   * left), or refuses it with `rate_limited` when the user holds `max` already.
   */
  hold(userId: string, reply: FastifyReply): void {
    const held = this.open.get(userId) ?? 0;
    if (this.max > 0 && held >= this.max)
      throw new ConduitError(
        "rate_limited",
        `this user has ${held} run event streams open, the most allowed (CONDUIT_MAX_STREAMS_PER_USER); ` +
          `close one, or retry in ${RETRY_AFTER_S} s`,
        { retryAfter: RETRY_AFTER_S },
      );
    // A connection closed already will not say so again: there is nothing to hold.
    if (reply.raw.closed) return;
    this.open.set(userId, held + 1);
    this.count++;
    reply.raw.once("close", () => {
      this.count--;
      const left = (this.open.get(userId) ?? 1) - 1;
      if (left > 0) this.open.set(userId, left);
      else this.open.delete(userId);
    });
  }

  /** Streams open now, of all users. */
  get total(): number {
    return this.count;
  }
}

export function registerStreamLimit(app: FastifyInstance, max: number): void {
  app.decorate("eventStreams", new StreamLimit(max));
}
