/**
 * Runs the tests of one layer, or all of them, with node:test:
 *
 *   node --import tsx test/lib/run.ts unit|model|http|e2e|all|pg [node --test options]
 *
 * A layer is a folder of test/ (docs/testing.md says what each holds); `all` is every `*.test.ts` under test/,
 * whatever its folder. `pg` is every file that runs against the storage backends, found by what it does: it
 * calls `backends()` (lib/helper.ts), which adds PostgreSQL when CONDUIT_TEST_DATABASE_URL is set. Files run
 * two at a time, each in its own process: much of a file's time is waiting (on servers, timers, child processes,
 * Chromium), and every test makes its own data dir, PostgreSQL schema and port. On 2 cores the whole suite takes
 * about four fifths of the time it takes one file at a time (the HTTP layer three quarters).
 */
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

const root = path.resolve(import.meta.dirname, "..");
/** The folders of test/ a test file lives in, cheapest first (docs/testing.md). */
export const layers = ["unit", "model", "http", "e2e"];

/** Every test file under test/, as a path from the repository's root, sorted. */
export function testFiles(): string[] {
  return (fs.readdirSync(root, { recursive: true }) as string[])
    .filter((file) => file.endsWith(".test.ts") && !file.startsWith(`lib${path.sep}`))
    .map((file) => path.join("test", file))
    .sort();
}

/** The test files that run against every storage backend: those that call `backends()`. */
export function storageTestFiles(): string[] {
  return testFiles().filter((file) =>
    /\bbackends\(\)/.test(fs.readFileSync(path.join(root, "..", file), "utf8")),
  );
}

function filesOf(selection: string): string[] {
  if (selection === "all") return testFiles();
  if (selection === "pg") return storageTestFiles();
  if (layers.includes(selection))
    return testFiles().filter((file) => file.startsWith(`test${path.sep}${selection}${path.sep}`));
  throw new Error(
    `unknown selection ${JSON.stringify(selection)}: one of ${[...layers, "all", "pg"].join(", ")}`,
  );
}

if (import.meta.filename === process.argv[1]) {
  const [selection = "all", ...options] = process.argv.slice(2);
  const files = filesOf(selection);
  if (selection === "pg" && !process.env.CONDUIT_TEST_DATABASE_URL)
    console.warn("CONDUIT_TEST_DATABASE_URL is not set: these files run on SQLite only");
  const result = spawnSync(
    process.execPath,
    ["--import", "tsx", "--test", "--test-concurrency=2", ...options, ...files],
    {
      cwd: path.resolve(root, ".."),
      stdio: "inherit",
    },
  );
  process.exit(result.status ?? 1);
}
