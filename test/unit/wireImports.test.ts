// What the layer table of docs/architecture.md (layers.test.ts) cannot say, read from the imports: domain code
// takes domain commands, not wire schemas; routes import no route. No server, no model.
import assert from "node:assert/strict";
import fsp from "node:fs/promises";
import path from "node:path";
import { test } from "node:test";

const root = path.resolve(import.meta.dirname, "../..");
const src = path.join(root, "src");

/** Every relative import of every file under `dir`, as paths relative to `src/`. */
async function importsUnder(dir: string): Promise<{ file: string; target: string }[]> {
  const found: { file: string; target: string }[] = [];
  for (const entry of await fsp.readdir(path.join(src, dir), { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || !/\.tsx?$/.test(entry.name)) continue;
    const file = path.join(entry.parentPath, entry.name);
    const text = await fsp.readFile(file, "utf8");
    for (const [, spec] of text.matchAll(/from\s+["']([^"']+)["']/g))
      if (spec?.startsWith("."))
        found.push({
          file: path.relative(src, file),
          target: path.relative(src, path.resolve(path.dirname(file), spec)),
        });
  }
  return found;
}

function offenders(imports: { file: string; target: string }[], refused: (target: string) => boolean) {
  return imports
    .filter(({ target }) => refused(target))
    .map(({ file, target }) => `${file} imports ${target}`);
}

test("domain code takes domain commands: no wire schema is imported under train, inference, datasets, store, domain", async () => {
  const wire = (target: string) =>
    target === "contract/schemas.ts" ||
    target.startsWith("contract/generation") ||
    target === "contract/openAiFineTuning.ts" ||
    target.startsWith("api/");
  for (const dir of ["train", "inference", "datasets", "store", "domain"])
    assert.deepEqual(offenders(await importsUnder(dir), wire), [], dir);
});

test("routes import no route", async () => {
  assert.deepEqual(
    offenders(await importsUnder("api/routes"), (t) => t.startsWith("api/routes/")),
    [],
  );
});
