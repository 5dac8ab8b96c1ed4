import { buildApp } from "./api/buildApp.ts";
import { describeConfig, type Config } from "./config.ts";
import { bootstrapKeys, createCore } from "./core.ts";

/** Starts the service: migrations, keys, routes, then listen; closes gracefully on SIGINT/SIGTERM. */
export async function startServer(config: Config): Promise<{ close(): Promise<void>; url: string }> {
  const core = await createCore(config);
  const firstKey = await bootstrapKeys(core);
  const app = await buildApp(core);
  app.log.info({ config: describeConfig(config) }, "effective config");
  if (firstKey) {
    // Printed once, on the first start only: the database keeps just its hash.
    process.stdout.write(
      `\nNo API key existed, so one was created for user "default" (it is not shown again):\n\n  ${firstKey}\n\n` +
        `Use it as \`x-api-key: <key>\` or \`Authorization: Token <key>\`; manage keys with \`conduit keys\`.\n\n`,
    );
  }
  const url = await app.listen({ port: config.port, host: config.host });
  core.scheduler.start();

  let closing: Promise<void> | undefined;
  const close = () => (closing ??= app.close());
  for (const signal of ["SIGINT", "SIGTERM"] as const)
    process.once(signal, () => {
      app.log.info(`${signal}: shutting down`);
      void close().then(() => process.exit(0));
    });
  return { close, url };
}
