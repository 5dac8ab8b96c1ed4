/**
 * What one request's CPU work costs every other client (issue #28): a real `conduit serve` with stories260K, one
 * request at a time, while a client in a process of its own asks `/healthz` every 20 ms; for each request its
 * status, its time and the slowest `/healthz` answer meanwhile (how long the server's event loop was held). `idle`
 * is that worst latency with no request running, the reference of the same run (on a shared machine it is not 0).
 *
 *   node --import tsx bench/eventLoop.ts [--only grammar|prompt|upload] [--enums 1000,10000] [--upload-mb 100]
 *   node --import tsx bench/eventLoop.ts --phases    # where a JSON schema's compile time goes, in-process
 *
 * Cases: a `response_format` schema with an `enum` of each `--enums` size and one of 1000 properties; a chat and a
 * completions prompt of 573 KiB; uploads of `--upload-mb` as raw JSONL, raw JSON array, raw CSV and multipart, and
 * the JSON forms (`content`, `ioPairs`) at 80% of that size.
 *
 * `--phases` times, per schema shape, the CPU milliseconds of node-llama-cpp's JavaScript that writes the GBNF text
 * (a worker thread's work in the server), llama.cpp parsing it (`AddonGrammar`, once per cached schema) and the
 * grammar state of one generation (`AddonGrammarEvaluationState`, which parses the text again): the last two run on
 * the event loop. Each row says which of `SCHEMA_BOUNDS` (`src/engine/schemaBounds.ts`) refuses the schema.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { parseArgs } from "node:util";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { BENCH_KEY, startConduit, type RunningServer } from "./lib/conduitServer.ts";
import { modelPath, requireFile } from "./lib/reference.ts";

const { values } = parseArgs({
  options: {
    only: { type: "string" },
    enums: { type: "string", default: "1000,3000,10000,30000,100000" },
    "upload-mb": { type: "string", default: "100" },
    phases: { type: "boolean", default: false },
  },
});

const enumValues = (n: number) => Array.from({ length: n }, (_, i) => `v${i}`);

async function endToEnd(): Promise<void> {
  const model = requireFile(modelPath("stories260K"));
  const server = await startConduit({ stories: model }, { CONDUIT_DEFAULT_MODEL: "stories" });
  const only = values.only;
  try {
    // Loads the model, so no case pays for it.
    await measure(server, "warm-up chat", () => chat(server, { prompt: "Once upon a time", max_tokens: 4 }));
    await measure(server, "idle (no request)", () => new Promise((resolve) => setTimeout(resolve, 2000)));
    if (only === undefined || only === "grammar") {
      for (const n of values.enums.split(",").map(Number))
        await measure(server, `enum of ${n} strings`, () =>
          chat(server, { ...schemaChat({ enum: enumValues(n) }) }),
        );
      const properties = Object.fromEntries(
        Array.from({ length: 1000 }, (_, i) => [`p${i}`, { type: "integer" }]),
      );
      await measure(server, "1000 properties", () =>
        chat(server, schemaChat({ type: "object", properties })),
      );
    }
    if (only === undefined || only === "prompt") {
      // A body just under the 1 MiB default limit: text the SPM tokenizer cannot merge much.
      const words = Array.from({ length: 120_000 }, (_, i) => `w${i % 997}`).join(" ");
      await measure(server, `chat prompt of ${(words.length / 1024).toFixed(0)} KiB`, () =>
        chat(server, { prompt: words, max_tokens: 1 }),
      );
      await measure(server, `completions prompt of ${(words.length / 1024).toFixed(0)} KiB`, () =>
        post(server, "/v1/completions", { prompt: words, max_tokens: 1 }),
      );
    }
    if (only === undefined || only === "upload") await uploads(server, Number(values["upload-mb"]));
  } finally {
    poller?.kill();
    server.stop();
  }
}

function schemaChat(schema: unknown) {
  return {
    prompt: "Pick one",
    max_tokens: 8,
    response_format: { type: "json_schema", json_schema: { name: "bench", schema } },
  };
}

async function uploads(server: RunningServer, mb: number): Promise<void> {
  const { id } = (await (await post(server, "/conduit/dataset", { name: "bench" })).json()) as { id: string };
  const pair = {
    input: "Translate to French: the cat sits on the mat",
    output: "le chat est assis sur le tapis",
  };
  const count = Math.floor((mb * 1024 * 1024) / (JSON.stringify(pair).length + 2));
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-"));
  try {
    const jsonl = path.join(dir, "big.jsonl");
    fs.writeFileSync(jsonl, `${JSON.stringify(pair)}\n`.repeat(count));
    const json = path.join(dir, "big.json");
    fs.writeFileSync(json, `[${`${JSON.stringify(pair)},\n`.repeat(count - 1)}${JSON.stringify(pair)}]`);
    const csv = path.join(dir, "big.csv");
    fs.writeFileSync(csv, `input,output\n${`"${pair.input}","${pair.output}"\n`.repeat(count)}`);
    const upload = `/conduit/dataset/${id}/upload`;
    const raw = (file: string, name: string, type: string) => {
      const body = fs.readFileSync(file);
      return () =>
        fetch(`${server.url}${upload}?name=${name}`, {
          method: "POST",
          headers: { authorization: `Bearer ${BENCH_KEY}`, "content-type": type },
          body,
        });
    };
    await measure(server, `raw JSONL ${mb} MiB`, raw(jsonl, "big.jsonl", "application/jsonl"));
    await measure(server, `raw JSON array ${mb} MiB`, raw(json, "big.json", "application/octet-stream"));
    await measure(server, `raw CSV ${mb} MiB`, raw(csv, "big.csv", "text/csv"));
    await measure(server, `multipart JSONL ${mb} MiB`, () => {
      const form = new FormData();
      form.set("file", new Blob([fs.readFileSync(jsonl)]), "big.jsonl");
      return fetch(`${server.url}${upload}`, {
        method: "POST",
        headers: { authorization: `Bearer ${BENCH_KEY}` },
        body: form,
      });
    });
    // The JSON forms escape the text (`\"`): 80% of the size keeps the body under the same limit.
    const lines = Math.floor(count * 0.8);
    const content = JSON.stringify({ name: "big.jsonl", content: `${JSON.stringify(pair)}\n`.repeat(lines) });
    await measure(server, `JSON {content} ${(content.length / 2 ** 20).toFixed(0)} MiB`, () =>
      postText(server, upload, content),
    );
    const ioPairs = JSON.stringify({ name: "big.jsonl", ioPairs: Array.from({ length: lines }, () => pair) });
    await measure(server, `JSON {ioPairs} ${(ioPairs.length / 2 ** 20).toFixed(0)} MiB`, () =>
      postText(server, upload, ioPairs),
    );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

function post(server: RunningServer, route: string, body: unknown): Promise<Response> {
  return postText(server, route, JSON.stringify(body));
}

function postText(server: RunningServer, route: string, body: string): Promise<Response> {
  return fetch(`${server.url}${route}`, {
    method: "POST",
    headers: { authorization: `Bearer ${BENCH_KEY}`, "content-type": "application/json" },
    body,
  });
}

const chat = (server: RunningServer, body: unknown) => post(server, "/conduit/v1/chat", body);

/**
 * A client in a process of its own that asks `url` every 20 ms between `start` and `stop` and answers `stop`
 * with the slowest answer's milliseconds: the bench's own event loop (building and sending a 100 MiB body) cannot
 * delay it.
 */
const POLLER = `
let running = false, worst = 0;
process.on("message", async (m) => {
  if (m.stop) { running = false; return; }
  running = true; worst = 0;
  while (running) {
    const started = performance.now();
    await fetch(m.url).then((r) => r.arrayBuffer());
    worst = Math.max(worst, performance.now() - started);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  process.send({ worst });
});
`;
let poller: ChildProcess | undefined;

/** Runs `request` while another client polls `/healthz`; prints its status, its time and the worst `/healthz`. */
async function measure(server: RunningServer, name: string, request: () => Promise<unknown>): Promise<void> {
  poller ??= spawn(process.execPath, ["-e", POLLER], { stdio: ["ignore", "inherit", "inherit", "ipc"] });
  const child = poller;
  const worst = new Promise<number>((resolve) =>
    child.once("message", (m) => resolve((m as { worst: number }).worst)),
  );
  child.send({ url: `${server.url}/healthz` });
  // The poller's first answer: it is polling before the request starts.
  await new Promise((resolve) => setTimeout(resolve, 100));
  const started = performance.now();
  const response = await request();
  const took = performance.now() - started;
  const status = response instanceof Response ? response.status : "-";
  const body = response instanceof Response ? await response.text() : "";
  child.send({ stop: true });
  const detail = typeof status === "number" && status >= 400 ? `  ${body.slice(0, 140)}` : "";
  console.log(
    `${name.padEnd(34)} ${String(status).padStart(3)}  request ${fmt(took)} ms  worst /healthz ${fmt(await worst)} ms${detail}`,
  );
}

function fmt(ms: number): string {
  return ms.toFixed(0).padStart(7);
}

async function phases(): Promise<void> {
  const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
  const { bindNative } = await import("../src/engine/nativeBatch.ts");
  const { schemaOverBounds } = await import("../src/engine/schemaBounds.ts");
  // node-llama-cpp's own JSON-schema → GBNF step, as `src/engine/GbnfWriter.ts` loads it.
  const translator = new URL(
    "./utils/gbnfJson/getGbnfGrammarForGbnfJsonSchema.js",
    import.meta.resolve("node-llama-cpp"),
  ).href;
  const { getGbnfGrammarForGbnfJsonSchema } = (await import(translator)) as {
    getGbnfGrammarForGbnfJsonSchema: (schema: unknown) => string;
  };
  const llama = await getLlama({
    gpu: false,
    build: "never",
    logLevel: LlamaLogLevel.error,
    logger: () => {},
  });
  const model = await llama.loadModel({ modelPath: requireFile(modelPath("stories260K")), gpuLayers: 0 });
  const context = await model.createContext({ contextSize: 512, sequences: 1, threads: 1 });
  const native = bindNative(llama, model, context);
  const bindings = (llama as unknown as { _bindings: { AddonGrammar: new (...args: unknown[]) => unknown } })
    ._bindings;
  // CPU time, not wall time: the machine is shared, and this work is on one thread.
  const time = <T>(f: () => T): [number, T] => {
    const started = process.cpuUsage();
    const result = f();
    const { user, system } = process.cpuUsage(started);
    return [(user + system) / 1000, result];
  };
  console.log(
    `${"schema".padEnd(34)} ${"JSON".padStart(9)}  ${"JS".padStart(7)}  ${"parse".padStart(7)}  ${"state".padStart(7)}  bounds`,
  );
  const row = (name: string, schema: unknown) => {
    const [js, gbnf] = time(() => getGbnfGrammarForGbnfJsonSchema(schema));
    const [parse, grammar] = time(
      () => new bindings.AddonGrammar(gbnf, { addonExports: bindings, rootRuleName: "root" }),
    );
    // The least of three: the CPU time is the process's, and threads freeing an earlier row's huge grammar add
    // to one call's (a 5 ms state read 263 ms after the 30,000-value enum).
    const state = Math.min(
      ...[0, 1, 2].map(
        () => time(() => native.createGrammarState({ _grammar: grammar, _llama: llama } as never))[0],
      ),
    );
    const verdict = schemaOverBounds(schema);
    console.log(
      `${name.padEnd(34)} ${`${(JSON.stringify(schema).length / 1024).toFixed(0)} KiB`.padStart(9)}  ${fmt(js)}  ${fmt(parse)}  ${fmt(state)}  ${verdict === undefined ? "within" : `refused: ${verdict.slice(0, 60)}`}`,
    );
  };
  const properties = (n: number, schema: (i: number) => unknown) => ({
    type: "object",
    properties: Object.fromEntries(Array.from({ length: n }, (_, i) => [`p${i}`, schema(i)])),
  });
  const types = ["string", "number", "integer", "boolean", "null", "object", "array"];
  /** `$defs` whose every level reaches the one below twice through alternatives. */
  const doubling = (levels: number) => {
    const $defs: Record<string, unknown> = { a0: { type: "string" } };
    for (let i = 1; i <= levels; i++) {
      const below = { $ref: `#/$defs/a${i - 1}` };
      $defs[`a${i}`] = { oneOf: [below, { oneOf: [below, { type: "null" }] }] };
    }
    return { $defs, $ref: `#/$defs/a${levels}` };
  };
  for (const n of [1000, 3000, 10_000, 30_000]) row(`enum of ${n}`, { enum: enumValues(n) });
  // Distinct alternatives and properties: node-llama-cpp writes equal subschemas as one rule.
  const keyed = (i: number, extra: object = {}) => ({
    type: "object",
    properties: { [`k${i}`]: { type: "integer" } },
    ...extra,
  });
  for (const n of [999, 3000])
    row(`oneOf of ${n} objects`, { oneOf: Array.from({ length: n }, (_, i) => keyed(i)) });
  for (const n of [1999, 5000])
    row(
      `${n} string properties`,
      properties(n, () => ({ type: "string" })),
    );
  for (const n of [999, 2500])
    row(
      `${n} open objects`,
      properties(n, (i) => keyed(i, { additionalProperties: true })),
    );
  row(
    "1999 properties of 7 types",
    properties(1999, () => ({ type: types })),
  );
  for (const levels of [7, 20]) row(`alternatives doubling ${levels}×`, doubling(levels));
  for (const n of [10, 100])
    row(
      `${n} × maxLength 1000`,
      properties(n, (i) => ({ type: "string", maxLength: 1000 - i })),
    );
  row("enum of 1000 × 120 chars", { enum: enumValues(1000).map((v) => v.padEnd(120, "x")) });
  row("const of 1 MB", { const: "x".repeat(1_000_000) });
  await context.dispose();
  await model.dispose();
}

if (values.phases) await phases();
else await endToEnd();
