import assert from "node:assert/strict";
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import { test } from "node:test";
import { runStatuses } from "../../src/contract/runs.ts";
import type { RunWire } from "../../src/contract/schemas.ts";
import { layers, testFiles } from "../lib/run.ts";

/** The layer rules of docs/architecture.md hold in the code. */

const root = path.resolve(import.meta.dirname, "../..");

/**
 * A source file's layer: its folder under src/ (`api`, `train`, …), a subfolder that has a row of its own
 * (`train/core`), a top-level file (`config.ts`), or `ui`.
 */
function layerOf(file: string, rules: Map<string, Set<string>>): string | undefined {
  const relative = path.relative(root, file).split(path.sep);
  if (relative[0] === "ui" && relative[1] === "src") return "ui";
  if (relative[0] !== "src" || relative.length < 2) return undefined;
  const sublayer = `${relative[1]}/${relative[2]}`;
  return relative.length > 3 && rules.has(sublayer) ? sublayer : relative[1];
}

/**
 * Whether layer `from` may import layer `to`. Inside a folder its subfolders' rows are the rules (`train/native`
 * may import `train/core`, not `train`); from outside, a folder's rule covers its subfolders.
 */
function mayImport(rules: Map<string, Set<string>>, from: string, to: string): boolean {
  const allowed = rules.get(from)!;
  const folder = (layer: string) => layer.split("/")[0]!;
  return allowed.has(to) || (folder(from) !== folder(to) && allowed.has(folder(to)));
}

/** docs/architecture.md's table: each layer and the layers it may import. */
function documentedRules(): Map<string, Set<string>> {
  const doc = fs.readFileSync(path.join(root, "docs", "architecture.md"), "utf8");
  const name = (token: string) =>
    token === "ui/src/" ? "ui" : token.replace(/^src\//, "").replace(/\/$/, "");
  const rules = new Map<string, Set<string>>();
  for (const [, layers, imports] of doc.matchAll(/^\|\s*(`(?:src|ui)\/[^|]*)\|([^|]*)\|\s*$/gm)) {
    const allowed = new Set([...imports!.matchAll(/`([^`]+)`/g)].map(([, token]) => name(token!)));
    for (const [, layer] of layers!.matchAll(/`([^`]+)`/g)) rules.set(name(layer!), allowed);
  }
  return rules;
}

/** Every relative import of a TypeScript file under `dir`, as [importing file, imported file]. */
async function imports(dir: string): Promise<[string, string][]> {
  const edges: [string, string][] = [];
  for (const entry of await fsp.readdir(path.join(root, dir), { recursive: true, withFileTypes: true })) {
    if (!entry.isFile() || !/\.(ts|tsx)$/.test(entry.name)) continue;
    const file = path.join(entry.parentPath, entry.name);
    const text = await fsp.readFile(file, "utf8");
    for (const [, spec] of text.matchAll(/(?:from|import)\s*\(?\s*["'](\.[^"']+)["']/g))
      edges.push([file, path.resolve(path.dirname(file), spec!)]);
  }
  return edges;
}

test("every import in src/ and ui/src/ follows the layer table of docs/architecture.md", async () => {
  const rules = documentedRules();
  assert.ok(rules.size >= 10, `docs/architecture.md's layer table has ${rules.size} rows`);
  const offenders: string[] = [];
  for (const [file, target] of [...(await imports("src")), ...(await imports("ui/src"))]) {
    const from = layerOf(file, rules)!;
    const to = layerOf(target, rules);
    if (to === undefined || to === from) continue;
    if (!rules.has(from))
      offenders.push(`${path.relative(root, file)}: its layer ${from} is not in the table`);
    else if (!mayImport(rules, from, to))
      offenders.push(`${path.relative(root, file)} imports ${path.relative(root, target)} (${from} → ${to})`);
  }
  assert.deepEqual(offenders, [], "update the import, or docs/architecture.md's table if the rule changed");
});

test("each API face is a home of its own: neither face imports the other, and what they share imports neither", async () => {
  const faces = ["conduit", "openai"];
  const offenders: string[] = [];
  for (const [file, target] of await imports("src/api")) {
    const [from, to] = [file, target].map((f) =>
      path.relative(path.join(root, "src", "api"), f).split(path.sep),
    );
    if (from!.length < 2 || to!.length < 2 || from![0] === to![0] || !faces.includes(to![0]!)) continue;
    offenders.push(`${path.relative(root, file)} imports ${path.relative(root, target)}`);
  }
  assert.deepEqual(
    offenders,
    [],
    "what both faces need belongs in src/api/generation/ or the domain; a face's own code in its folder",
  );
});

test("train/'s subfolders are layers of their own: a trainer reaches neither another trainer nor what starts it", () => {
  const rules = documentedRules();
  for (const layer of ["train/libllama", "train/core", "train/native", "train/torch", "train/tracking"])
    assert.ok(rules.has(layer), `docs/architecture.md's table has a row for src/${layer}/`);
  assert.ok(
    !mayImport(rules, "train/native", "train/torch") && !mayImport(rules, "train/torch", "train/native"),
  );
  assert.ok(!mayImport(rules, "train/core", "train") && !mayImport(rules, "train/native", "train"));
  assert.ok(mayImport(rules, "train", "train/native") && mayImport(rules, "core.ts", "train/torch"));
});

test("a folder with rows for some of its subfolders has one for each: a new trainer's folder gets its rules", () => {
  const rules = documentedRules();
  const missing: string[] = [];
  for (const folder of new Set(
    [...rules.keys()].filter((layer) => layer.includes("/")).map((l) => l.split("/")[0]!),
  ))
    for (const entry of fs.readdirSync(path.join(root, "src", folder), { withFileTypes: true }))
      if (entry.isDirectory() && !rules.has(`${folder}/${entry.name}`))
        missing.push(`src/${folder}/${entry.name}/`);
  assert.deepEqual(missing, [], "add a row for each to docs/architecture.md's layer table");
});

test("the layer table has no cycle", () => {
  const rules = documentedRules();
  const visiting = new Set<string>();
  const done = new Set<string>();
  const visit = (layer: string, trail: string[]) => {
    if (done.has(layer)) return;
    assert.ok(!visiting.has(layer), `a cycle: ${[...trail, layer].join(" → ")}`);
    visiting.add(layer);
    for (const next of rules.get(layer) ?? []) visit(next, [...trail, layer]);
    visiting.delete(layer);
    done.add(layer);
  };
  for (const layer of rules.keys()) visit(layer, []);
});
test("one wire contract: only the server's entry points import src/api, and tsc knows the run statuses", async () => {
  // `npm run typecheck` fails here if a run's status widens to `string`: the directive would be unused.
  // @ts-expect-error: "NOT_A_STATUS" is not a run status
  const invalid: RunWire["status"] = "NOT_A_STATUS";
  assert.ok(!(runStatuses as readonly string[]).includes(invalid));

  const root = path.resolve(import.meta.dirname, "../..");
  // The composition roots start the HTTP server; everything else (domain, CLI, dashboard) shares src/contract.
  const entryPoints = new Set(["src/server.ts", "bench/apiServer.ts"].map((file) => path.join(root, file)));
  const offenders: string[] = [];
  for (const dir of ["src", "ui/src", "bench", "bin"]) {
    for (const entry of await fsp.readdir(path.join(root, dir), { recursive: true, withFileTypes: true })) {
      if (!entry.isFile() || !/\.(ts|tsx|js)$/.test(entry.name)) continue;
      const file = path.join(entry.parentPath, entry.name);
      if (entryPoints.has(file) || file.startsWith(path.join(root, "src", "api") + path.sep)) continue;
      const text = await fsp.readFile(file, "utf8");
      for (const [, spec] of text.matchAll(/from\s+["']([^"']+)["']/g)) {
        const target = path.resolve(path.dirname(file), spec as string);
        if (spec?.startsWith(".") && target.startsWith(path.join(root, "src", "api") + path.sep))
          offenders.push(`${path.relative(root, file)} imports ${spec}`);
      }
    }
  }
  assert.deepEqual(offenders, []);
});

test("every test file is in one of test/'s layers, so that `npm run test:<layer>` runs it", () => {
  const outside = testFiles().filter((file) => !layers.includes(file.split(path.sep)[1]!));
  assert.deepEqual(outside, [], `move these into test/${layers.join("|")}/ (docs/testing.md)`);
});
