/**
 * What reading a model into memory costs against mapping it (node-llama-cpp's `useMmap`): the engine reads
 * (`useMmap: false`) so that a model file replaced or truncated in place cannot end the server with SIGBUS.
 * Each variant runs in a fresh child process, alternating, on the same file (warm in the page cache: the
 * second load of a model is the common case, and cold loads depend on the disk):
 *
 * - load: `llama.loadModel` until it resolves, wall and CPU time (the CPU time of the process, which other
 *   work on shared cores disturbs less);
 * - first answer: a context and a 16-token greedy completion right after the load (a mapped model reads its
 *   pages here, on first use), wall and CPU time;
 * - resident memory the load added (anonymous memory and file pages), what it is after the answer, and the
 *   process's peak (VmHWM).
 *
 *   node --import tsx bench/modelLoad.ts [model.gguf ...] [--runs 3]
 *
 * Defaults to stories260K and SmolLM2-135M from `.cache/models` (bash bench/setup.sh), those present.
 */
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { parseArgs } from "node:util";
import { getLlama, LlamaCompletion, LlamaLogLevel } from "node-llama-cpp";
import { availableModels, modelPath } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { runs: { type: "string", default: "3" }, child: { type: "string" } },
});

interface Sample {
  beforeLoad: Rss;
  loadMs: number;
  loadCpuMs: number;
  firstAnswerMs: number;
  firstAnswerCpuMs: number;
  afterLoad: Rss;
  afterAnswer: Rss;
  peakMiB: number;
}
interface Rss {
  anonMiB: number;
  fileMiB: number;
}

function status(): Record<string, number> {
  const out: Record<string, number> = {};
  for (const line of fs.readFileSync("/proc/self/status", "utf8").split("\n")) {
    const m = /^(\w+):\s+(\d+) kB/.exec(line);
    if (m) out[m[1]!] = Number(m[2]) / 1024;
  }
  return out;
}
const rss = (): Rss => {
  const s = status();
  return { anonMiB: s.RssAnon ?? NaN, fileMiB: s.RssFile ?? NaN };
};

if (values.child !== undefined) {
  const [file, mode] = [positionals[0]!, values.child];
  const llama = await getLlama({ gpu: false, build: "never", maxThreads: 0, logLevel: LlamaLogLevel.error });
  const beforeLoad = rss();
  const cpuMs = () => {
    const { user, system } = process.cpuUsage();
    return (user + system) / 1000;
  };
  const t0 = performance.now();
  const c0 = cpuMs();
  const model = await llama.loadModel({ modelPath: file, gpuLayers: 0, useMmap: mode === "mmap" });
  const loadMs = performance.now() - t0;
  const loadCpuMs = cpuMs() - c0;
  const afterLoad = rss();
  const t1 = performance.now();
  const c1 = cpuMs();
  const context = await model.createContext({ contextSize: 256, threads: 1 });
  await new LlamaCompletion({ contextSequence: context.getSequence() }).generateCompletion(
    "Once upon a time",
    {
      maxTokens: 16,
      temperature: 0,
    },
  );
  const sample: Sample = {
    beforeLoad,
    loadMs,
    loadCpuMs,
    firstAnswerMs: performance.now() - t1,
    firstAnswerCpuMs: cpuMs() - c1,
    afterLoad,
    afterAnswer: rss(),
    peakMiB: status().VmHWM ?? NaN,
  };
  process.stdout.write(JSON.stringify(sample));
  process.exit(0);
}

const files = positionals.length > 0 ? positionals : availableModels().map((m) => modelPath(m));
const runs = Number(values.runs);
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const f = (x: number) => x.toFixed(x < 10 ? 1 : 0);

console.log(
  "| model | file MiB | weights | load ms (CPU ms) | first answer ms (CPU ms) | RSS added by the load: anon + file = total MiB | " +
    "added after the answer MiB | peak RSS MiB |",
);
console.log("|---|---|---|---|---|---|---|---|");
for (const file of files) {
  const samples: Record<string, Sample[]> = { mmap: [], read: [] };
  for (let i = 0; i < runs; i++)
    for (const mode of i % 2 === 0 ? ["mmap", "read"] : ["read", "mmap"]) {
      const out = execFileSync(
        process.execPath,
        ["--import", "tsx", import.meta.filename, "--child", mode, file],
        { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] },
      );
      samples[mode]!.push(JSON.parse(out) as Sample);
    }
  const mib = fs.statSync(file).size / 2 ** 20;
  for (const mode of ["mmap", "read"]) {
    const s = samples[mode]!;
    const m = (pick: (x: Sample) => number) => f(median(s.map(pick)));
    const added = (x: Sample, at: Rss) =>
      at.anonMiB + at.fileMiB - x.beforeLoad.anonMiB - x.beforeLoad.fileMiB;
    console.log(
      `| ${path.basename(file)} | ${f(mib)} | ${mode === "mmap" ? "mapped (`useMmap: true`)" : "read (`useMmap: false`)"} ` +
        `| ${m((x) => x.loadMs)} (${m((x) => x.loadCpuMs)}) | ${m((x) => x.firstAnswerMs)} (${m((x) => x.firstAnswerCpuMs)}) ` +
        `| ${m((x) => x.afterLoad.anonMiB - x.beforeLoad.anonMiB)} + ${m((x) => x.afterLoad.fileMiB - x.beforeLoad.fileMiB)} = ${m((x) => added(x, x.afterLoad))} ` +
        `| ${m((x) => added(x, x.afterAnswer))} | ${m((x) => x.peakMiB)} |`,
    );
  }
}
console.log(
  `\nmedians of ${runs} runs each, alternating, one fresh process per run; file warm in the page cache`,
);
