import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import type { EvalRunWire } from "../../src/contract/evals.ts";
import { cliServer, conduit } from "../lib/cli.ts";

test("conduit evals run: a local file scored on two models, a summary table, --json, a bad grader refused", async (t) => {
  const { environment, core, env } = await cliServer(t);
  core.evals.start(core.runEvents);
  const file = path.join(environment.dataDir, "pairs.jsonl");
  fs.writeFileSync(
    file,
    Array.from({ length: 6 }, (_, i) => JSON.stringify({ input: `q${i}`, output: `a${i}` })).join("\n"),
  );

  const human = await conduit(
    env,
    "evals",
    "run",
    "--file",
    file,
    "--models",
    "tiny,tiny",
    "--grader",
    "exact,similarity",
    "--max-tokens",
    "4",
  );
  assert.equal(human.code, 0, human.stderr);
  const lines = human.stdout.trim().split("\n");
  assert.match(lines[0] ?? "", /^eval eval_\w+, run evalrun_\w+: COMPLETED$/);
  assert.match(lines[1] ?? "", /^model\s+exact_match\s+similarity\s+tokens out\s+s\/answer$/);
  assert.equal(lines.length, 4);
  assert.match(lines[2] ?? "", /^tiny\s+0\/6 \(0\.00\)\s+0\.\d{3}\s+\d+\s+\d+\.\d\d$/);
  // Without a terminal, progress is a line per tenth on stderr (as the events come: at least the first and last).
  assert.match(human.stderr, /^0\/12 answers\n(.*\n)*12\/12 answers\n$/);

  const json = await conduit(
    env,
    "--json",
    "evals",
    "run",
    "--file",
    file,
    "--models",
    "tiny",
    "--max-tokens",
    "4",
  );
  assert.equal(json.code, 0, json.stderr);
  const out = JSON.parse(json.stdout) as { run: EvalRunWire };
  assert.equal(out.run.status, "COMPLETED");
  assert.equal(out.run.progress.total, 6);
  assert.deepEqual(
    out.run.results[0]?.graders.map((g) => g.name),
    ["exact_match", "similarity"],
  );

  const bad = await conduit(env, "evals", "run", "--file", file, "--models", "tiny", "--grader", "bleu");
  assert.equal(bad.code, 2);
  assert.match(bad.stderr, /--grader bleu: one of exact/);
  const missing = await conduit(env, "evals", "run", "--file", file, "--models", "nope");
  assert.equal(missing.code, 3, missing.stderr);
  assert.match(missing.stderr, /model "nope" not found/);
});
