/**
 * A fine-tune leaving Conduit for llama.cpp: a LoRA run trained through the service (the dates task of
 * bench/lib/qualityTasks.ts), downloaded merged into its base (`GET /conduit/finetuning/{id}/artifact?format=merged`)
 * and as its adapter, then served by llama.cpp's own `llama-server` (bench/setup.sh builds it) two ways: the merged
 * GGUF alone, and the base with `--lora` the adapter. Every held-out prompt is answered greedily by Conduit serving
 * the run, by both llama-servers and by the base, all through raw completions of the same text (the base's chat
 * template written out), and the answers are compared.
 *
 * Prints the merge's size and time (first download, then the kept copy), how many answers of each llama-server
 * equal Conduit's, how many are right, and how many differ from the base's (so that equal answers are the
 * fine-tune's, not the base's). A base in F32/F16 merges exactly; a quantized one is re-quantized after the merge,
 * so a few answers may part where two tokens were nearly tied.
 *
 *   node --import tsx bench/export.ts [smollm2-135m|qwen2.5-coder-0.5b|file.gguf] [--pairs 60] [--epochs 3]
 *     [--prompts 12]
 */
import { spawn, type ChildProcess } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { parseArgs } from "node:util";
import { BENCH_KEY, call, freePort, startConduit, waitFor } from "./lib/conduitServer.ts";
import { datesTask } from "./lib/qualityTasks.ts";
import { modelPath, requireFile, toolPath, type BenchModel } from "./lib/reference.ts";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    pairs: { type: "string", default: "60" },
    epochs: { type: "string", default: "3" },
    prompts: { type: "string", default: "12" },
  },
});
const positional = positionals[0] ?? "smollm2-135m";
const basePath = requireFile(
  positional.endsWith(".gguf") ? path.resolve(positional) : modelPath(positional as BenchModel),
);
const llamaServer = requireFile(toolPath("llama-server"));
const task = datesTask;
const pairs = task.pairs(Number(values.pairs) + Number(values.prompts));
const heldOut = pairs.slice(0, Number(values.prompts));
const train = pairs.slice(Number(values.prompts));
/** ChatML, the template of both bench chat models (SmolLM2, Qwen2.5-Coder): the same text to every server. */
const prompt = (input: string) =>
  `<|im_start|>system\n${task.system}<|im_end|>\n<|im_start|>user\n${input}<|im_end|>\n<|im_start|>assistant\n`;
const load = () => os.loadavg()[0]!.toFixed(1);

interface Run {
  id: string;
  status: string;
  error: string | null;
  logs: string[];
}

const work = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-export-"));
const servers: ChildProcess[] = [];
const conduit = await startConduit(
  { base: basePath },
  { CONDUIT_CONTEXT_SIZE: "512", CONDUIT_EVAL_AFTER_RUN: "off", CONDUIT_LOG_LEVEL: "info" },
);
try {
  const dataset = await call<{ id: string }>(conduit, "POST", "/conduit/dataset", { name: "dates" });
  await call(conduit, "POST", `/conduit/dataset/${dataset.id}/upload`, {
    name: "dates.jsonl",
    ioPairs: train,
  });
  let run = await call<Run>(conduit, "POST", "/conduit/finetuning", {
    datasetID: dataset.id,
    baseModelName: "base",
    systemPrompt: task.system,
    epochs: Number(values.epochs),
  });
  const trainStarted = performance.now();
  while (!["READY", "FAILED", "CANCELLED"].includes(run.status)) {
    await new Promise((resolve) => setTimeout(resolve, 2000));
    run = await call(conduit, "GET", `/conduit/finetuning/${run.id}`);
  }
  if (run.status !== "READY") throw new Error(`run ended ${run.status}: ${run.error}`);
  console.log(
    `run ${run.id}: READY in ${((performance.now() - trainStarted) / 1000).toFixed(0)} s (load ${load()})`,
  );

  const download = async (query: string, file: string) => {
    const started = performance.now();
    const response = await fetch(`${conduit.url}/conduit/finetuning/${run.id}/artifact${query}`, {
      headers: { authorization: `Bearer ${BENCH_KEY}` },
    });
    if (!response.ok) throw new Error(`artifact${query}: ${response.status} ${await response.text()}`);
    fs.writeFileSync(file, Buffer.from(await response.arrayBuffer()));
    return (performance.now() - started) / 1000;
  };
  const adapterFile = path.join(work, "adapter.gguf");
  const mergedFile = path.join(work, "merged.gguf");
  await download("", adapterFile);
  const firstMerge = await download("?format=merged", mergedFile);
  const keptCopy = await download("?format=merged", mergedFile);
  const mib = (file: string) => (fs.statSync(file).size / 1048576).toFixed(1);
  run = await call(conduit, "GET", `/conduit/finetuning/${run.id}`);
  const mergeLine = run.logs.find((line) => line.includes("merged the adapter"));
  console.log(
    `base ${mib(basePath)} MiB, adapter ${mib(adapterFile)} MiB, merged ${mib(mergedFile)} MiB: ` +
      `first download ${firstMerge.toFixed(1)} s, the kept copy ${keptCopy.toFixed(1)} s` +
      (mergeLine ? ` (${mergeLine.replace(/^.*merged the adapter/, "merged the adapter")})` : ""),
  );

  const startLlamaServer = async (args: string[]) => {
    const port = await freePort();
    const child = spawn(
      llamaServer,
      [
        ...args,
        "--host",
        "127.0.0.1",
        "--port",
        String(port),
        "-c",
        "512",
        "-t",
        "1",
        "--no-webui",
        "--log-disable",
      ],
      { stdio: ["ignore", "ignore", "ignore"] },
    );
    servers.push(child);
    const url = `http://127.0.0.1:${port}`;
    await waitFor(`${url}/health`, child, `llama-server ${args.join(" ")}`);
    return async (text: string) => {
      const response = await fetch(`${url}/completion`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({
          prompt: text,
          n_predict: task.maxTokens,
          temperature: 0,
          cache_prompt: false,
        }),
      });
      if (!response.ok) throw new Error(`llama-server: ${response.status} ${await response.text()}`);
      return ((await response.json()) as { content: string }).content;
    };
  };
  const conduitAnswer = (model: string) => async (text: string) =>
    (
      await call<{ choices: { text: string }[] }>(conduit, "POST", "/v1/completions", {
        model,
        prompt: text,
        max_tokens: task.maxTokens,
        temperature: 0,
      })
    ).choices[0]!.text;
  const answerers: [string, (text: string) => Promise<string>][] = [
    ["conduit, the run", conduitAnswer(run.id)],
    ["conduit, the base", conduitAnswer("base")],
    ["llama-server, merged GGUF", await startLlamaServer(["-m", mergedFile])],
    ["llama-server, base --lora adapter", await startLlamaServer(["-m", basePath, "--lora", adapterFile])],
  ];
  const answers = new Map<string, string[]>();
  for (const [name, answer] of answerers) {
    const list: string[] = [];
    for (const pair of heldOut) list.push(await answer(prompt(pair.input)));
    answers.set(name, list);
  }
  const run_ = answers.get("conduit, the run")!;
  const base = answers.get("conduit, the base")!;
  const n = heldOut.length;
  const count = (list: string[], test: (answer: string, i: number) => boolean) => list.filter(test).length;
  console.log(`\n${n} held-out dates, greedy, ${task.maxTokens} tokens (load ${load()}):`);
  console.log("| served by | equal to conduit's run | right | differ from the base |");
  console.log("| --- | --- | --- | --- |");
  for (const [name] of answerers) {
    const list = answers.get(name)!;
    const same = count(list, (a, i) => a === run_[i]);
    const right = count(list, (a, i) => task.correct(a, heldOut[i]!));
    const changed = count(list, (a, i) => a !== base[i]);
    console.log(`| ${name} | ${same}/${n} | ${right}/${n} | ${changed}/${n} |`);
  }
  for (const [name] of answerers.slice(2)) {
    const list = answers.get(name)!;
    list.forEach((a, i) => {
      if (a !== run_[i])
        console.log(`  ${name}: ${JSON.stringify(a)} where conduit's run says ${JSON.stringify(run_[i])}`);
    });
  }
} finally {
  for (const child of servers) child.kill();
  conduit.stop();
  fs.rmSync(work, { recursive: true, force: true });
}
