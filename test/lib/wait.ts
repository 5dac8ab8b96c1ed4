import { once } from "node:events";
import net from "node:net";

/** How `until` polls. */
export interface UntilOptions<T> {
  /** Gives up after this long. Defaults to `30_000`. */
  timeoutMs?: number;
  /** Waits this long between two reads. Defaults to `10`. */
  intervalMs?: number;
  /** How the last value read shows in the error when it gives up. Defaults to its JSON, cut at 2,000 characters. */
  show?: (value: T) => string;
}

/** Anything but `undefined` and `false`: `until`'s default test of what it read. */
const present = (value: unknown) => value !== undefined && value !== false;

/**
 * Reads `read` until `done` holds for what it returned (by default: until it returns something other than
 * `undefined` or `false`), and returns that value; throws, naming `what` and the last value, after the timeout.
 */
export async function until<T>(
  what: string,
  read: () => T | Promise<T>,
  done: (value: T) => boolean = present,
  {
    timeoutMs = 30_000,
    intervalMs = 10,
    show = (value) => String(JSON.stringify(value)).slice(0, 2000),
  }: UntilOptions<T> = {},
): Promise<Exclude<T, undefined | false>> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await read();
    if (done(value)) return value as Exclude<T, undefined | false>;
    if (Date.now() > deadline)
      throw new Error(`gave up waiting for ${what} after ${timeoutMs} ms: ${show(value)}`);
    await new Promise((resolve) => setTimeout(resolve, intervalMs));
  }
}

/** Reads a streamed body until `pattern` shows up (or the body ends); returns what was read. */
export async function readUntil(
  reader: ReadableStreamDefaultReader<Uint8Array>,
  pattern: RegExp,
): Promise<string> {
  const decoder = new TextDecoder();
  let text = "";
  while (!pattern.test(text)) {
    const { value, done } = await reader.read();
    if (done) break;
    text += decoder.decode(value, { stream: true });
  }
  return text;
}

/** A TCP port on 127.0.0.1 that nothing listens on right now. */
export async function freePort(): Promise<number> {
  const server = net.createServer().listen(0, "127.0.0.1");
  await once(server, "listening");
  const { port } = server.address() as net.AddressInfo;
  server.close();
  await once(server, "close");
  return port;
}
