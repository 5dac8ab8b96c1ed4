import { execFile } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { promisify } from "node:util";
import pg from "pg";
import type { Cleanup } from "./helper.ts";
import { freePort } from "./wait.ts";

const run = promisify(execFile);

/** A PostgreSQL server of a test's own, to stop, start and cut off at will (the shared one is not the test's). */
export interface PrivatePostgres {
  /** Its connection string (database `postgres`, trust auth). */
  url: string;
  /** Ends every connection but the caller's (`pg_terminate_backend`); returns how many it ended. */
  terminateAll(): Promise<number>;
  /** A fast shutdown: every connection is ended, and new ones are refused until {@link start}. */
  stop(): Promise<void>;
  start(): Promise<void>;
}

/** PostgreSQL's server programs (`initdb`, `pg_ctl`), from Debian's layout or the PATH. */
function serverBin(): string | undefined {
  const root = "/usr/lib/postgresql";
  const versions = fs.existsSync(root) ? fs.readdirSync(root).sort((a, b) => Number(b) - Number(a)) : [];
  for (const version of versions) {
    const dir = path.join(root, version, "bin");
    if (fs.existsSync(path.join(dir, "initdb")) && fs.existsSync(path.join(dir, "pg_ctl"))) return dir;
  }
  return undefined;
}

/**
 * Makes and starts a throwaway PostgreSQL cluster (removed after the test), or says why it cannot: no server
 * programs, or running as root with no `postgres` user to run them as (PostgreSQL refuses root).
 */
export async function privatePostgres(t: Cleanup): Promise<PrivatePostgres | string> {
  const bin = serverBin();
  if (!bin) return "PostgreSQL's server programs (initdb, pg_ctl) are not installed";
  const asRoot = process.getuid?.() === 0;
  if (
    asRoot &&
    !(await run("id", ["-u", "postgres"]).then(
      () => true,
      () => false,
    ))
  )
    return "running as root, and there is no postgres user to run PostgreSQL as";
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-pg-"));
  const data = path.join(dir, "data");
  const port = await freePort();
  const as = (program: string, args: string[]) =>
    asRoot
      ? run("runuser", ["-u", "postgres", "--", path.join(bin, program), ...args])
      : run(path.join(bin, program), args);
  if (asRoot) await run("chown", ["postgres", dir]);
  await as("initdb", ["-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"]);
  const options = `-p ${port} -k ${dir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off`;
  const start = async () => {
    await as("pg_ctl", ["-D", data, "-o", options, "-l", path.join(dir, "log"), "-w", "start"]);
  };
  const stop = async () => {
    await as("pg_ctl", ["-D", data, "-m", "fast", "-w", "stop"]);
  };
  await start();
  t.after(async () => {
    await stop().catch(() => undefined);
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const url = `postgres://postgres@127.0.0.1:${port}/postgres`;
  return {
    url,
    start,
    stop,
    async terminateAll() {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        const result = await client.query(
          "select pg_terminate_backend(pid) from pg_stat_activity where pid <> pg_backend_pid() and backend_type = 'client backend'",
        );
        return result.rowCount ?? 0;
      } finally {
        await client.end();
      }
    },
  };
}
