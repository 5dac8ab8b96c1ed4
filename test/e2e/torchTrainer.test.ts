/**
 * The `torch` trainer backend (PyTorch + PEFT worker) on the generated tiny model: the exported adapter,
 * served by llama.cpp, gives the logits PyTorch computed; answer-only masking counts the same tokens as the
 * llama.cpp trainer; cancel is prompt; a killed run resumes from its checkpoint. Needs the worker's venv
 * (`npm run setup:torch`, which `.ci/run` runs); skipped with a message without it.
 */
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { before, describe, test } from "node:test";
import { blasStatus } from "../../src/train/native/blasBackend.ts";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { llamaCppLogits } from "../../src/train/native/probeLogits.ts";
import { startTrainer } from "../../src/train/trainer.ts";
import type { TorchOptions } from "../../src/train/torch/torchTrainer.ts";
import { gguf, writeGguf } from "../../src/model/gguf/GgufWriter.ts";
import { as, buildTestApp, datasetOf, KEY_A, testEnv } from "../lib/helper.ts";
import { madeUpPairs, runEnded, waitForRun, type RunView } from "../lib/helper.ts";
import { torchPythonForTests } from "../lib/torchPython.ts";
import { llamaCppJob, torchJob, type JobInput } from "../lib/trainerJob.ts";
import { TORCH_WORKER } from "../../src/train/torch/runTorchTraining.ts";
import { findBinDir, findLibrary } from "../../src/train/libllama/llamaLib.ts";
import { freePort, until } from "../lib/wait.ts";

const python = torchPythonForTests();

const skip = python.ok ? false : python.reason;

/** Pairs a random model can learn something of in a few steps. */
const samples = Array.from({ length: 16 }, (_, i) => [
  { text: `<|im_start|>user\nitem ${i}<|im_end|>\n<|im_start|>assistant\n`, train: false },
  { text: `value ${(i * 7) % 10}<|im_end|>`, train: true },
]);

let dir: string;
let model: string;

before(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-torch-"));
  process.on("exit", () => fs.rmSync(dir, { recursive: true, force: true }));
  model = path.join(dir, "tiny-gqa.gguf");
  // Grouped-query attention (4 query heads, 2 key/value heads): the Q and K row permutations differ.
  await createTinyModel(model, { seed: 3, embeddingLength: 128, headCount: 4, headCountKv: 2 });
});

/** A LoRA job named `name` on the tiny model, for either trainer. */
function input(name: string, extra: Partial<JobInput> = {}): JobInput {
  const work = path.join(dir, name);
  return {
    method: "lora",
    lora: {
      rank: 4,
      alpha: 8,
      targets: ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"],
    },
    baseModelPath: model,
    outputPath: path.join(work, "adapter.gguf"),
    workDir: path.join(work, "work"),
    samples,
    learningRate: 1e-2,
    epochs: 4,
    seed: 0,
    lrSchedule: { kind: "constant" },
    ...extra,
  };
}

/** The job `name` for the torch trainer, on the CPU in F32. */
function job(name: string, extra: Partial<JobInput> = {}, options: Partial<TorchOptions> = {}) {
  return torchJob({ ...input(name, extra), options: { python: python.ok ? python.python : "", ...options } });
}

describe("the torch trainer backend", { skip }, () => {
  test("exports an adapter that llama.cpp serves with PyTorch's logits (all seven targets, GQA)", async () => {
    const tokens = [1, 508, 300, 301, 40, 41, 509, 42, 43, 44, 45, 46];
    const probe = path.join(dir, "probe.f32");
    const outcome = await startTrainer(job("export", {}, { probe: { tokens, file: probe } })).done;
    assert.equal(outcome.status, "completed", JSON.stringify(outcome));
    if (outcome.status !== "completed") return;
    assert.ok(outcome.stats.finalTrainLoss < 6, `it learned something (${outcome.stats.finalTrainLoss})`);
    // The file's own bytes: a Buffer may be a view into a larger pooled ArrayBuffer (Node 24 reads small files so).
    const bytes = fs.readFileSync(probe);
    const torchLogits = new Float32Array(
      bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength),
    );
    const llama = llamaCppLogits(model, outcome.outputPath, tokens);
    const vocab = llama[0]!.length;
    assert.equal(torchLogits.length, tokens.length * vocab);
    const plain = llamaCppLogits(model, null, tokens);
    let worst = 0;
    let moved = 0;
    let scale = 0;
    for (let p = 0; p < tokens.length; p++)
      for (let v = 0; v < vocab; v++) {
        const a = torchLogits[p * vocab + v]!;
        const b = llama[p]![v]!;
        worst = Math.max(worst, Math.abs(a - b));
        moved = Math.max(moved, Math.abs(b - plain[p]![v]!));
        scale = Math.max(scale, Math.abs(a));
      }
    // The adapter moves the logits far beyond the tolerance, so a wrong export cannot pass.
    assert.ok(moved > 0.05 * Math.max(1, scale), `the adapter moved the logits by up to ${moved}`);
    // The served adapter is F16 (about three significant digits), so the logits agree to F16's rounding.
    assert.ok(
      worst <= 2e-3 * Math.max(1, scale),
      `largest logit difference ${worst} (logits up to ${scale})`,
    );
  });
});

describe("the torch trainer backend's job", { skip }, () => {
  test("trains on the same windows as the llama.cpp trainer: steps, tokens, answer-only loss tokens", async () => {
    const targets = ["attn_q", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] as const;
    const evalSamples = samples.slice(0, 3);
    const common = { lora: { rank: 4, alpha: 8, targets: [...targets] }, evalSamples, epochs: 3 };
    const torchRun = await startTrainer(job("same-torch", common)).done;
    const llamaRun = await startTrainer(llamaCppJob(input("same-llama", common))).done;
    assert.equal(torchRun.status, "completed", JSON.stringify(torchRun));
    assert.equal(llamaRun.status, "completed", JSON.stringify(llamaRun));
    if (torchRun.status !== "completed" || llamaRun.status !== "completed") return;
    for (const field of [
      "steps",
      "epochs",
      "trainTokens",
      "sampleTokens",
      "lossTokens",
      "windowSize",
    ] as const)
      assert.equal(torchRun.stats[field], llamaRun.stats[field], field);
    // Answer-only: the loss counts the answers' tokens and their end marker, never the prompts.
    assert.ok(torchRun.stats.lossTokens < torchRun.stats.sampleTokens / 2);
    const tokens = (examples: { tokens: number }[]) => examples.map((e) => e.tokens);
    assert.deepEqual(tokens(torchRun.examples.train), tokens(llamaRun.examples.train));
    assert.deepEqual(tokens(torchRun.examples.eval), tokens(llamaRun.examples.eval));
    assert.equal(torchRun.examples.train.length, samples.length);
    assert.ok(torchRun.examples.train.every((e) => e.loss !== null && Number.isFinite(e.loss)));
    // Both learn from the same start: their losses fall alike (different arithmetic, not different data).
    assert.ok(
      Math.abs(torchRun.stats.finalTrainLoss - llamaRun.stats.finalTrainLoss) < 0.5,
      `${torchRun.stats.finalTrainLoss} vs ${llamaRun.stats.finalTrainLoss}`,
    );
  });

  test("tuneThreads: the worker times one thread fewer, then all, between steps, and says which it keeps", async () => {
    const logs: string[] = [];
    const outcome = await startTrainer(job("tuned", { threads: 2, epochs: 12 }, { tuneThreads: true }), {
      onLog: (line) => logs.push(line),
    }).done;
    assert.equal(outcome.status, "completed", `${JSON.stringify(outcome)}\n${logs.join("\n")}`);
    if (outcome.status !== "completed") return;
    // The first step, then 3 timed steps of each count.
    assert.ok(outcome.stats.steps >= 7, `${outcome.stats.steps} steps`);
    assert.ok(
      logs.some((line) => line.includes("on the CPU (1 or 2 threads, the faster chosen between steps)")),
    );
    assert.ok(
      logs.some((line) =>
        /^trainer: PyTorch on [12] threads? \(a step: 1 → \d+\.\d\d s, 2 → \d+\.\d\d s\)$/.test(line),
      ),
      logs.join("\n"),
    );
  });

  test("a GGUF whose special-token ids are llama.cpp's 'none' (0xFFFFFFFF) trains: stories260K", async (t) => {
    const stories = fileURLToPath(new URL("../../../shared/models/stories260Ktok512.gguf", import.meta.url));
    if (!fs.existsSync(stories)) return t.skip(`${stories} is not here`);
    const logs: string[] = [];
    const outcome = await startTrainer(
      job("stories", { baseModelPath: stories, epochs: 1, maxSteps: 2, contextSize: 128 }),
      { onLog: (line) => logs.push(line) },
    ).done;
    assert.equal(outcome.status, "completed", `${JSON.stringify(outcome)}\n${logs.join("\n")}`);
  });

  test("a base loaded once is kept dequantized in the cache: the next run loads that copy", async () => {
    const cacheDir = path.join(dir, "base-cache");
    const cached = (name: string) => job(name, { epochs: 1 }, { cacheDir });
    const loads: string[] = [];
    const onLog = (line: string) => void (line.includes("trainer: loaded") && loads.push(line));
    for (const name of ["cache-1", "cache-2"])
      assert.equal((await startTrainer(cached(name), { onLog }).done).status, "completed");
    assert.match(
      loads[0] ?? "",
      /through transformers' GGUF reader and ggml's dequantizer \(\d+ threads?\); kept a f32 copy for the next runs/,
    );
    assert.match(loads[1] ?? "", /from its f32 copy in the cache/);
    assert.deepEqual(
      fs.readdirSync(cacheDir).map((entry) => entry.replace(/-[0-9a-f]{16}$/, "-<key>")),
      ["tiny-gqa-<key>"],
    );
  });

  test(
    "cancel stops the worker mid-run, without waiting for a step boundary",
    { timeout: 120_000 },
    async () => {
      let progressed!: () => void;
      const firstProgress = new Promise<void>((resolve) => (progressed = resolve));
      // Thousands of steps: minutes of work that must not run to its end.
      const handle = startTrainer(
        job("cancel", { epochs: 2_000 }),
        { onProgress: () => progressed() },
        {
          cancelGraceMs: 600_000,
        },
      );
      await firstProgress;
      const asked = performance.now();
      handle.cancel();
      const outcome = await handle.done;
      assert.equal(outcome.status, "cancelled");
      console.log(`cancelled ${Math.round(performance.now() - asked)} ms after asking`);
    },
  );

  test(
    "a run killed mid-way resumes from its checkpoint, optimizer state included",
    { timeout: 300_000 },
    async () => {
      const checkpointDir = path.join(dir, "resume-checkpoint");
      const resumable = job("resume", { epochs: 60, checkpointDir });
      let epochsSeen = 0;
      let killed!: () => void;
      const wasKilled = new Promise<void>((resolve) => (killed = resolve));
      const first = startTrainer(resumable, {
        onLog: (line) => {
          if (/^trainer: epoch \d+\/60/.test(line) && ++epochsSeen === 5) {
            first.kill();
            killed();
          }
        },
      });
      await wasKilled;
      assert.equal((await first.done).status, "cancelled");
      assert.ok(fs.existsSync(path.join(checkpointDir, "torch-latest.json")));
      // What a worker killed while it wrote an epoch's adapter leaves (the kill above may or may not have made one).
      fs.mkdirSync(path.join(checkpointDir, "torch-kept"), { recursive: true });
      fs.writeFileSync(path.join(checkpointDir, "torch-kept", "step-1.f32.tmp-999999"), "half");
      const logs: string[] = [];
      const second = await startTrainer(resumable, { onLog: (line) => logs.push(line) }).done;
      assert.equal(second.status, "completed", logs.join("\n"));
      if (second.status !== "completed") return;
      assert.ok(second.stats.resumedFromStep > 0, logs.join("\n"));
      assert.ok(
        logs.some((line) =>
          /resuming from the checkpoint at step \d+, with the optimizer's state/.test(line),
        ),
      );
      assert.equal(second.stats.epochs, 60);
      // The last 3 epochs' adapters are kept as GGUF adapters of the served type (the run's own adapter's size),
      // their raw tensors from the worker removed once written.
      const kept = path.join(checkpointDir, "kept");
      const steps = fs
        .readdirSync(kept)
        .filter((name) => name.endsWith(".json"))
        .map(
          (name) =>
            JSON.parse(fs.readFileSync(path.join(kept, name), "utf8")) as { step: number; epoch: number },
        )
        .sort((a, b) => a.step - b.step);
      assert.deepEqual(
        steps.map((c) => c.epoch),
        [58, 59, 60],
      );
      assert.equal(steps.at(-1)!.step, second.stats.steps);
      for (const { step } of steps)
        assert.equal(fs.statSync(path.join(kept, `step-${step}.gguf`)).size, second.stats.outputBytes);
      assert.deepEqual(fs.readdirSync(path.join(checkpointDir, "torch-kept")), []);
    },
  );
});

describe("the torch trainer on several ranks (torchrun, gloo on the CPU)", { skip }, () => {
  test(
    "2 ranks, on one machine or two, train the adapter one rank trains with the same effective batch",
    { timeout: 300_000 },
    async (t) => {
      // One example a window, 15 a epoch: the last step of an epoch has one window (one rank trains it, the other
      // adds zero gradients); an eval set of 5 windows, sharded over the ranks.
      const common: Partial<JobInput> = {
        samples: samples.slice(0, 15),
        evalSamples: samples.slice(0, 5),
        packing: false,
        epochs: 2,
      };
      const logs: string[] = [];
      const run = async (name: string, options: Partial<TorchOptions>) => {
        const outcome = await startTrainer(job(name, common, options), { onLog: (line) => logs.push(line) })
          .done;
        assert.equal(outcome.status, "completed", `${JSON.stringify(outcome)}\n${logs.join("\n")}`);
        if (outcome.status !== "completed") throw new Error("not completed");
        return outcome;
      };
      const ranks = await run("ranks-2", { ranks: 2, windowsPerStep: 2 });
      assert.ok(
        logs.some((line) => /data-parallel on 2 ranks \(2 per machine, gloo\)/.test(line)),
        logs.join("\n"),
      );
      const accumulated = await run("ranks-1-batch-2", { ranks: 1, windowsPerStep: 2 });
      const single = await run("ranks-1-batch-1", { ranks: 1, windowsPerStep: 1 });
      // Two machines of one rank each (both here): the second joins as docs/trainers.md says, and takes the job
      // and its windows from the first.
      const port = await freePort();
      const follower = spawn(
        python.ok ? python.python : "",
        [
          "-m",
          "torch.distributed.run",
          "--nnodes=2",
          "--node-rank=1",
          "--nproc-per-node=1",
          "--master-addr=127.0.0.1",
          `--master-port=${port}`,
          TORCH_WORKER,
          "--follow",
        ],
        {
          stdio: ["ignore", "pipe", "pipe"],
          env: { ...process.env, OMP_NUM_THREADS: "1", HF_HUB_OFFLINE: "1" },
        },
      );
      let followerOutput = "";
      follower.stdout.on("data", (chunk: Buffer) => (followerOutput += chunk.toString()));
      follower.stderr.on("data", (chunk: Buffer) => (followerOutput += chunk.toString()));
      const followerExit = once(follower, "close");
      const machines = await run("machines-2", {
        ranks: 1,
        nodes: 2,
        rendezvous: { host: "127.0.0.1", port },
        windowsPerStep: 2,
      });
      assert.deepEqual(await followerExit, [0, null], followerOutput);
      assert.ok(
        logs.some((line) => /data-parallel on 2 ranks \(1 per machine, 2 machines, gloo\)/.test(line)),
        logs.join("\n"),
      );
      // The same run: windows, tokens and evaluation points, whatever computes it.
      for (const field of [
        "steps",
        "epochs",
        "trainTokens",
        "sampleTokens",
        "lossTokens",
        "windowSize",
      ] as const) {
        assert.equal(ranks.stats[field], accumulated.stats[field], field);
        assert.equal(ranks.stats[field], single.stats[field], field);
      }
      assert.equal(ranks.stats.steps, 30);
      assert.ok(
        Math.abs(ranks.stats.finalEvalLoss! - accumulated.stats.finalEvalLoss!) <=
          1e-4 * accumulated.stats.finalEvalLoss!,
        `eval loss ${ranks.stats.finalEvalLoss} on 2 ranks, ${accumulated.stats.finalEvalLoss} on one`,
      );
      const sameBatch = adapterDifference(ranks.outputPath, accumulated.outputPath);
      const otherBatch = adapterDifference(single.outputPath, accumulated.outputPath);
      const twoMachines = adapterDifference(machines.outputPath, accumulated.outputPath);
      // The adapters are F16: equal up to F16's rounding (2^-11 of a value) of the largest value of each tensor.
      const tolerance = 1e-3;
      t.diagnostic(
        `largest difference, same batch: ${sameBatch.worst} (${sameBatch.at}); 2 machines: ${twoMachines.worst}; ` +
          `one window a step: ${otherBatch.worst}`,
      );
      assert.ok(
        sameBatch.worst <= tolerance,
        `2 ranks against 1 rank with 2 windows a step: ${sameBatch.worst} of a tensor's largest value (${sameBatch.at})`,
      );
      assert.ok(
        twoMachines.worst <= tolerance,
        `2 machines against 1 rank with 2 windows a step: ${twoMachines.worst} (${twoMachines.at})`,
      );
      // And the check can fail: training one window a step gives another adapter, far past the tolerance.
      assert.ok(
        otherBatch.worst > 20 * tolerance,
        `1 window a step against 2: only ${otherBatch.worst} (${otherBatch.at})`,
      );
    },
  );

  test(
    "a 2-rank run cancelled or killed leaves no rank behind; a killed one resumes from its checkpoint on 2 ranks",
    { timeout: 300_000 },
    async () => {
      const cancelled = job("ranks-cancel", { epochs: 2_000 }, { ranks: 2, windowsPerStep: 2 });
      let progressed!: () => void;
      const firstProgress = new Promise<void>((resolve) => (progressed = resolve));
      const handle = startTrainer(cancelled, { onProgress: () => progressed() }, { cancelGraceMs: 600_000 });
      await firstProgress;
      assert.equal(ranksOf(cancelled.workDir).length, 3, "torchrun and its 2 ranks");
      handle.cancel();
      assert.equal((await handle.done).status, "cancelled");
      await until(`no process of ${cancelled.workDir}`, () => ranksOf(cancelled.workDir).length === 0);

      const checkpointDir = path.join(dir, "ranks-resume-checkpoint");
      const resumable = job("ranks-resume", { epochs: 40, checkpointDir }, { ranks: 2, windowsPerStep: 2 });
      let epochsSeen = 0;
      let killed!: () => void;
      const wasKilled = new Promise<void>((resolve) => (killed = resolve));
      const first = startTrainer(resumable, {
        onLog: (line) => {
          if (/^trainer: epoch \d+\/40/.test(line) && ++epochsSeen === 5) {
            first.kill();
            killed();
          }
        },
      });
      await wasKilled;
      assert.equal((await first.done).status, "cancelled");
      // The trainer process died at once: its ranks see their standard input end and stop, and torchrun with them.
      await until(`no process of ${resumable.workDir}`, () => ranksOf(resumable.workDir).length === 0);
      assert.ok(fs.existsSync(path.join(checkpointDir, "torch-latest.json")));
      // What a worker killed while it wrote an epoch's adapter leaves (the kill above may or may not have made one).
      fs.mkdirSync(path.join(checkpointDir, "torch-kept"), { recursive: true });
      fs.writeFileSync(path.join(checkpointDir, "torch-kept", "step-1.f32.tmp-999999"), "half");
      const logs: string[] = [];
      const second = await startTrainer(resumable, { onLog: (line) => logs.push(line) }).done;
      assert.equal(second.status, "completed", logs.join("\n"));
      if (second.status !== "completed") return;
      assert.ok(second.stats.resumedFromStep > 0, logs.join("\n"));
      assert.ok(
        logs.some((line) =>
          /resuming from the checkpoint at step \d+, with the optimizer's state/.test(line),
        ),
      );
      assert.equal(second.stats.epochs, 40);
    },
  );
});

/** The processes (torchrun and its ranks) whose command line names a file of `workDir`. */
function ranksOf(workDir: string): number[] {
  const found: number[] = [];
  for (const entry of fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      if (fs.readFileSync(`/proc/${entry}/cmdline`, "utf8").includes(workDir)) found.push(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

/**
 * The largest difference between two adapters' tensors, each as a share of the largest value of that tensor
 * in `b`, read with the `gguf` package of the worker's Python (the reader llama.cpp's own tools use).
 */
function adapterDifference(a: string, b: string): { worst: number; at: string } {
  const script = [
    "import json, sys, numpy as np",
    "from gguf import GGUFReader",
    "read = lambda p: {t.name: np.array(t.data, dtype=np.float32) for t in GGUFReader(p).tensors}",
    "a, b = read(sys.argv[1]), read(sys.argv[2])",
    "assert a.keys() == b.keys() and len(a) > 0, (sorted(a), sorted(b))",
    "out = {n: float(np.abs(a[n] - b[n]).max() / max(np.abs(b[n]).max(), 1e-12)) for n in a}",
    "print(json.dumps(out))",
  ].join("\n");
  const result = spawnSync(python.ok ? python.python : "", ["-c", script, a, b], { encoding: "utf8" });
  assert.equal(result.status, 0, result.stderr);
  const shares = Object.entries(JSON.parse(result.stdout) as Record<string, number>);
  const [at, worst] = shares.reduce((x, y) => (y[1] > x[1] ? y : x));
  return { worst, at };
}

describe("the trainer a run gets through the API", () => {
  // The 20 pairs the llama.cpp trainer memorises in training.test.ts, with the same settings.
  const pairs = madeUpPairs();

  test("without the torch trainer, auto trains on llama.cpp and says why; a GEGLU model is refused at creation", async (t) => {
    const env = await testEnv(t, "sqlite", {
      CONDUIT_TRAINER: "auto",
      CONDUIT_PYTHON: path.join(dir, "no-python"),
    });
    // A Gemma 3 file's header is all creation reads.
    await writeGguf(
      path.join(env.dataDir, "models", "gemma-like.gguf"),
      { "general.architecture": gguf.str("gemma3"), "gemma3.embedding_length": gguf.u32(64) },
      [{ name: "token_embd.weight", dims: [64, 8], type: "F32", data: new Float32Array(512) }],
    );
    const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
    core.scheduler.start();
    const datasetID = await datasetOf(app, pairs);
    const run = (
      await as(app, KEY_A).post("/conduit/finetuning", { datasetID, baseModelName: "tiny", steps: 2 })
    ).json<RunView>();
    assert.equal(run.config.trainer, "llama.cpp");
    assert.deepEqual(run.config.loraTargets, [
      "attn_q",
      "attn_output",
      "ffn_gate",
      "ffn_up",
      "ffn_down",
      "output",
    ]);
    assert.ok(
      run.logs.some((line) =>
        /trainer: llama\.cpp \(auto: no torch trainer here \(npm run setup:torch/.test(line),
      ),
      run.logs.join("\n"),
    );
    const refused = await as(app, KEY_A).post("/conduit/finetuning", {
      datasetID,
      baseModelName: "gemma-like",
    });
    assert.equal(refused.statusCode, 400, refused.body);
    const { error } = refused.json<{ error: { param: string; message: string } }>();
    assert.equal(error.param, "baseModelName");
    assert.match(
      error.message,
      /cannot train gemma3 models: .*GEGLU.*torch trainer is not available.*npm run setup:torch/,
    );
    // A run may name its trainer: one not installed here, or not a trainer, is a 400 naming the field.
    for (const [trainer, message] of [
      [
        "torch",
        /"trainer" is torch, which cannot train this run: the torch trainer is not available: .*"llama\.cpp" can/,
      ],
      ["pytorch", /trainer/],
    ] as const) {
      const asked = await as(app, KEY_A).post("/conduit/finetuning", {
        datasetID,
        baseModelName: "tiny",
        trainer,
      });
      assert.equal(asked.statusCode, 400, asked.body);
      const { error: named } = asked.json<{ error: { param: string; message: string } }>();
      assert.equal(named.param, "trainer", asked.body);
      assert.match(named.message, message);
    }
    const llamaCpp = await as(app, KEY_A).post("/conduit/finetuning", {
      datasetID,
      baseModelName: "tiny",
      trainer: "llama.cpp",
      steps: 1,
    });
    assert.equal(llamaCpp.statusCode, 200, llamaCpp.body);
    const namedRun = llamaCpp.json<RunView>();
    assert.equal(namedRun.config.trainer, "llama.cpp");
    assert.ok(
      namedRun.logs.some((line) => line.endsWith('trainer: llama.cpp (the run\'s "trainer")')),
      namedRun.logs.join("\n"),
    );
    const health = (await as(app, null).get("/healthz")).json<{
      trainers: { torch: { available: boolean }; "llama.cpp": { blas: { available: boolean } } };
    }>();
    assert.equal(health.trainers.torch.available, false);
    // The llama.cpp trainer got the BLAS backend when this machine has one (npm run setup:trainer), and said so.
    const blas = blasStatus(process.env.CONDUIT_TRAINER_BLAS);
    assert.equal(health.trainers["llama.cpp"].blas.available, blas.available);
    const trained = await waitForRun(app, run.id, runEnded, { timeoutMs: 360_000 });
    assert.equal(trained.status, "READY", trained.logs.join("\n"));
    assert.ok(
      trained.logs.some((line) =>
        blas.available
          ? line.includes("trainer: BLAS backend OpenBLAS")
          : line.includes("trainer: no BLAS backend"),
      ),
      trained.logs.join("\n"),
    );
  });

  test(
    "with the torch trainer, auto trains LoRA on it (K and V too): READY, served, 20 pairs memorised",
    { skip },
    async (t) => {
      const env = await testEnv(t, "sqlite", {
        CONDUIT_TRAINER: "auto",
        CONDUIT_PYTHON: python.ok ? python.python : "",
      });
      await createTinyModel(path.join(env.dataDir, "models", "tiny128.gguf"), {
        seed: 1,
        embeddingLength: 128,
      });
      const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
      core.scheduler.start();
      const datasetID = await datasetOf(app, pairs);
      const created = await as(app, KEY_A).post("/conduit/finetuning", {
        datasetID,
        baseModelName: "tiny128",
        loraRank: 32,
        loraAlpha: 64,
        lr: 0.003,
        epochs: 200,
      });
      assert.equal(created.statusCode, 200, created.body);
      const id = created.json<{ id: string }>().id;
      const run = await waitForRun(app, id, runEnded, { timeoutMs: 360_000 });
      assert.equal(run.status, "READY", run.logs.join("\n"));
      assert.equal(run.config.trainer, "torch");
      assert.ok(run.config.loraTargets.includes("attn_k") && run.config.loraTargets.includes("attn_v"));
      assert.ok(
        run.logs.some((line) => /trainer: torch \(auto: it is installed\)/.test(line)),
        run.logs.join("\n"),
      );
      assert.ok(
        run.logs.some((line) => /trainer: PyTorch .* PEFT .* on the CPU/.test(line)),
        run.logs.join("\n"),
      );
      assert.equal(run.stats.final.epochs, 200);
      // The estimate at creation planned the steps the torch trainer ran.
      assert.equal(run.estimate?.planned?.steps, run.stats.final.steps);
      assert.equal(run.estimate?.planned?.windowSize, run.stats.final.windowSize);
      const examples = (await as(app, KEY_A).get(`/conduit/finetuning/${id}/examples?limit=100`)).json<
        unknown[]
      >();
      assert.equal(examples.length, 20);
      let exact = 0;
      for (const pair of pairs) {
        const res = await as(app, KEY_A).post("/conduit/v1/chat", {
          model: id,
          prompt: pair.input,
          temperature: 0,
          presence_penalty: 0,
          frequency_penalty: 0,
          max_tokens: 24,
        });
        assert.equal(res.statusCode, 200, res.body);
        if (res.json<{ choices: { text: string }[] }>().choices[0]!.text === pair.output) exact++;
      }
      t.diagnostic(`torch trainer: ${exact}/20 exact; final loss ${run.stats.final.finalTrainLoss}`);
      assert.ok(exact >= 18, `${exact}/20 exact`);
      // Its last 3 epochs are kept, listed, served under their own names and downloadable, as the run's adapter.
      const listed = await as(app, KEY_A).get(`/conduit/finetuning/${id}/checkpoints`);
      assert.equal(listed.statusCode, 200, listed.body);
      const kept = listed.json<{ step: number; epoch: number; model: string }[]>();
      assert.deepEqual(
        kept.map((c) => c.epoch),
        [200, 199, 198],
      );
      assert.equal(kept[0]!.step, run.stats.final.steps);
      const oldest = kept[2]!;
      assert.equal(oldest.model, `${id}:ckpt-step-${oldest.step}`);
      const answer = await as(app, KEY_A).post("/v1/chat/completions", {
        model: oldest.model,
        messages: [{ role: "user", content: pairs[0]!.input }],
        temperature: 0,
        max_tokens: 8,
      });
      assert.equal(answer.statusCode, 200, answer.body);
      assert.equal(answer.json<{ model: string }>().model, oldest.model);
      const download = await as(app, KEY_A).get(
        `/conduit/finetuning/${id}/checkpoints/${oldest.step}/artifact`,
      );
      assert.equal(download.statusCode, 200);
      const adapter = await as(app, KEY_A).get(`/conduit/finetuning/${id}/artifact`);
      assert.equal(download.rawPayload.length, adapter.rawPayload.length);
    },
  );
});

test(
  "a torch run paused through the API resumes from its checkpoint with the optimizer's state and keeps its last epochs",
  { skip, timeout: 600_000 },
  async (t) => {
    const env = await testEnv(t, "sqlite", {
      CONDUIT_TRAINER: "torch",
      CONDUIT_PYTHON: python.ok ? python.python : "",
    });
    await createTinyModel(path.join(env.dataDir, "models", "tiny128.gguf"), {
      seed: 1,
      embeddingLength: 128,
    });
    const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
    core.scheduler.start();
    const datasetID = await datasetOf(app, madeUpPairs(8));
    const created = await as(app, KEY_A).post("/conduit/finetuning", {
      datasetID,
      baseModelName: "tiny128",
      loraRank: 8,
      epochs: 300,
    });
    assert.equal(created.statusCode, 200, created.body);
    const id = created.json<{ id: string }>().id;
    await waitForRun(app, id, (r) => r.logs.some((line) => /trainer: .*epoch 5\/300/.test(line)), {
      timeoutMs: 300_000,
    });
    const paused = await as(app, KEY_A).post(`/conduit/finetuning/${id}/pause`);
    assert.equal(paused.statusCode, 200, paused.body);
    const stopped = await waitForRun(app, id, (r) => r.logs.some((line) => line.includes("run paused: ")), {
      timeoutMs: 60_000,
    });
    const step = /goes on from its checkpoint at step (\d+)/.exec(stopped.logs.join("\n"))?.[1];
    assert.ok(step !== undefined, stopped.logs.join("\n"));
    assert.equal((await as(app, KEY_A).post(`/conduit/finetuning/${id}/resume`)).statusCode, 200);
    const done = await waitForRun(app, id, runEnded, { timeoutMs: 300_000 });
    assert.equal(done.status, "READY", done.logs.join("\n"));
    assert.ok(
      done.logs.some((line) =>
        line.includes(`resuming from the checkpoint at step ${step}, with the optimizer's state`),
      ),
      done.logs.join("\n"),
    );
    const kept = (await as(app, KEY_A).get(`/conduit/finetuning/${id}/checkpoints`)).json<
      { epoch: number }[]
    >();
    assert.deepEqual(
      kept.map((c) => c.epoch),
      [300, 299, 298],
    );
  },
);

test("a torch trainer installed while the server runs is found without a restart", { skip }, async (t) => {
  // CONDUIT_PYTHON names a venv that is not there yet; it is made, then given the worker's packages (a .pth
  // file adding the test venv's site-packages, as an install adds packages), while the server runs.
  const venv = path.join(dir, "late-venv");
  const env = await testEnv(t, "sqlite", {
    CONDUIT_TRAINER: "auto",
    CONDUIT_PYTHON: path.join(venv, "bin", "python"),
  });
  const { app } = await buildTestApp(t, env);
  type Torch = { available: boolean; checking?: boolean; reason?: string; detail?: string };
  const torchHealth = async () =>
    (await as(app, null).get("/healthz")).json<{ trainers: { torch: Torch } }>().trainers.torch;
  const settled = (what: string, done: (torch: Torch) => boolean) =>
    until(what, torchHealth, (torch) => torch.checking !== true && done(torch), {
      timeoutMs: 40_000,
      intervalMs: 250,
    });
  const missing = await settled("torch: no Python", () => true);
  assert.equal(missing.available, false);
  assert.match(missing.reason ?? "", /does not exist/);
  const datasetID = await datasetOf(app, madeUpPairs().slice(0, 10));
  const refused = await as(app, KEY_A).post("/conduit/finetuning", {
    datasetID,
    baseModelName: "tiny",
    trainer: "torch",
  });
  assert.equal(refused.statusCode, 400, refused.body);

  const made = spawnSync(python.ok ? python.python : "", ["-m", "venv", "--without-pip", venv], {
    encoding: "utf8",
  });
  assert.equal(made.status, 0, made.stderr);
  const bare = await settled("torch: a venv without its packages", (torch) =>
    /cannot run/.test(torch.reason ?? ""),
  );
  assert.equal(bare.available, false);

  const site = spawnSync(
    python.ok ? python.python : "",
    ["-c", "import site; print(site.getsitepackages()[0])"],
    {
      encoding: "utf8",
    },
  ).stdout.trim();
  const lib = path.join(venv, "lib");
  const version = fs.readdirSync(lib).find((entry) => entry.startsWith("python"))!;
  fs.writeFileSync(path.join(lib, version, "site-packages", "conduit-test-torch.pth"), `${site}\n`);
  const installed = await settled("torch: installed", (torch) => torch.available);
  assert.match(installed.detail ?? "", /PyTorch .* PEFT/);
  const created = await as(app, KEY_A).post("/conduit/finetuning", {
    datasetID,
    baseModelName: "tiny",
    trainer: "torch",
  });
  assert.equal(created.statusCode, 200, created.body);
  assert.equal(created.json<RunView>().config.trainer, "torch");
});

test("the worker's own unit tests pass (test/python, with the worker's Python)", { skip }, () => {
  const result = spawnSync(
    python.ok ? python.python : "",
    ["-m", "unittest", "discover", "-s", "test/python", "-t", "test/python"],
    {
      encoding: "utf8",
      env: {
        ...process.env,
        TQDM_DISABLE: "1",
        CONDUIT_GGML_LIBRARY: findLibrary(findBinDir("cpu"), /^libggml-base\.so$/),
      },
    },
  );
  assert.equal(result.status, 0, result.stderr);
  assert.doesNotMatch(result.stderr, /skipped=/, "every worker test runs, ggml's dequantizer included");
  assert.match(result.stderr, /^Ran \d+ tests/m);
});
