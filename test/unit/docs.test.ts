import assert from "node:assert/strict";
import fs from "node:fs";
import { test } from "node:test";
import { settings } from "../../src/config.ts";
import { errorCatalog } from "../../src/errors.ts";

const read = (file: string) => fs.readFileSync(new URL(`../../${file}`, import.meta.url), "utf8");
const readme = read("README.md");

test("every error code is documented in docs/api.md", () => {
  const api = read("docs/api.md");
  for (const code of Object.keys(errorCatalog))
    assert.match(api, new RegExp(`^\\|\\s*\`${code}\`\\s*\\|`, "m"), `docs/api.md documents ${code}`);
});

test("every setting is documented in docs/settings.md", () => {
  const doc = read("docs/settings.md");
  for (const setting of Object.values(settings))
    assert.match(
      doc,
      new RegExp(`^\\|\\s*\`${setting.env}\`\\s*\\|`, "m"),
      `docs/settings.md documents ${setting.env}`,
    );
});

test(".ci/run calls the README's test command", () => {
  const ci = read(".ci/run");
  assert.ok(readme.includes("npm install && npm test"));
  assert.ok(ci.includes("npm install && npm test"));
});

test("the README fits on a few screens", () => {
  const lines = readme.split("\n").length;
  assert.ok(lines <= 250, `README.md has ${lines} lines; the reference belongs in docs/`);
});

/** GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens. */
const anchor = (heading: string) =>
  heading
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, "")
    .replace(/ /g, "-");

test("every relative link in the README and docs/ names a file and heading that exist", () => {
  const docs = fs.readdirSync(new URL("../../docs/", import.meta.url)).map((name) => `docs/${name}`);
  for (const file of ["README.md", "bench/README.md", ...docs]) {
    const base = new URL(`../../${file}`, import.meta.url);
    for (const [, target, fragment] of read(file).matchAll(/\]\(([^)#\s]*)(?:#([^)\s]*))?\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue;
      const url = target ? new URL(target, base) : base;
      assert.ok(fs.existsSync(url), `${file} links to ${target}, which does not exist`);
      if (!fragment || !url.pathname.endsWith(".md")) continue;
      const headings = [...fs.readFileSync(url, "utf8").matchAll(/^#+ (.+)$/gm)].map(([, h]) => anchor(h!));
      assert.ok(
        headings.includes(fragment),
        `${file} links to ${target}#${fragment}, a heading that does not exist`,
      );
    }
  }
});

test("the docs state what is true now: no dates, commit hashes or session notes", () => {
  const docs = fs.readdirSync(new URL("../../docs/", import.meta.url)).map((name) => `docs/${name}`);
  const notebook = [
    /\bthis session\b/i,
    /\bStop \d+\b/,
    /\b20\d\d-\d\d-\d\d\b/,
    /`(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}`/,
  ];
  for (const file of ["README.md", "bench/README.md", ...docs]) {
    const text = read(file);
    for (const pattern of notebook) {
      const found = pattern.exec(text);
      assert.equal(found, null, `${file} holds ${found?.[0]}: history belongs in git log`);
    }
  }
});

test("reference docs say what the product does: measurements tied to one machine live in bench/README.md", () => {
  const docs = fs.readdirSync(new URL("../../docs/", import.meta.url)).map((name) => `docs/${name}`);
  const measurement = [
    // A machine: its cores, its CPU or GPU model, how loaded it was.
    /\b\d+-core\b/,
    /\bon (?:an? )?(?:idle |busy )?\d+ (?:idle |busy )?cores\b/,
    /\b(?:Intel Xeon|AMD EPYC|Zen \d|NVIDIA [A-Z]\d+|H100|H200)\b/,
    /\b(?:at |shared at |machine's )?load (?:average )?\d+(?:\.\d+)?\b/,
    // A speed in numbers: `627 tok/s`, `23.4 tokens per CPU-second`, and a table with a column of them.
    /\d[\d,.]*\s*(?:tok|tokens)\/s\b/,
    /\d[\d,.]*\s*(?:tok|tokens) per CPU-second\b/,
    /^\|.*\b(?:tok\/s|tokens per CPU-second)\b.*\|$/m,
  ];
  const found: string[] = [];
  for (const file of ["README.md", ...docs])
    for (const line of read(file).split("\n"))
      for (const pattern of measurement) if (pattern.test(line)) found.push(`${file}: ${line.slice(0, 120)}`);
  // The settings' descriptions are reference text too: the effective config and the docs show them.
  for (const setting of Object.values(settings))
    for (const pattern of measurement)
      if (pattern.test(setting.description))
        found.push(`${setting.env}: ${setting.description.slice(0, 120)}`);
  assert.deepEqual(found, [], "move these to bench/README.md and link it");
});
