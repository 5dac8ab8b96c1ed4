import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test } from "node:test";
import { describeBackend } from "../../src/engine/accelerator.ts";
import { mixedAdapterBuildStatus } from "../../src/engine/mixedAdapterBuild.ts";
import { nodeLlamaCppVersion } from "../../src/model/nodeLlamaCpp.ts";

/** Whether the engine takes the mixed-adapter build (`npm run setup:adapters`): what it checks before loading it. */

function buildDir(info: Record<string, unknown> | undefined, addon = true): string {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-mixed-build-"));
  if (info) fs.writeFileSync(path.join(dir, "build.json"), JSON.stringify(info));
  if (addon) fs.writeFileSync(path.join(dir, "llama-addon.node"), "");
  return dir;
}

test("the mixed-adapter build is used only when complete and made for the installed node-llama-cpp", () => {
  const version = nodeLlamaCppVersion();
  assert.ok(version, "node-llama-cpp is installed");
  const good = buildDir({ nodeLlamaCpp: version, llamaCpp: "de3ff815ea7d0000", addon: "llama-addon.node" });
  const status = mixedAdapterBuildStatus("auto", good);
  assert.deepEqual(status, {
    available: true,
    dir: good,
    nodeLlamaCpp: version,
    llamaCpp: "de3ff815ea7d0000",
  });

  const grouped = mixedAdapterBuildStatus("grouped", good);
  assert.deepEqual(grouped, { available: false, reason: "CONDUIT_ADAPTER_BATCHING is grouped" });

  const missing = mixedAdapterBuildStatus("auto", buildDir(undefined));
  assert.match(
    missing.available ? "" : missing.reason,
    /no mixed-adapter build \(npm run setup:adapters makes one\)/,
  );

  const old = mixedAdapterBuildStatus("auto", buildDir({ nodeLlamaCpp: "3.0.0", addon: "llama-addon.node" }));
  assert.match(
    old.available ? "" : old.reason,
    new RegExp(
      `compiled for node-llama-cpp 3\\.0\\.0, and ${version!.replace(/\./g, "\\.")} is installed: run npm run setup:adapters again`,
    ),
  );

  const incomplete = mixedAdapterBuildStatus(
    "auto",
    buildDir({ nodeLlamaCpp: version, addon: "llama-addon.node" }, false),
  );
  assert.match(incomplete.available ? "" : incomplete.reason, /is incomplete: run npm run setup:adapters/);
});

test("the start log says how adapters share a decode and why", () => {
  const cpu = { setting: "auto" as const, backend: "cpu" as const, devices: [], gpuLayers: 0 as const };
  assert.equal(
    describeBackend({ ...cpu, adapters: { batching: "per-sequence", build: "/x (node-llama-cpp 3.22.1)" } }),
    "cpu (CONDUIT_GPU=auto found no usable GPU); adapters: one decode for any mix of adapters (mixed-adapter build /x (node-llama-cpp 3.22.1))",
  );
  assert.equal(
    describeBackend({
      ...cpu,
      setting: "off",
      adapters: { batching: "grouped", reason: "CONDUIT_ADAPTER_BATCHING is grouped" },
    }),
    "cpu; adapters: one decode per adapter in use (CONDUIT_ADAPTER_BATCHING is grouped)",
  );
});
