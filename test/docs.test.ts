import assert from "node:assert/strict";
import fs from "node:fs";
import { test } from "node:test";
import { settings } from "../src/config.ts";
import { errorCatalog } from "../src/errors.ts";

const readme = fs.readFileSync(new URL("../README.md", import.meta.url), "utf8");

test("every error code is documented in the README", () => {
  for (const code of Object.keys(errorCatalog))
    assert.match(readme, new RegExp(`^\\|\\s*\`${code}\`\\s*\\|`, "m"), `README documents ${code}`);
});

test("every setting is documented in the README", () => {
  for (const setting of Object.values(settings))
    assert.match(
      readme,
      new RegExp(`^\\|\\s*\`${setting.env}\`\\s*\\|`, "m"),
      `README documents ${setting.env}`,
    );
});

test(".ci/run calls the README's test command", () => {
  const ci = fs.readFileSync(new URL("../.ci/run", import.meta.url), "utf8");
  assert.ok(readme.includes("npm install && npm test"));
  assert.ok(ci.includes("npm install && npm test"));
});
