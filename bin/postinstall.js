#!/usr/bin/env node
// npm's postinstall: on Node.js 24 under Linux, bin/sqlite-node24.sh makes sure better-sqlite3 is built against
// headers that do not make it abort the process (see bin/setup-node.sh). Nothing to do anywhere else.
import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";

if (process.versions.node.split(".")[0] === "24" && process.platform === "linux") {
  const script = fileURLToPath(new URL("./sqlite-node24.sh", import.meta.url));
  const { status } = spawnSync("bash", [script], { stdio: "inherit" });
  process.exit(status ?? 1);
}
