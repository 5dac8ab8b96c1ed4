/**
 * Child process of bench/api.ts: serves Conduit on one port and a bare Fastify route on
 * another, so both are measured under the same conditions.
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import Fastify from "fastify";
import { buildApp } from "../src/api/buildApp.ts";
import { loadConfig } from "../src/config.ts";
import { createCore } from "../src/core.ts";

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-bench-"));
const config = loadConfig({
  CONDUIT_DATA_DIR: dataDir,
  CONDUIT_API_KEYS: "bench-key-0000000000:bench",
  CONDUIT_LOG_LEVEL: "silent",
  CONDUIT_MAX_UPLOAD_BYTES: String(200 * 1024 * 1024),
  ...(process.env.DATABASE_URL ? { DATABASE_URL: process.env.DATABASE_URL } : {}),
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
    process.exit(0);
  }
});
