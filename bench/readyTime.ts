/**
 * How long a new user waits: a real `conduit serve` with every default (the trainer `auto` picks, its threads,
 * every run setting), an N-pair CSV uploaded, one run created with only a dataset and a base model, and the
 * time from creation to READY, with the trainer and the settings the service chose.
 *
 *   node --import tsx bench/readyTime.ts [smollm2-135m|tinyllama-1b|file.gguf] [--pairs 200]
 *
 * The pairs are the dates task of bench/quality.ts (a random-weight model learns nothing from them: time
 * only). `tinyllama-1b` is bench/makeModel.ts's random model of TinyLlama's shape (written when missing).
 */
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { createTinyModel } from "../src/model/tinyModel.ts";
import { BENCH_KEY, startConduit, call } from "./lib/conduitServer.ts";
import { datesTask } from "./lib/qualityTasks.ts";
import { modelPath, modelsDir, requireFile, type BenchModel } from "./lib/reference.ts";
import { SHAPES } from "./makeModel.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { pairs: { type: "string", default: "200" } },
});
const name = positionals[0] ?? "smollm2-135m";
let model: string;
if (name === "tinyllama-1b") {
  model = path.join(modelsDir, "tinyllama-1b-f16.gguf");
  if (!fs.existsSync(model)) await createTinyModel(model, { ...SHAPES["tinyllama-1b"], weightType: "F16" });
} else model = requireFile(name.endsWith(".gguf") ? path.resolve(name) : modelPath(name as BenchModel));

const pairs = datesTask.pairs(Number(values.pairs));
const csv = "input,output\n" + pairs.map((p) => `${p.input},${p.output}`).join("\n") + "\n";
const server = await startConduit({ base: model }, {});
try {
  const ds = await call<{ id: string }>(server, "POST", "/conduit/dataset", { name: "ready-time" });
  const upload = await fetch(`${server.url}/conduit/dataset/${ds.id}/upload?name=pairs.csv`, {
    method: "POST",
    headers: { authorization: `Bearer ${BENCH_KEY}`, "content-type": "text/csv" },
    body: csv,
  });
  if (!upload.ok) throw new Error(`upload: ${upload.status} ${await upload.text()}`);
  const loadStart = os.loadavg()[0]!;
  const created = Date.now();
  const run = await call<{ id: string }>(server, "POST", "/conduit/finetuning", {
    datasetID: ds.id,
    baseModelName: "base",
  });
  type RunView = {
    status: string;
    logs: string[];
    error: string | null;
    config: Record<string, unknown>;
    stats: Record<string, number>;
  };
  let view: RunView;
  let reported = 0;
  for (;;) {
    view = await call<RunView>(server, "GET", `/conduit/finetuning/${run.id}`);
    if (["READY", "FAILED", "CANCELLED"].includes(view.status)) break;
    if (Date.now() - reported > 30_000 && view.stats.step !== undefined) {
      reported = Date.now();
      console.log(
        `  … step ${view.stats.step}/${view.stats.totalSteps}, ${((Date.now() - created) / 1000).toFixed(0)} s, eta ${view.stats.etaSeconds?.toFixed(0)} s`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  const seconds = (Date.now() - created) / 1000;
  for (const line of view.logs.filter((l) =>
    /trainer: (torch|llama|PyTorch|loaded|LoRA)|auto settings|READY|failed/.test(l),
  ))
    console.log(`  ${line}`);
  const c = view.config;
  console.log(
    `${path.basename(model)}: ${pairs.length} pairs (CSV), run ${view.status} in ${seconds.toFixed(0)} s from creation; ` +
      `trainer ${c.trainer}, epochs ${c.epochs}, lr ${c.lr}, rank ${c.loraRank}; ${os.cpus().length} cores, load ${loadStart.toFixed(1)} → ${os.loadavg()[0]!.toFixed(1)}`,
  );
  if (view.status !== "READY") process.exitCode = 1;
} finally {
  server.stop();
}
