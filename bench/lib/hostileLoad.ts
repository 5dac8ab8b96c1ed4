// The hostile clients of bench/hostile.ts, in a process of their own so that their work does not delay the
// probe's measurements: forked with one scenario (an IPC message), runs it until its deadline, closes every
// connection it opened, answers with what the server said (counts by status) and exits. Loopback only.
import http from "node:http";
import net from "node:net";

export type Scenario =
  | { kind: "enum"; url: string; key: string; seconds: number; concurrency: number; values: number }
  | {
      kind: "followers";
      url: string;
      key: string;
      seconds: number;
      /** The events stream followed: a run's (`/conduit/finetuning/{id}/events`) or an eval run's. */
      path: string;
      /** Streams to open; `beyond` more are expected to be refused by the per-user cap. */
      count: number;
      beyond: number;
    }
  | { kind: "slow"; url: string; key: string; seconds: number; count: number; datasetId: string }
  | { kind: "keys"; url: string; seconds: number; total: number; concurrency: number; from: string }
  | {
      kind: "wrongThenValid";
      url: string;
      /** A valid key, of a user sharing the address with the one who sends the wrong keys. */
      key: string;
      seconds: number;
      /** Wrong keys sent from each address before its valid one (the server's limit). */
      wrong: number;
    };

export interface LoadResult {
  /** Answers by HTTP status (`error` when the connection failed, `open` when still unanswered at the end). */
  statuses: Record<string, number>;
  /** Scenario-specific notes (streams opened, bytes read, `Retry-After` seen). */
  notes: Record<string, number | string>;
}

const statuses: Record<string, number> = {};
const notes: Record<string, number | string> = {};
const count = (status: string | number) => (statuses[status] = (statuses[status] ?? 0) + 1);
const sockets = new Set<net.Socket>();

/** One request on its own connection; resolves with the status once the whole answer has been read. */
function request(
  url: string,
  options: { method: string; path: string; headers?: http.OutgoingHttpHeaders; body?: string; from?: string },
  deadline: number,
): Promise<number | "error" | "open"> {
  return new Promise((resolve) => {
    const { hostname, port } = new URL(url);
    const req = http.request(
      {
        host: hostname,
        port,
        method: options.method,
        path: options.path,
        headers: options.headers,
        agent: false,
        localAddress: options.from,
      },
      (response) => {
        response.resume();
        response.on("end", () => resolve(response.statusCode ?? 0));
        response.on("error", () => resolve(response.statusCode ?? "error"));
      },
    );
    const timer = setTimeout(() => {
      req.destroy();
      resolve("open");
    }, deadline - Date.now());
    req.on("error", () => resolve("error"));
    req.on("close", () => clearTimeout(timer));
    req.end(options.body);
  });
}

/**
 * A 100,000-value enum as the whole schema of `response_format` (no `type`: with one, the grammar refuses
 * it at once), sent again and again by `concurrency` clients.
 */
async function enumSchema(s: Extract<Scenario, { kind: "enum" }>, deadline: number) {
  const body = JSON.stringify({
    messages: [{ role: "user", content: "pick one" }],
    max_tokens: 4,
    response_format: {
      type: "json_schema",
      json_schema: {
        name: "pick",
        schema: { enum: Array.from({ length: s.values }, (_, i) => `v${i}`) },
      },
    },
  });
  notes.bodyBytes = Buffer.byteLength(body);
  const headers = { "x-api-key": s.key, "content-type": "application/json" };
  await Promise.all(
    Array.from({ length: s.concurrency }, async () => {
      while (Date.now() < deadline)
        count(
          await request(s.url, { method: "POST", path: "/v1/chat/completions", headers, body }, deadline),
        );
    }),
  );
}

/** `count` + `beyond` followers of one events stream, each on its own connection, reading until the deadline. */
async function followers(s: Extract<Scenario, { kind: "followers" }>, deadline: number) {
  const { hostname, port } = new URL(s.url);
  let bytes = 0;
  let retryAfter = 0;
  let opened = 0;
  const open = () =>
    new Promise<void>((resolve) => {
      const req = http.get(
        {
          host: hostname,
          port,
          path: s.path,
          headers: { "x-api-key": s.key },
          agent: false,
        },
        (response) => {
          count(response.statusCode ?? 0);
          if (response.statusCode === 200) opened++;
          if (response.headers["retry-after"] !== undefined) retryAfter++;
          response.on("data", (chunk: Buffer) => (bytes += chunk.length));
          response.on("error", () => undefined);
          resolve();
        },
      );
      req.on("socket", (socket) => sockets.add(socket));
      req.on("error", () => {
        count("error");
        resolve();
      });
    });
  // In the order a crowd arrives: all at once, the ones past the cap last.
  await Promise.all(Array.from({ length: s.count }, open));
  await Promise.all(Array.from({ length: s.beyond }, open));
  notes.opened = opened;
  notes.refusedWithRetryAfter = retryAfter;
  await new Promise((resolve) => setTimeout(resolve, Math.max(0, deadline - Date.now())));
  notes.eventBytes = bytes;
}

/**
 * `count` uploads that each announce 1 MB and trickle it a few bytes a second: the server cuts them once
 * they have taken `CONDUIT_BODY_TIMEOUT_MS` below `CONDUIT_MIN_BODY_RATE`.
 */
async function slowBodies(s: Extract<Scenario, { kind: "slow" }>, deadline: number) {
  const { hostname, port } = new URL(s.url);
  await Promise.all(
    Array.from(
      { length: s.count },
      () =>
        new Promise<void>((resolve) => {
          const socket = net.connect({ host: hostname, port: Number(port) });
          sockets.add(socket);
          let answer = "";
          let trickle: NodeJS.Timeout | undefined;
          socket.on("connect", () => {
            socket.write(
              `POST /conduit/dataset/${s.datasetId}/upload?name=slow.jsonl HTTP/1.1\r\nhost: ${hostname}\r\n` +
                `x-api-key: ${s.key}\r\ncontent-type: application/jsonl\r\ncontent-length: 1000000\r\n\r\n`,
            );
            trickle = setInterval(() => socket.write('{"input":"'), 1000);
          });
          socket.on("data", (chunk: Buffer) => (answer += chunk.toString("latin1")));
          socket.on("error", () => undefined);
          socket.on("close", () => {
            clearInterval(trickle);
            count(/^HTTP\/1\.1 (\d+)/.exec(answer)?.[1] ?? (Date.now() >= deadline ? "open" : "closed"));
            resolve();
          });
          setTimeout(() => socket.destroy(), deadline - Date.now());
        }),
    ),
  );
}

/** Requests with wrong keys, `concurrency` at a time, from the loopback address `from`, until `total` are answered. */
async function wrongKeys(s: Extract<Scenario, { kind: "keys" }>, deadline: number) {
  let next = 0;
  await Promise.all(
    Array.from({ length: s.concurrency }, async () => {
      while (next < s.total && Date.now() < deadline) {
        const key = `wrong-key-${String(next++).padStart(8, "0")}`;
        count(
          await request(
            s.url,
            { method: "GET", path: "/conduit/finetuning", headers: { "x-api-key": key }, from: s.from },
            deadline,
          ),
        );
      }
    }),
  );
}

/**
 * Round after round, each from a loopback address of its own (127.0.1.N): `wrong` wrong keys, 5 at a time, then
 * a valid key from the same address (another user behind the same NAT), then one more wrong key. Counted apart:
 * `valid` is the valid key's status each round (200 when it is served), `after` the wrong key's (429: the
 * address is held off).
 */
async function wrongThenValid(s: Extract<Scenario, { kind: "wrongThenValid" }>, deadline: number) {
  const valid: Record<string, number> = {};
  const after: Record<string, number> = {};
  let rounds = 0;
  while (Date.now() < deadline && rounds < 250) {
    const from = `127.0.1.${++rounds}`;
    const get = (key: string) =>
      request(
        s.url,
        { method: "GET", path: "/conduit/finetuning", headers: { "x-api-key": key }, from },
        deadline,
      );
    for (let sent = 0; sent < s.wrong; sent += 5)
      for (const status of await Promise.all(
        Array.from({ length: Math.min(5, s.wrong - sent) }, (_, i) => get(`wrong-key-${rounds}-${sent + i}`)),
      ))
        count(status);
    const answer = await get(s.key);
    valid[answer] = (valid[answer] ?? 0) + 1;
    const refused = await get(`wrong-key-${rounds}-after`);
    after[refused] = (after[refused] ?? 0) + 1;
  }
  notes.rounds = rounds;
  notes["valid key"] = Object.entries(valid)
    .map(([status, n]) => `${n}×${status}`)
    .join(" ");
  notes["wrong key after"] = Object.entries(after)
    .map(([status, n]) => `${n}×${status}`)
    .join(" ");
}

process.once("message", async (scenario: Scenario) => {
  const deadline = Date.now() + scenario.seconds * 1000;
  const started = Date.now();
  if (scenario.kind === "enum") await enumSchema(scenario, deadline);
  else if (scenario.kind === "followers") await followers(scenario, deadline);
  else if (scenario.kind === "slow") await slowBodies(scenario, deadline);
  else if (scenario.kind === "wrongThenValid") await wrongThenValid(scenario, deadline);
  else await wrongKeys(scenario, deadline);
  notes.seconds = ((Date.now() - started) / 1000).toFixed(1);
  for (const socket of sockets) socket.destroy();
  process.send?.({ statuses, notes } satisfies LoadResult, () => process.exit(0));
});
