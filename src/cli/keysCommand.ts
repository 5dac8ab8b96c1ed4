import type { Command } from "commander";
import type { KeysCore } from "../core.ts";
import { CliError, exitCodes, table, type CliContext } from "./context.ts";

/** Keys live in the local database, so these commands open it directly (no server needed). */
export function keysCommand(program: Command, ctx: CliContext): void {
  const keys = program
    .command("keys")
    .description("manage API keys in the local database (CONDUIT_DATA_DIR / DATABASE_URL)");

  async function withCore<T>(fn: (core: KeysCore) => Promise<T>): Promise<T> {
    const { createKeysCore } = await import("../core.ts");
    const core = await createKeysCore(ctx.config);
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
    .action(async (opts: { user: string; name: string }) => {
      if (!/^[A-Za-z0-9._@-]{1,128}$/.test(opts.user))
        throw new CliError("user ids are 1–128 letters, digits and . _ @ -", exitCodes.usage);
      const { key, record } = await withCore((core) => core.keys.create(opts.user, opts.name));
      ctx.print({ key, ...record }, () => {
        // The key alone on stdout, so `KEY=$(conduit keys create -u me)` works.
        console.log(key);
        console.error(`key ${record.id} for user ${record.userId}: store it now, it is not shown again`);
      });
    });

  keys
    .command("list")
    .description("list keys (ids and first characters, never the keys)")
    .option("-u, --user <id>", "only this user's keys")
    .action(async (opts: { user?: string }) => {
      const list = await withCore((core) => core.keys.list(opts.user));
      ctx.print(list, () =>
        console.log(
          table([
            ["ID", "USER", "PREFIX", "NAME", "CREATED"],
            ...list.map((k) => [k.id, k.userId, `${k.prefix}…`, k.name, k.createdAt]),
          ]),
        ),
      );
    });

  keys
    .command("revoke")
    .description("revoke a key by its id (or the key itself)")
    .argument("<id>", "key id from `conduit keys list`")
    .action(async (id: string) => {
      const removed = await withCore((core) => core.keys.revoke(id));
      if (!removed) throw new CliError(`no key ${id}`, exitCodes.notFound);
      ctx.print({ message: "SUCCESS" }, () => console.log(`revoked ${id}`));
    });
}
