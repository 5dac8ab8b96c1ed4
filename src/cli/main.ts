import { Command, CommanderError } from "commander";
import { loadConfig } from "../config.ts";
import { createCore } from "../core.ts";
import { startServer } from "../server.ts";

/**
 * The `conduit` command. `serve` and `keys` work on the local data dir and database directly;
 * every other command talks to a server over HTTP.
 */
const program = new Command()
  .name("conduit")
  .description("Self-hosted LLM inference and fine-tuning service")
  .showHelpAfterError()
  .exitOverride();

program
  .command("serve")
  .description("run the HTTP service (settings from CONDUIT_* environment variables, see README)")
  .action(async () => {
    await startServer(loadConfig());
  });

const keys = program.command("keys").description("manage API keys in the local database");

async function withCore<T>(fn: (core: Awaited<ReturnType<typeof createCore>>) => Promise<T>): Promise<T> {
  const core = await createCore(loadConfig());
  try {
    return await fn(core);
  } finally {
    await core.close();
  }
}

keys
  .command("create")
  .description("create a key for a user and print it (shown only once)")
  .requiredOption("-u, --user <id>", "user id the key belongs to")
  .option("-n, --name <name>", "label for the key", "cli")
  .option("--json", "print JSON")
  .action(async (opts: { user: string; name: string; json?: boolean }) => {
    if (!/^[A-Za-z0-9._@-]{1,128}$/.test(opts.user))
      throw new UsageError("user ids are letters, digits and . _ @ -");
    const { key, record } = await withCore((core) => core.keys.create(opts.user, opts.name));
    if (opts.json) console.log(JSON.stringify({ key, ...record }));
    else {
      // The key alone on stdout, so `KEY=$(conduit keys create -u me)` works.
      console.log(key);
      console.error(`key ${record.id} for user ${record.userId}: store it now, it is not shown again`);
    }
  });

keys
  .command("list")
  .description("list keys (their ids and first characters, never the keys)")
  .option("-u, --user <id>", "only this user's keys")
  .option("--json", "print JSON")
  .action(async (opts: { user?: string; json?: boolean }) => {
    const list = await withCore((core) => core.keys.list(opts.user));
    if (opts.json) console.log(JSON.stringify(list));
    else for (const k of list) console.log(`${k.id}\t${k.userId}\t${k.prefix}…\t${k.name}\t${k.createdAt}`);
  });

keys
  .command("revoke")
  .description("revoke a key by its id (or the key itself)")
  .argument("<id>", "key id from `conduit keys list`")
  .action(async (id: string) => {
    const removed = await withCore((core) => core.keys.revoke(id));
    if (!removed) throw new NotFoundError(`no key ${id}`);
    console.log(`revoked ${id}`);
  });

/** Exit codes: 0 ok, 1 failure, 2 usage error, 3 not found. */
class UsageError extends Error {}
class NotFoundError extends Error {}

try {
  await program.parseAsync(process.argv);
} catch (error) {
  if (error instanceof CommanderError) process.exit(error.exitCode === 0 ? 0 : 2);
  if (error instanceof UsageError) {
    console.error(`error: ${error.message}`);
    process.exit(2);
  }
  if (error instanceof NotFoundError) {
    console.error(`error: ${error.message}`);
    process.exit(3);
  }
  console.error(`error: ${error instanceof Error ? error.message : String(error)}`);
  process.exit(1);
}
