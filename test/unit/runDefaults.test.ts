import assert from "node:assert/strict";
import { test } from "node:test";
import { LORA_TARGETS } from "../../src/contract/runs.ts";
import { RunConfigFields } from "../../src/contract/schemas.ts";
import { runDefaults } from "../../src/domain/runs.ts";
import { trainers } from "../../src/train/trainers.ts";

/** The request schema documents what the run service applies: the domain's defaults and each trainer's targets. */

const described = (field: keyof typeof RunConfigFields) =>
  String((RunConfigFields[field] as { description?: unknown }).description);

test("the request schema states the defaults the run service applies", () => {
  assert.match(described("method"), new RegExp(`Defaults to \`${runDefaults.method}\``));
  assert.match(described("loraAlpha"), new RegExp(`Defaults to \`${runDefaults.loraAlphaPerRank}\` ×`));
  assert.match(described("complexity"), new RegExp(`Defaults to \`${runDefaults.complexity}\``));
  assert.match(described("beta"), new RegExp(`Defaults to \`${runDefaults.beta}\``));
});

test("the request schema names the LoRA targets each trainer cannot train", () => {
  const targets = described("loraTargets");
  for (const backend of Object.values(trainers)) {
    const missing = LORA_TARGETS.filter((target) => !backend.loraTargets.includes(target));
    for (const target of missing)
      assert.ok(targets.includes(`\`${target}\``), `${backend.name} cannot train ${target}: ${targets}`);
  }
  assert.deepEqual(
    [...trainers.torch.loraTargets],
    [...LORA_TARGETS],
    "the torch trainer trains every target",
  );
});
