import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

/**
 * The installed node-llama-cpp's version (its package exports no package.json: found beside its entry), which
 * what `npm run setup:trainer` and `npm run setup:adapters` compile against must match; undefined when it is not
 * installed.
 */
export function nodeLlamaCppVersion(): string | undefined {
  try {
    let dir = path.dirname(createRequire(import.meta.url).resolve("node-llama-cpp"));
    for (; dir !== path.dirname(dir); dir = path.dirname(dir)) {
      const file = path.join(dir, "package.json");
      if (!fs.existsSync(file)) continue;
      const pkg = JSON.parse(fs.readFileSync(file, "utf8")) as { name?: unknown; version?: unknown };
      if (pkg.name === "node-llama-cpp") return typeof pkg.version === "string" ? pkg.version : undefined;
    }
  } catch {
    // Not installed.
  }
  return undefined;
}
