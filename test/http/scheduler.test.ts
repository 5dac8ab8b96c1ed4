/**
 * The scheduler's run lifecycle against the real store, with a fake trainer the tests drive step by step
 * (real trainings are in training.test.ts and runs.test.ts).
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { describe, test as nodeTest, type TestContext } from "node:test";
import type { FastifyInstance } from "fastify";
import { readGgufFileInfo } from "node-llama-cpp";
import { loadConfig } from "../../src/config.ts";
import { createCore, type Core } from "../../src/core.ts";
import { writeGgufUint32 } from "../../src/model/gguf/GgufPatch.ts";
import { OUT_OF_SPACE_RUN } from "../../src/errors.ts";
import type { Run } from "../../src/store/RunRepository.ts";
import { prepareSamples, type SamplePreparer } from "../../src/train/prepareSamples.ts";
import type { SchedulerOptions } from "../../src/train/Scheduler.ts";
import { FakeTrainer } from "../lib/fakeTrainer.ts";
import { asAlice, buildTestApp, endlessEngine, testEnv } from "../lib/helper.ts";
import { until } from "../lib/wait.ts";

const pairs = Array.from({ length: 4 }, (_, i) => ({ input: `question ${i}`, output: `answer ${i}` }));

/** A gate a test opens when it is ready. */
function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

interface Setup {
  /** The HTTP app, when the test asked for one. */
  app: FastifyInstance | undefined;
  core: Core;
  /** A run of Alice's (`body` adds to or overrides the defaults) on a dataset of four pairs; returns its id. */
  startRun(body?: Record<string, unknown>): Promise<string>;
  trainer: FakeTrainer;
  /** The run's stored record. */
  run(id: string): Promise<Run>;
  /** Waits for the run's log to have a line matching `pattern`; returns the run. */
  logged(id: string, pattern: RegExp): Promise<Run>;
  /** A file or directory of the run in the blob store. */
  file(id: string, name?: string): string;
}

/**
 * A core (and an HTTP app with `http`) whose scheduler trains with a fake trainer; the scheduler is started
 * unless `start` is false. Its poll interval is long, so nothing happens on a timer: the tests call `tick()`
 * for a heartbeat.
 */
async function setup(
  t: TestContext,
  options: Partial<SchedulerOptions> = {},
  { start = true, http = false }: { start?: boolean; http?: boolean } = {},
): Promise<Setup> {
  const trainer = new FakeTrainer();
  const env = await testEnv(t);
  const overrides = {
    // No generation here: a fake engine spares loading llama.cpp.
    engine: endlessEngine(),
    scheduler: { concurrency: 1, pollMs: 3_600_000, leaseMs: 600_000, trainer: trainer.launch, ...options },
  };
  let app: FastifyInstance | undefined;
  let core: Core;
  if (http) {
    ({ app, core } = await buildTestApp(t, env, overrides));
  } else {
    core = await createCore(loadConfig(env.env), overrides);
    t.after(() => core.close());
  }
  if (start) core.scheduler.start();
  const run = async (id: string) => {
    const found = await core.runRepository.getById(id);
    assert.ok(found, `run ${id} exists`);
    return found;
  };
  return {
    app,
    core,
    trainer,
    async startRun(body = {}) {
      const dataset = await core.datasets.create("alice", "pairs");
      await core.datasets.upload("alice", dataset.id, {
        name: "pairs.jsonl",
        source: Readable.from(pairs.map((pair) => `${JSON.stringify(pair)}\n`)),
      });
      const run = await core.runs.create("alice", { datasetID: dataset.id, baseModelName: "tiny", ...body });
      return run.id;
    },
    run,
    logged: (id, pattern) =>
      until(`a log line ${pattern} of run ${id}`, async () => {
        const found = await run(id);
        return found.logs.some((line) => pattern.test(line)) && found;
      }),
    file: (id, name = "") => core.blobs.pathOf(path.join(`runs/${id}`, name)),
  };
}

/** A sample preparation that waits for `held` once the real one has written the files. */
function heldPreparation(core: () => Core, held: Promise<void>, entered: () => void): SamplePreparer {
  return async (run, base, dir) => {
    const files = await prepareSamples(core().datasets, run, base, dir, 50);
    entered();
    await held;
    return files;
  };
}

/** Where the scheduler asked the trainer to save checkpoints: a checkpoint there, as a real trainer leaves it. */
function writeCheckpoint(dir: string | null | undefined): string {
  assert.ok(dir, "the job names a checkpoint directory");
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, "latest.json");
  fs.writeFileSync(file, JSON.stringify({ step: 1 }));
  return file;
}

/** A test that fails instead of hanging when the scheduler never gets where it waits for. */
function test(name: string, fn: (t: TestContext) => Promise<void>): void {
  nodeTest(name, { timeout: 30_000 }, fn);
}

describe("scheduler with a fake trainer", () => {
  test("QUEUED → RUNNING → READY: the job, the trainer's logs and progress go into the run", async (t) => {
    const s = await setup(t, {}, { http: true });
    const app = s.app!;
    const id = await s.startRun({ epochs: 2, lr: 0.001 });
    const trainer = await s.trainer.started();
    const running = await s.run(id);
    assert.equal(running.status, "RUNNING");
    assert.equal(running.attempts, 1);
    assert.ok(
      running.logs.some((line) => line.includes("training started on") && line.includes("attempt 1")),
    );
    assert.ok(running.logs.some((line) => line.includes("4 training conversations")));

    // The job: the run's settings, and the examples prepared for the base model.
    const { job } = trainer;
    assert.equal(job.method, "lora");
    assert.deepEqual([job.epochs, job.learningRate, job.seed], [2, 0.001, running.config.seed]);
    assert.equal(job.outputPath, s.file(id, "adapter.gguf"));
    assert.equal(job.checkpointDir, s.file(id, "checkpoint"));
    assert.equal(job.maxTrainTokens, s.core.config.maxRunTokens);
    // A complete job: the run's trainer, where this worker has it compute, and every setting the run stored.
    assert.ok(job.trainer === "llama.cpp");
    assert.deepEqual([job.options.device, job.options.gpuLayers], ["cpu", 0]);
    assert.deepEqual(job.lrSchedule, {
      kind: running.config.lrSchedule,
      warmupSteps: 0,
      minFraction: running.config.lrMinFraction,
    });
    assert.deepEqual(
      [job.optimizer, job.packing, job.contextSize, job.outputType, job.threads],
      ["adamw", true, running.config.contextSize, running.config.outputType, 1],
    );
    const samples = fs.readFileSync(job.samplesFile!, "utf8").split("\n").filter(Boolean);
    assert.deepEqual(
      samples.map((line) => JSON.parse(line).input),
      pairs.map((p) => p.input),
    );
    assert.equal(job.evalSamplesFile, null);

    trainer.log("epoch 1: loss 4.9");
    await s.logged(id, /epoch 1: loss 4\.9$/);
    trainer.progress();
    await until("the first progress in the stats", async () => (await s.run(id)).stats.step === 1);
    trainer.progress({ evalLoss: 3.5 });
    // An evaluation is stored at once.
    const evaluated = await until("the evaluation in the stats", async () => {
      const run = await s.run(id);
      return run.stats.evalLossSeries?.length === 1 && run;
    });
    assert.deepEqual(evaluated.stats.evalLossSeries, [{ step: 2, epoch: 1, evalLoss: 3.5 }]);

    const stats = trainer.complete({ bestEpoch: 1, warnings: ["eval loss rose"] });
    const ready = await s.logged(id, /run READY: served as/);
    assert.equal(ready.status, "READY");
    assert.equal(ready.error, null);
    assert.equal(ready.modelPath, s.file(id, "adapter.gguf"));
    // The trainer's totals, and the whole attempt's seconds (what the next runs' estimates are measured on).
    const { runSeconds, ...totals } = ready.stats.final ?? {};
    assert.deepEqual(totals, stats);
    assert.ok(typeof runSeconds === "number" && runSeconds > 0, String(runSeconds));
    assert.deepEqual(ready.stats.warnings, ["eval loss rose"]);
    assert.equal(ready.stats.bestEpoch, 1);
    assert.deepEqual(
      ready.stats.lossSeries?.map((point) => point.step),
      [1, 2],
    );
    // What stays of a READY run: its adapter and its examples with their losses.
    await until("the work directory to be removed", async () => !fs.existsSync(s.file(id, "work")));
    assert.deepEqual(fs.readdirSync(s.file(id)).sort(), ["adapter.gguf", "examples.jsonl"]);
    const examples = await app.inject({
      url: `/conduit/finetuning/${id}/examples?sort=index`,
      headers: asAlice,
    });
    assert.equal(examples.statusCode, 200, examples.body);
    assert.deepEqual(
      examples
        .json()
        .map((e: { input: string; loss: number; tokens: number }) => [e.input, e.loss, e.tokens]),
      pairs.map((p, i) => [p.input, 1 + i / 10, 3 + i]),
    );
    const artifact = await app.inject({ url: `/conduit/finetuning/${id}/artifact`, headers: asAlice });
    assert.equal(artifact.statusCode, 200);
  });

  test("a full run is served from its own model, the base's context length restored", async (t) => {
    const s = await setup(t);
    const id = await s.startRun({ method: "full", epochs: 1 });
    const trainer = await s.trainer.started();
    assert.equal(trainer.job.method, "full");
    assert.equal(trainer.job.outputPath, s.file(id, "model.gguf"));
    // As llama.cpp's save does: the model written has the training window as its context length.
    const contextLength = async (file: string) => {
      const { metadata } = await readGgufFileInfo(file, { readTensorInfo: false, logWarnings: false });
      const key = `${metadata.general.architecture}.context_length`;
      return {
        key,
        value: (metadata as unknown as Record<string, Record<string, unknown>>)[metadata.general.architecture]
          ?.context_length,
      };
    };
    const base = await contextLength(trainer.job.baseModelPath);
    assert.equal(typeof base.value, "number");
    fs.copyFileSync(trainer.job.baseModelPath, trainer.job.outputPath);
    await writeGgufUint32(trainer.job.outputPath, base.key, 16);
    assert.equal((await contextLength(trainer.job.outputPath)).value, 16);
    trainer.progress();
    trainer.complete();
    const ready = await s.logged(id, /the fine-tuned model is served as/);
    assert.equal(
      (await contextLength(trainer.job.outputPath)).value,
      base.value,
      "the base's context length",
    );
    assert.equal(ready.status, "READY");
    assert.equal(ready.modelPath, s.file(id, "model.gguf"));
    await until("the work directory to be removed", async () => !fs.existsSync(s.file(id, "work")));
    assert.deepEqual(fs.readdirSync(s.file(id)).sort(), ["examples.jsonl", "model.gguf"]);
  });

  test("a cancel while the run is being prepared starts no trainer; CANCELLED, and nothing is left", async (t) => {
    const held = gate();
    const entered = gate();
    const late: { core?: Core } = {};
    const s = await setup(t, { prepareSamples: heldPreparation(() => late.core!, held.wait, entered.open) });
    late.core = s.core;
    const id = await s.startRun();
    await entered.wait;
    assert.ok(fs.existsSync(s.file(id, "work/train.jsonl")), "the samples are written");
    await s.core.runs.cancel("alice", id);
    held.open();
    await until("the run's files to be removed", async () => !fs.existsSync(s.file(id)));
    assert.equal(s.trainer.runs.length, 0, "no trainer was started");
    // The cancel's line is written with the status (what comes next is said there, not after it).
    const run = await s.run(id);
    assert.equal(run.status, "CANCELLED");
    assert.ok(
      run.logs.some((line) => /run cancelled by the user \(was RUNNING\); its trainer stops/.test(line)),
      run.logs.join("\n"),
    );
  });

  for (const how of ["cancel", "delete", "cancel on another server"] as const)
    test(`${how} while training: the trainer stops at a step boundary and the run's files are removed`, async (t) => {
      const s = await setup(t);
      const id = await s.startRun();
      const trainer = await s.trainer.started();
      trainer.progress();
      writeCheckpoint(trainer.job.checkpointDir);
      // What POST /conduit/finetuning/{id}/cancel and DELETE do.
      if (how === "cancel") await s.core.runs.cancel("alice", id);
      else if (how === "delete") await s.core.runs.delete("alice", id);
      else {
        // No event reaches this process: the next heartbeat finds the run cancelled.
        await s.core.runRepository.cancel("alice", id);
        await s.core.scheduler.tick();
      }
      await trainer.stopRequested();
      assert.deepEqual(trainer.stopRequests, ["cancel"], "asked to stop, not killed");
      assert.ok(fs.existsSync(s.file(id, "checkpoint")), "nothing is removed while the trainer runs");
      trainer.stopAtStepBoundary();
      await until("the run's files to be removed", async () => !fs.existsSync(s.file(id)));
      const left = await s.core.runRepository.getById(id);
      if (how === "delete") assert.equal(left, undefined);
      else {
        assert.equal(left?.status, "CANCELLED");
        // The cancel's line, written with the status, is the last: nothing comes after the end a follower sees.
        assert.match(
          (await s.run(id)).logs.at(-1) ?? "",
          /run cancelled by the user \(was RUNNING\); its trainer stops at a step boundary and its files are removed$/,
        );
      }
    });

  test("a lost lease: the trainer is killed and the run's files, checkpoint included, are left to the new attempt", async (t) => {
    const s = await setup(t);
    const repo = s.core.runRepository;
    const id = await s.startRun();
    const trainer = await s.trainer.started();
    trainer.progress();
    const checkpoint = writeCheckpoint(trainer.job.checkpointDir);
    // Another server's recovery takes the run over (this worker stalled past its lease) and claims it.
    assert.ok(await repo.heartbeat(id, s.core.scheduler.workerId, -1000));
    await repo.recoverExpired(3);
    assert.equal((await repo.claimNext("other-worker", 600_000))?.id, id);
    await s.core.scheduler.tick();
    await trainer.stopRequested();
    assert.deepEqual(trainer.stopRequests, ["kill"]);
    await s.logged(id, /lost this run's lease/);
    // Until this scheduler is done with the run (it does not hand back a run it no longer holds).
    await s.core.scheduler.close();
    const run = await s.run(id);
    assert.equal(run.status, "RUNNING", "the run is the other worker's attempt now");
    assert.equal(run.attempts, 2);
    assert.ok(fs.existsSync(checkpoint), "the checkpoint is left to the new attempt");
    assert.ok(fs.existsSync(s.file(id, "work/train.jsonl")), "so is the work directory");
    assert.equal(await repo.updateStats(id, "other-worker", { step: 5 }), true, "the other worker holds it");
  });

  test("a trainer that completes after its lease was lost leaves the run to the new attempt", async (t) => {
    const s = await setup(t);
    const repo = s.core.runRepository;
    const id = await s.startRun();
    const trainer = await s.trainer.started();
    trainer.progress();
    assert.ok(await repo.heartbeat(id, s.core.scheduler.workerId, -1000));
    await repo.recoverExpired(3);
    assert.equal((await repo.claimNext("other-worker", 600_000))?.id, id);
    // The trainer finishes before the next heartbeat would have noticed.
    trainer.complete();
    await s.logged(id, /lost this run's lease/);
    await s.core.scheduler.close();
    const run = await s.run(id);
    assert.equal(run.status, "RUNNING");
    assert.equal(run.modelPath, null);
    assert.ok(fs.existsSync(s.file(id, "adapter.gguf")), "the files are the new attempt's to replace");
  });

  for (const when of ["being prepared", "training"] as const)
    test(`shutdown while ${when}: close() stops the trainer and hands the run back to the queue`, async (t) => {
      const held = gate();
      const entered = gate();
      const late: { core?: Core } = {};
      const s = await setup(
        t,
        when === "being prepared"
          ? { prepareSamples: heldPreparation(() => late.core!, held.wait, entered.open) }
          : {},
      );
      late.core = s.core;
      const id = await s.startRun();
      let checkpoint: string | undefined;
      if (when === "being prepared") await entered.wait;
      else {
        const trainer = await s.trainer.started();
        trainer.progress();
        checkpoint = writeCheckpoint(trainer.job.checkpointDir);
      }
      const closed = s.core.scheduler.close();
      held.open();
      await closed;
      if (when === "being prepared") assert.equal(s.trainer.runs.length, 0, "no trainer was started");
      else assert.deepEqual(s.trainer.runs[0]?.stopRequests, ["kill"]);
      const run = await s.run(id);
      assert.equal(run.status, "QUEUED");
      assert.equal(run.attempts, 0, "a clean hand-back is not a failed attempt");
      assert.match(run.logs.at(-1) ?? "", /run re-queued: the server shut down while it was training/);
      if (checkpoint) assert.ok(fs.existsSync(checkpoint), "the checkpoint stays for the next attempt");
      assert.equal(fs.existsSync(s.file(id, "work")), false, "the work directory goes");
    });

  for (const how of ["fails", "crashes", "finds the disk full"] as const)
    test(`a trainer that ${how} fails the run with its reason; nothing of the run is kept`, async (t) => {
      const s = await setup(t);
      const id = await s.startRun();
      const trainer = await s.trainer.started();
      trainer.progress();
      writeCheckpoint(trainer.job.checkpointDir);
      const ended = new Promise((resolve) => s.core.runEvents.once("ended", (...args) => resolve(args)));
      if (how === "fails") trainer.fail("could not load the base model: bad magic");
      else if (how === "crashes") trainer.crash("SIGSEGV");
      else trainer.fail("ENOSPC: no space left on device, write '/srv/conduit/runs/x/checkpoint.bin'", true);
      // A full disk is told in the words of the API's 507, without the system's text (a server path).
      const reason = {
        fails: "could not load the base model: bad magic",
        crashes: "trainer process was killed by SIGSEGV",
        "finds the disk full": OUT_OF_SPACE_RUN,
      }[how];
      assert.deepEqual(await ended, [id, "FAILED"]);
      const run = await until("the run's files to be removed", async () => {
        const found = await s.run(id);
        return !fs.existsSync(s.file(id)) && found;
      });
      assert.equal(run.status, "FAILED");
      assert.equal(run.error, reason);
      assert.equal(run.logs.at(-1)?.replace(/^\S+ \S+ /, ""), `run failed: ${reason}`);
      assert.equal(run.attempts, 1, "a trainer's failure is not retried");
    });

  test("a run whose worker died is re-queued (its work directory removed, its checkpoint kept) and trained again", async (t) => {
    const s = await setup(t, {}, { start: false });
    const repo = s.core.runRepository;
    const id = await s.startRun();
    // A worker claimed the run and died: its lease has run out.
    assert.equal((await repo.claimNext("crashed-worker", -1))?.id, id);
    fs.mkdirSync(s.file(id, "work"), { recursive: true });
    fs.writeFileSync(s.file(id, "work/stale.jsonl"), "{}\n");
    const checkpoint = writeCheckpoint(s.file(id, "checkpoint"));
    s.core.scheduler.start();
    const trainer = await s.trainer.started();
    const running = await s.run(id);
    assert.equal(running.attempts, 2);
    // The log says where the next attempt starts: from the checkpoint the dead one wrote, not the base.
    assert.ok(
      running.logs.some((line) =>
        /run re-queued: the server stopped while it was training; it resumes from its checkpoint at step 1$/.test(
          line,
        ),
      ),
      running.logs.join("\n"),
    );
    assert.ok(!running.logs.some((line) => line.includes("from the base model")), running.logs.join("\n"));
    assert.ok(running.logs.some((line) => line.includes("(attempt 2)")));
    assert.equal(fs.existsSync(s.file(id, "work/stale.jsonl")), false, "the dead attempt's work is gone");
    assert.ok(fs.existsSync(checkpoint), "the checkpoint is there to resume from");
    trainer.progress();
    trainer.complete();
    assert.equal((await s.logged(id, /run READY/)).status, "READY");
  });

  test("a run whose workers keep dying is FAILED after maxAttempts starts, without another trainer", async (t) => {
    const s = await setup(t, { maxAttempts: 2 }, { start: false });
    const repo = s.core.runRepository;
    const id = await s.startRun();
    assert.equal((await repo.claimNext("crashed-1", -1))?.id, id);
    await repo.recoverExpired(2);
    assert.equal((await repo.claimNext("crashed-2", -1))?.id, id);
    const ended = new Promise((resolve) => s.core.runEvents.once("ended", (...args) => resolve(args)));
    await s.core.scheduler.tick();
    assert.deepEqual(await ended, [id, "FAILED"]);
    const run = await s.run(id);
    assert.equal(run.status, "FAILED");
    assert.match(run.error ?? "", /stopped without finishing too many times/);
    assert.match(run.logs.at(-1) ?? "", /run failed: its trainer stopped without finishing 2 times/);
    assert.equal(s.trainer.runs.length, 0);
  });

  test("crash recovery's log lines come with the status they explain: a follower gets them before the stream ends", async (t) => {
    const s = await setup(t, { maxAttempts: 2 }, { start: false });
    const repo = s.core.runRepository;
    const id = await s.startRun();
    assert.equal((await repo.claimNext("crashed-1", -1))?.id, id);
    const events = await s.core.runs.follow("alice", id);
    const seen: string[] = [];
    const followed = (async () => {
      for await (const event of events)
        seen.push(
          event.type === "log"
            ? `log ${event.line}`
            : event.type === "status"
              ? `status ${event.status}`
              : event.type,
        );
    })();
    await until("the follower to have the log so far", async () => seen.some((e) => e === "status RUNNING"));
    await repo.recoverExpired(2);
    assert.equal((await repo.claimNext("crashed-2", -1))?.id, id);
    await repo.recoverExpired(2);
    await followed;
    const ending = seen.slice(-2);
    assert.match(
      ending[0] ?? "",
      /^log .*run failed: its trainer stopped without finishing 2 times/,
      seen.join("\n"),
    );
    assert.equal(ending[1], "status FAILED");
    assert.ok(
      seen.some((e) => /run re-queued: the server stopped while it was training/.test(e)),
      seen.join("\n"),
    );
  });

  test("the token limit goes to the trainer, and a run over it fails before its first step", async (t) => {
    const s = await setup(t, { maxRunTokens: 50 });
    const id = await s.startRun();
    const trainer = await s.trainer.started();
    assert.equal(trainer.job.maxTrainTokens, 50);
    // What the trainer says when it has tokenized the samples (trainer.test.ts checks the real one).
    const reason =
      "the run's samples come to 120 tokens, more than a run may train on (CONDUIT_MAX_RUN_TOKENS: 50)";
    trainer.fail(reason);
    const run = await until("the run to fail", async () => {
      const found = await s.run(id);
      return found.status === "FAILED" && found;
    });
    assert.equal(run.error, reason);
    // Not one step: the stats hold only when the attempt started.
    assert.deepEqual(Object.keys(run.stats), ["startedAt"]);
  });

  test("the heartbeat renews the lease of a run in training", async (t) => {
    const s = await setup(t);
    const id = await s.startRun();
    const trainer = await s.trainer.started();
    const lease = async () =>
      (
        await s.core.db.kysely
          .selectFrom("runs")
          .select("lease_expires_at")
          .where("id", "=", id)
          .executeTakeFirstOrThrow()
      ).lease_expires_at;
    // The lease is about to run out (600 s after the claim, now 5 s from now) when the heartbeat comes.
    assert.ok(await s.core.runRepository.heartbeat(id, s.core.scheduler.workerId, 5_000));
    const before = await lease();
    await s.core.scheduler.tick();
    const after = await lease();
    assert.ok(before && after && after > before, `lease ${before} → ${after}`);
    assert.deepEqual(trainer.stopRequests, []);
    assert.equal((await s.run(id)).status, "RUNNING");
  });

  test("the events stream follows a run live until it ends", async (t) => {
    const s = await setup(t, {}, { http: true });
    const id = await s.startRun();
    const trainer = await s.trainer.started();
    const address = await s.app!.listen({ port: 0, host: "127.0.0.1" });
    const response = await fetch(`${address}/conduit/finetuning/${id}/events`, { headers: asAlice });
    assert.equal(response.status, 200);
    assert.match(response.headers.get("content-type") ?? "", /^text\/event-stream/);
    const body = response.text();
    trainer.log("live line");
    trainer.progress();
    trainer.progress({ evalLoss: 3 });
    // Not stored before the run ends (less than a second after the evaluation): the final stats carry it.
    trainer.progress();
    trainer.complete();
    const events = (await body)
      .split("\n\n")
      .filter((b) => b.trim())
      .map((b) => ({
        event: b.match(/^event: (.*)$/m)?.[1],
        data: JSON.parse(b.match(/^data: (.*)$/m)?.[1] ?? "null"),
      }));
    assert.ok(events.some((e) => e.event === "log" && e.data.line.includes("run queued")));
    assert.ok(events.some((e) => e.event === "log" && e.data.line.includes("live line")));
    assert.ok(events.some((e) => e.event === "stats" && e.data.step === 3));
    const statuses = events.filter((e) => e.event === "status").map((e) => e.data.status);
    assert.equal(statuses[0], "RUNNING");
    assert.equal(statuses.at(-1), "READY");
    // The stream ends at the final status, and the line that says READY reached it first: the two are one commit.
    const lastLine = events.findLastIndex((e) => e.event === "log");
    assert.match(events[lastLine]?.data.line, /run READY: served as/);
    assert.ok(lastLine < events.findLastIndex((e) => e.event === "status"));
    const missing = await fetch(`${address}/conduit/finetuning/ft_missing/events`, { headers: asAlice });
    assert.equal(missing.status, 404);
  });
});
