/**
 * Child process of bench/api.ts: serves Conduit on one port and a bare Fastify route on
 * another, so both are measured under the same conditions.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import Fastify from "fastify";
import pg from "pg";
import { buildApp } from "../src/api/buildApp.ts";
import { loadConfig } from "../src/config.ts";
import { createCore } from "../src/core.ts";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-"));
// On PostgreSQL the bench works in a schema of its own, dropped at the end, so it leaves the database as it was.
const schema = `conduit_bench_${process.pid}`;
const databaseUrl = process.env.DATABASE_URL ? await benchSchema(process.env.DATABASE_URL) : undefined;

async function benchSchema(base: string): Promise<string> {
  await withClient(base, (client) => client.query(`CREATE SCHEMA ${schema}`));
  const url = new URL(base);
  url.searchParams.set("options", `-c search_path=${schema}`);
  return url.toString();
}

async function withClient(url: string, use: (client: pg.Client) => Promise<unknown>): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await use(client);
  } finally {
    await client.end();
  }
}
const config = loadConfig({
  CONDUIT_DATA_DIR: dataDir,
  CONDUIT_API_KEYS: "bench-key-0000000000:bench",
  CONDUIT_LOG_LEVEL: "silent",
  CONDUIT_MAX_UPLOAD_BYTES: String(200 * 1024 * 1024),
  ...(databaseUrl ? { DATABASE_URL: databaseUrl } : {}),
});
fs.mkdirSync(path.join(dataDir, "models"));
// Run creation only checks that the base model exists; nothing trains or loads it here.
fs.writeFileSync(path.join(dataDir, "models", "m.gguf"), "");
const core = await createCore(config);
for (const seed of config.apiKeys) await core.keys.ensure(seed.key, seed.userId);
const app = await buildApp(core);
await app.listen({ port: 0, host: "127.0.0.1" });

const bare = Fastify({ logger: false });
bare.get("/bare/:id", async (request) => ({ id: (request.params as { id: string }).id, status: "READY" }));
bare.post("/bare", async (request) => ({ id: "x", name: (request.body as { name: string }).name }));
await bare.listen({ port: 0, host: "127.0.0.1" });

const portOf = (address: ReturnType<typeof app.server.address>) =>
  typeof address === "object" && address ? address.port : 0;
process.send?.({ conduit: portOf(app.server.address()), bare: portOf(bare.server.address()) });
process.on("message", async (message) => {
  if (message === "stop") {
    await app.close();
    await bare.close();
    fs.rmSync(dataDir, { recursive: true, force: true });
    if (process.env.DATABASE_URL)
      await withClient(process.env.DATABASE_URL, (client) => client.query(`DROP SCHEMA ${schema} CASCADE`));
    process.exit(0);
  }
});
