/**
 * How long a new user waits: a real `conduit serve` with every default (the trainer `auto` picks, its threads,
 * every run setting), an N-pair CSV uploaded, runs created one after another with only a dataset and a base
 * model, and for each the time from creation to READY, with the trainer and the settings the service chose, and
 * the run's estimate at creation against the trainer's actual time (the first run's is a prior, the next ones'
 * are measured on the runs before them).
 *
 *   node --import tsx bench/readyTime.ts [smollm2-135m|tinyllama-1b|file.gguf] [--pairs 200] [--runs 1]
 *     [--epochs N] [--trainer auto|llama.cpp|torch]
 *
 * `--epochs` and `--trainer` leave a default for a shorter or a particular run. The pairs are the dates task of
 * bench/quality.ts (a random-weight model learns nothing from them: time only). `tinyllama-1b` is
 * bench/makeModel.ts's random model of TinyLlama's shape (written when missing).
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
  options: {
    pairs: { type: "string", default: "200" },
    runs: { type: "string", default: "1" },
    epochs: { type: "string" },
    trainer: { type: "string" },
  },
});
const name = positionals[0] ?? "smollm2-135m";
let model: string;
if (name === "tinyllama-1b") {
  model = path.join(modelsDir, "tinyllama-1b-f16.gguf");
  if (!fs.existsSync(model)) await createTinyModel(model, { ...SHAPES["tinyllama-1b"], weightType: "F16" });
} else model = requireFile(name.endsWith(".gguf") ? path.resolve(name) : modelPath(name as BenchModel));

const pairs = datesTask.pairs(Number(values.pairs));
const csv = "input,output\n" + pairs.map((p) => `${p.input},${p.output}`).join("\n") + "\n";
const server = await startConduit(
  { base: model },
  values.trainer === undefined ? {} : { CONDUIT_TRAINER: values.trainer },
);
try {
  const ds = await call<{ id: string }>(server, "POST", "/conduit/dataset", { name: "ready-time" });
  const upload = await fetch(`${server.url}/conduit/dataset/${ds.id}/upload?name=pairs.csv`, {
    method: "POST",
    headers: { authorization: `Bearer ${BENCH_KEY}`, "content-type": "text/csv" },
    body: csv,
  });
  if (!upload.ok) throw new Error(`upload: ${upload.status} ${await upload.text()}`);
  type Estimate = {
    basis: string;
    seconds: number;
    measuredRuns: number;
    planned: { seconds: number; steps: number; tokens: number; tokensPerSecond: number } | null;
  };
  type RunView = {
    id: string;
    status: string;
    logs: string[];
    error: string | null;
    config: Record<string, unknown>;
    stats: Record<string, number> & { final?: Record<string, number> };
    estimate: Estimate | null;
  };
  for (let round = 1; round <= Number(values.runs); round++) {
    const loadStart = os.loadavg()[0]!;
    const created = Date.now();
    const run = await call<RunView>(server, "POST", "/conduit/finetuning", {
      datasetID: ds.id,
      baseModelName: "base",
      ...(values.epochs === undefined ? {} : { epochs: Number(values.epochs) }),
    });
    const planned = run.estimate?.planned;
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
    if (round === 1)
      for (const line of view.logs.filter((l) =>
        /trainer: (torch|llama|PyTorch|loaded|LoRA)|auto settings|READY|failed/.test(l),
      ))
        console.log(`  ${line}`);
    const c = view.config;
    console.log(
      `${path.basename(model)}: ${pairs.length} pairs (CSV), run ${round} ${view.status} in ${seconds.toFixed(0)} s from creation; ` +
        `trainer ${c.trainer}, epochs ${c.epochs}, lr ${c.lr}, rank ${c.loraRank}; ${os.cpus().length} cores, load ${loadStart.toFixed(1)} → ${os.loadavg()[0]!.toFixed(1)}`,
    );
    const final = view.stats.final;
    if (planned && final)
      console.log(
        `  estimate at creation ${planned.seconds.toFixed(1)} s (${run.estimate?.basis}` +
          `${run.estimate?.basis === "measured" ? ` on ${run.estimate.measuredRuns} earlier` : ""}: ${planned.steps} steps, ` +
          `${planned.tokens} tokens at ${planned.tokensPerSecond.toFixed(1)} tok/s); the run took ${final.runSeconds?.toFixed(1)} s ` +
          `(${final.steps} steps, ${final.trainTokens} tokens at ${final.tokensPerSecond?.toFixed(1)} tok/s; the trainer ` +
          `${final.elapsedSeconds?.toFixed(1)} s): ${(planned.seconds / (final.runSeconds ?? Number.NaN)).toFixed(2)}× the actual`,
      );
    if (view.status !== "READY") {
      process.exitCode = 1;
      break;
    }
  }
} finally {
  server.stop();
}
