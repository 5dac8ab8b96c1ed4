/**
 * How long a new user waits: a real `conduit serve` with every default (the trainer `auto` picks, its threads,
 * every run setting), an N-pair CSV uploaded, runs created one after another with only a dataset and a base
 * model, and for each the time from creation to READY, with the trainer and the settings the service chose, and
 * the run's estimate at creation against the trainer's actual time (the first run's is a prior, the next ones'
 * are measured on the runs before them).
 *
 *   node --import tsx bench/readyTime.ts [smollm2-135m|tinyllama-1b|file.gguf] [--pairs 200] [--runs 1]
 *     [--epochs N] [--trainer auto|llama.cpp|torch] [--busy [--chat-model smollm2-135m]]
 *
 * For each run it also prints the peak memory of the server and its trainer (every process of the server's tree,
 * RSS sampled twice a second) and the run's own before/after on its held-out pairs (the automatic evaluation,
 * waited for). `--busy`: another user chats meanwhile, 4 streams of 32-token answers on `--chat-model`: 30 s of
 * that chat alone first, then through the run and its evaluation; its per-answer p50/p99 are printed for both.
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

/** The peak RSS of a process and all its descendants, sampled every 500 ms from /proc until `stop`. */
function peakMemory(root: number): { stop(): number } {
  let peak = 0;
  const sample = () => {
    const children = new Map<number, number[]>();
    const rss = new Map<number, number>();
    for (const entry of fs.readdirSync("/proc")) {
      if (!/^\d+$/.test(entry)) continue;
      try {
        const stat = fs.readFileSync(`/proc/${entry}/stat`, "utf8");
        const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
        const parent = Number(fields[1]);
        children.set(parent, [...(children.get(parent) ?? []), Number(entry)]);
        rss.set(Number(entry), Number(fields[21]) * 4096);
      } catch {
        // Gone meanwhile.
      }
    }
    let total = 0;
    for (const queue = [root]; queue.length > 0;) {
      const pid = queue.pop()!;
      total += rss.get(pid) ?? 0;
      queue.push(...(children.get(pid) ?? []));
    }
    peak = Math.max(peak, total);
  };
  const timer = setInterval(sample, 500);
  sample();
  return {
    stop() {
      clearInterval(timer);
      return peak;
    },
  };
}

/** Another user's chat: 4 streams, each asking for a 32-token answer again and again; answer times per phase. */
function chatLoad(url: string) {
  let stopped = false;
  let times: number[] = [];
  const phases: { name: string; times: number[] }[] = [];
  const stream = async () => {
    while (!stopped) {
      const started = performance.now();
      const response = await fetch(`${url}/conduit/v1/chat`, {
        method: "POST",
        headers: { authorization: `Bearer ${BENCH_KEY}`, "content-type": "application/json" },
        body: JSON.stringify({
          model: "chat",
          prompt: "Write a short note about the sea.",
          max_tokens: 32,
          temperature: 0,
        }),
      });
      await response.text();
      if (response.ok) times.push(performance.now() - started);
    }
  };
  const streams = Array.from({ length: 4 }, stream);
  const percentile = (values: number[], p: number) =>
    [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(p * values.length))] ?? NaN;
  return {
    mark(name: string) {
      phases.push({ name, times });
      times = [];
    },
    async stop() {
      stopped = true;
      await Promise.all(streams);
    },
    report: () =>
      phases
        .map(
          ({ name, times: t }) =>
            `${name}: ${t.length} answers, p50 ${percentile(t, 0.5).toFixed(0)} ms, p99 ${percentile(t, 0.99).toFixed(0)} ms`,
        )
        .join("; "),
  };
}

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    pairs: { type: "string", default: "200" },
    runs: { type: "string", default: "1" },
    epochs: { type: "string" },
    trainer: { type: "string" },
    busy: { type: "boolean", default: false },
    "chat-model": { type: "string", default: "smollm2-135m" },
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
const chatModel = values.busy ? requireFile(modelPath(values["chat-model"] as BenchModel)) : undefined;
const server = await startConduit(
  { base: model, ...(chatModel ? { chat: chatModel } : {}) },
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
    planned: {
      seconds: number;
      steps: number;
      tokens: number;
      tokensPerSecond: number;
      cpuShare?: number;
    } | null;
  };
  type RunView = {
    id: string;
    status: string;
    logs: string[];
    error: string | null;
    config: Record<string, unknown>;
    stats: Record<string, number> & { final?: Record<string, number> };
    estimate: Estimate | null;
    evaluation: { status: string; summary: string } | null;
  };
  for (let round = 1; round <= Number(values.runs); round++) {
    const chat = values.busy ? chatLoad(server.url) : undefined;
    if (chat) {
      await new Promise((resolve) => setTimeout(resolve, 30_000));
      chat.mark("alone");
    }
    const memory = peakMemory(server.child.pid!);
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
    // The automatic before/after (base vs fine-tune on the held-out pairs), queued when the run became READY.
    let evaluation: RunView["evaluation"] = null;
    for (const until = Date.now() + 3_600_000; view.status === "READY" && Date.now() < until;) {
      evaluation = (await call<RunView>(server, "GET", `/conduit/finetuning/${run.id}`)).evaluation;
      if (evaluation && !["QUEUED", "RUNNING"].includes(evaluation.status)) break;
      await new Promise((resolve) => setTimeout(resolve, 2000));
    }
    const evaluated = (Date.now() - created) / 1000;
    const peak = memory.stop();
    chat?.mark("with the run");
    await chat?.stop();
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
          `${final.elapsedSeconds?.toFixed(1)} s): ${(planned.seconds / (final.runSeconds ?? Number.NaN)).toFixed(2)}× the actual` +
          // What the same plan said before it counted a busy machine: the cores to itself.
          ((planned.cpuShare ?? 1) < 1
            ? ` (CPU share ${planned.cpuShare!.toFixed(2)}; as on an idle machine ` +
              `${((planned.seconds * planned.cpuShare!) / (final.runSeconds ?? Number.NaN)).toFixed(2)}×)`
            : ""),
      );
    console.log(
      `  peak memory of the server and its trainer ${(peak / 2 ** 30).toFixed(2)} GiB; before/after: ${evaluation?.summary ?? "none"} (done ${evaluated.toFixed(0)} s from creation)`,
    );
    if (chat)
      console.log(`  the other user's chat (4 streams, ${path.basename(chatModel!)}): ${chat.report()}`);
    if (view.status !== "READY") {
      process.exitCode = 1;
      break;
    }
  }
} finally {
  server.stop();
}
