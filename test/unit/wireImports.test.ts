// What the layer table of docs/architecture.md (layers.test.ts) cannot say, read from the imports: domain code
// takes domain commands, not wire schemas; routes import no route. No server, no model.
import assert from "node:assert/strict";
import fsp from "node:fs/promises";
import path from "node:path";
import { test } from "node:test";

const root = path.resolve(import.meta.dirname, "../..");
const src = path.join(root, "src");

/** Every relative import of every file under `dir`, as paths relative to `src/`, with the names it imports. */
async function importsUnder(dir: string): Promise<{ file: string; target: string; names: string[] }[]> {
  const found: { file: string; target: string; names: string[] }[] = [];
  for (const entry of await fsp.readdir(path.join(src, dir), { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || !/\.tsx?$/.test(entry.name)) continue;
    const file = path.join(entry.parentPath, entry.name);
    const text = await fsp.readFile(file, "utf8");
    for (const [, names = "", spec] of text.matchAll(
      /import\s+(?:type\s+)?([^;]*?)\s*from\s+["']([^"']+)["']/g,
    ))
      if (spec?.startsWith("."))
        found.push({
          file: path.relative(src, file),
          target: path.relative(src, path.resolve(path.dirname(file), spec)),
          names: [...names.matchAll(/\b(\w+)\b(?:\s+as\s+\w+)?/g)].map(([, name]) => name!),
        });
  }
  return found;
}

function offenders(imports: { file: string; target: string }[], refused: (target: string) => boolean) {
  return imports
    .filter(({ target }) => refused(target))
    .map(({ file, target }) => `${file} imports ${target}`);
}

test("domain code takes domain commands: no wire schema or wire type is imported under train, inference, datasets, store, domain, evals", async () => {
  const wire = (target: string) =>
    target === "contract/schemas.ts" ||
    target.startsWith("contract/generation") ||
    target === "contract/openAiFineTuning.ts" ||
    target === "contract/openAiEvals.ts" ||
    target.startsWith("api/");
  for (const dir of ["train", "inference", "datasets", "store", "domain", "evals"]) {
    const imports = await importsUnder(dir);
    assert.deepEqual(offenders(imports, wire), [], dir);
    // A module of the contract that holds vocabulary and wire shapes both: its `…Wire` types are a face's.
    const wireTypes = imports.flatMap(({ file, target, names }) =>
      names.filter((name) => /Wire$/.test(name)).map((name) => `${file} imports ${name} from ${target}`),
    );
    assert.deepEqual(wireTypes, [], dir);
  }
});

/** A module of routes: the service's (`api/routes/`), or a face's (`api/conduit/`, `api/openai/`) that is not its translator (`…Wire.ts`). */
const isRoutes = (file: string) =>
  file.startsWith("api/routes/") || (/^api\/(conduit|openai)\//.test(file) && !/wire\.ts$/i.test(file));

test("routes import no route", async () => {
  const routes = (await importsUnder("api")).filter(({ file }) => isRoutes(file));
  assert.ok(routes.length > 10, `${routes.length} imports of routes`);
  assert.deepEqual(offenders(routes, isRoutes), []);
});

test("a face's generation translators map to the domain's generation request, never through the other face", async () => {
  const translators = (await importsUnder("api")).filter(({ file }) =>
    /^api\/(conduit|openai)\/generationWire\.ts$/.test(file),
  );
  assert.equal(new Set(translators.map(({ file }) => file)).size, 2);
  assert.deepEqual(
    offenders(translators, (t) => /^api\/(conduit|openai)\//.test(t)),
    [],
  );
});

test("the contract's modules import each other without a cycle", async () => {
  const edges = new Map<string, string[]>();
  for (const { file, target } of await importsUnder("contract"))
    if (target.startsWith("contract/")) edges.set(file, [...(edges.get(file) ?? []), target]);
  const cycles: string[] = [];
  const done = new Set<string>();
  const visit = (file: string, trail: string[]) => {
    if (trail.includes(file))
      return void cycles.push([...trail.slice(trail.indexOf(file)), file].join(" → "));
    if (done.has(file)) return;
    for (const target of edges.get(file) ?? []) visit(target, [...trail, file]);
    done.add(file);
  };
  for (const file of edges.keys()) visit(file, []);
  assert.deepEqual(cycles, []);
});
