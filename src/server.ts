import type { AddressInfo } from "node:net";
import { buildApp } from "./api/buildApp.ts";
import { trainers, trainersInOrder } from "./train/trainers.ts";
import { ConfigError, describeConfig, localUrl, type Config } from "./config.ts";
import { bootstrapKeys, createCore } from "./core.ts";
import { describeBackend } from "./engine/accelerator.ts";
import { ConduitError } from "./errors.ts";

/** Starts the service: migrations, keys, routes, then listen; closes gracefully on SIGINT/SIGTERM. */
export async function startServer(config: Config): Promise<{ close(): Promise<void>; url: string }> {
  const core = await createCore(config);
  // The configured keys exist before any request can come; the first start's own key is made once the
  // port is ours (a start that cannot listen makes none, so the key it would print is never lost).
  for (const seed of config.apiKeys) await core.keys.ensure(seed.key, seed.userId);
  const app = await buildApp(core);
  app.log.info({ config: describeConfig(config) }, "effective config");
  // Starts llama.cpp's backend now, so the log says what generation and training run on and an unmet
  // CONDUIT_GPU=cuda|vulkan stops the start instead of failing the first request.
  try {
    const accelerator = await core.engine.accelerator();
    app.log.info({ accelerator }, `compute backend: ${describeBackend(accelerator)}`);
  } catch (error) {
    await app.close();
    throw error instanceof ConduitError ? new ConfigError(error.message) : error;
  }
  // Whether the trainers that need installing are installed is known before the first run asks (importing
  // PyTorch takes seconds).
  const candidates = config.trainer === "auto" ? trainersInOrder() : [trainers[config.trainer]];
  for (const backend of candidates.filter((candidate) => candidate.setupCommand !== null))
    void backend
      .status(core.trainerHost)
      .then((status) =>
        status.available
          ? app.log.info(`${backend.name} trainer: ${status.detail ?? "available"}`)
          : config.trainer === backend.name
            ? app.log.warn(
                `${backend.name} trainer: not available, and CONDUIT_TRAINER is ${backend.name}: ${status.reason}`,
              )
            : app.log.info(
                `${backend.name} trainer: not available (${status.reason}); runs train on the others`,
              ),
      );
  // Only the server sweeps (the CLI opens the same data dir), and only leftovers.
  const sweeper = core.sweeper;
  await sweeper.sweep({ atStart: true });
  let url: string;
  try {
    url = await app.listen({ port: config.port, host: config.host });
  } catch (error) {
    await app.close();
    if ((error as NodeJS.ErrnoException).code === "EADDRINUSE")
      throw new ConfigError(
        `port ${config.port} on ${config.host} is in use (another server?); set CONDUIT_PORT to a free port`,
      );
    throw error;
  }
  // Printed once, on the first start only (the database keeps just its hash).
  const firstKey = await bootstrapKeys(core);
  const keyText = firstKey
    ? `\nNo API key existed, so one was created for user "default" (it is not shown again):\n\n  ${firstKey}\n\n` +
      `Use it as \`x-api-key: <key>\` or \`Authorization: Token <key>\` (and to sign in to the dashboard);\n` +
      `the CLI reads it from CONDUIT_API_KEY. Manage keys with \`conduit keys\`.\n`
    : "";
  const port = (app.server.address() as AddressInfo).port;
  const base = config.publicUrl?.replace(/\/+$/, "") ?? localUrl(config.host, port);
  // The banner: where to go next.
  process.stdout.write(
    `\nConduit is listening on ${localUrl(config.host, port)}\n` +
      `  Dashboard: ${base}/ui\n  API docs:  ${base}/docs\n` +
      keyText +
      "\n",
  );
  core.scheduler.start();
  // Eval runs are answered by this process's engine; the automatic before/after follows its scheduler's runs.
  core.evals.start(core.runEvents);
  sweeper.start();

  let closing: Promise<void> | undefined;
  const signals = ["SIGINT", "SIGTERM"] as const;
  const onSignal = (signal: NodeJS.Signals) => {
    app.log.info(`${signal}: shutting down`);
    void close().then(() => process.exit(0));
  };
  const close = () => {
    for (const signal of signals) process.off(signal, onSignal);
    return (closing ??= sweeper.stop().then(() => app.close()));
  };
  for (const signal of signals) process.once(signal, onSignal);
  return { close, url };
}
