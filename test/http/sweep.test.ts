import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { Readable } from "node:stream";
import { test, type TestContext } from "node:test";
import { loadConfig } from "../../src/config.ts";
import { createCore, type Core } from "../../src/core.ts";
import { startServer } from "../../src/server.ts";
import { AdapterRepository } from "../../src/store/AdapterRepository.ts";
import { DatasetRepository } from "../../src/store/DatasetRepository.ts";
import { Sweeper } from "../../src/store/Sweeper.ts";
import { testEnv, type TestEnv } from "../lib/helper.ts";
import { until } from "../lib/wait.ts";

const explicit = { baseModelName: "tiny", epochs: 1, lr: 0.001, loraRank: 4 } as const;

/** A run in `status`, made the way a worker would, with `files` (relative paths) in its directory. */
async function runIn(
  core: Core,
  datasetId: string,
  status: "QUEUED" | "RUNNING" | "READY" | "FAILED" | "CANCELLED",
  files: string[],
): Promise<string> {
  const run = await core.runs.create("alice", { datasetID: datasetId, ...explicit });
  if (status === "CANCELLED") await core.runs.cancel("alice", run.id);
  else if (status !== "QUEUED") {
    const claimed = await core.runRepository.claimNext("crashed-worker", 60_000);
    assert.equal(claimed?.id, run.id);
    if (status !== "RUNNING")
      await core.runRepository.finish(run.id, "crashed-worker", {
        status,
        ...(status === "READY" ? { modelPath: core.blobs.pathOf(`runs/${run.id}/adapter.gguf`) } : {}),
        ...(status === "FAILED" ? { error: "the trainer crashed" } : {}),
      });
  }
  writeFiles(core, run.id, files);
  return run.id;
}

function writeFiles(core: Core, runId: string, files: string[]): void {
  fs.mkdirSync(core.blobs.pathOf(`runs/${runId}`), { recursive: true });
  for (const file of files) {
    const full = core.blobs.pathOf(`runs/${runId}/${file}`);
    fs.mkdirSync(path.dirname(full), { recursive: true });
    fs.writeFileSync(full, "left by a crash");
  }
}

/** The files under a run's directory, or `null` when it has none. */
function filesOf(core: Core, runId: string): string[] | null {
  const dir = core.blobs.pathOf(`runs/${runId}`);
  if (!fs.existsSync(dir)) return null;
  return (fs.readdirSync(dir, { recursive: true }) as string[])
    .filter((name) => fs.statSync(path.join(dir, name)).isFile())
    .sort();
}

/** A core on `env` without a server (as the CLI makes one) and a dataset of alice's with one pair. */
async function coreWithDataset(t: TestContext, env: TestEnv) {
  const core = await createCore(loadConfig(env.env));
  t.after(() => core.close());
  const ds = await core.datasets.create("alice", "d");
  await core.datasets.upload("alice", ds.id, {
    name: "a.jsonl",
    source: Readable.from(['{"input":"ping","output":"pong"}\n']),
  });
  return { core, ds };
}

test("the server sweeps what crashes and ended runs left, at start and then periodically", async (t) => {
  const env = await testEnv(t, "sqlite", { CONDUIT_SWEEP_INTERVAL_MS: "100", CONDUIT_PORT: "0" });
  // Another process on the same data dir (as `conduit` the CLI is) makes the state a crash leaves.
  const { core, ds } = await coreWithDataset(t, env);
  // (Workers claim the oldest QUEUED run, so the queued one comes last.)
  const running = await runIn(core, ds.id, "RUNNING", ["work/base-f32.gguf"]);
  const ready = await runIn(core, ds.id, "READY", ["adapter.gguf", "examples.jsonl", "work/base-f32.gguf"]);
  const failed = await runIn(core, ds.id, "FAILED", ["work/base-f32.gguf"]);
  const cancelled = await runIn(core, ds.id, "CANCELLED", []);
  const failedLater = await runIn(core, ds.id, "FAILED", []);
  fs.rmdirSync(core.blobs.pathOf(`runs/${failedLater}`));
  const queued = await runIn(core, ds.id, "QUEUED", ["work/base-f32.gguf", "checkpoint/adapter.gguf"]);
  const deleted = "ft_01AAAAAAAAAAAAAAAAAAAAAAAA";
  writeFiles(core, deleted, ["adapter.gguf"]);

  const server = await startServer(loadConfig(env.env));
  t.after(() => server.close());
  // At start: every run that is not training loses its work directory; a QUEUED run keeps its
  // checkpoint to resume from; ended runs that serve nothing, and deleted ones, lose everything.
  assert.deepEqual(filesOf(core, queued), ["checkpoint/adapter.gguf"]);
  assert.deepEqual(filesOf(core, running), ["work/base-f32.gguf"]);
  assert.deepEqual(filesOf(core, ready), ["adapter.gguf", "examples.jsonl"]);
  assert.equal(filesOf(core, failed), null);
  assert.equal(filesOf(core, cancelled), null);
  assert.equal(filesOf(core, deleted), null);

  // While it runs: a partial upload from a crash an hour ago, and the empty directory a run that
  // failed since leaves (its trainer's work directory is removed after the run is FAILED).
  const tmp = path.join(env.dataDir, "blobs", ".tmp");
  const stale = path.join(tmp, "crashed-upload");
  fs.writeFileSync(stale, "half an upload");
  const twoHoursAgo = new Date(Date.now() - 2 * 60 * 60 * 1000);
  fs.utimesSync(stale, twoHoursAgo, twoHoursAgo);
  const fresh = path.join(tmp, "upload-in-progress");
  fs.writeFileSync(fresh, "another server is writing this");
  writeFiles(core, failedLater, []);
  // A queued run's work directory may be a trainer's that is starting: only a start removes it.
  writeFiles(core, queued, ["work/base-f32.gguf"]);

  await until("the sweep", () => !fs.existsSync(stale) && filesOf(core, failedLater) === null, undefined, {
    timeoutMs: 3000,
  });
  assert.equal(fs.existsSync(stale), false, "the stale temp file is swept while the server runs");
  assert.equal(filesOf(core, failedLater), null, "the failed run's (empty) directory is swept");
  assert.equal(fs.existsSync(fresh), true, "a temp file in use stays");
  assert.deepEqual(filesOf(core, queued), ["checkpoint/adapter.gguf", "work/base-f32.gguf"]);
  assert.deepEqual(filesOf(core, running), ["work/base-f32.gguf"]);
});

test("a file blob no record holds (a crash between storing and recording) is swept once an hour old", async (t) => {
  const env = await testEnv(t, "sqlite");
  const core = await createCore(loadConfig(env.env));
  t.after(() => core.close());
  const ds = await core.datasets.create("alice", "d");
  const kept = await core.datasets.upload("alice", ds.id, {
    name: "a.jsonl",
    source: Readable.from(['{"input":"ping","output":"pong"}\n']),
  });
  const twoHoursAgo = new Date(Date.now() - 2 * 60 * 60 * 1000);
  const blob = (key: string, old: boolean) => {
    const full = core.blobs.pathOf(key);
    fs.mkdirSync(path.dirname(full), { recursive: true });
    if (!fs.existsSync(full)) fs.writeFileSync(full, '{"input":"a","output":"b"}\n');
    if (old) fs.utimesSync(full, twoHoursAgo, twoHoursAgo);
    return full;
  };
  const recordedOld = blob(kept.blob, true);
  // Stored, then the server died before the record was written (or after a delete removed it).
  const orphan = blob(`files/${ds.id}/file_01AAAAAAAAAAAAAAAAAAAAAAAA`, true);
  // Stored a moment ago: maybe an upload being recorded right now.
  const young = blob(`files/${ds.id}/file_01BBBBBBBBBBBBBBBBBBBBBBBB`, false);
  // What a crash in the middle of deleting a dataset leaves: its directory, one blob in it.
  const deletedDir = core.blobs.pathOf("files/ds_01CCCCCCCCCCCCCCCCCCCCCCCC");
  const deletedBlob = blob("files/ds_01CCCCCCCCCCCCCCCCCCCCCCCC/file_01DDDDDDDDDDDDDDDDDDDDDDDD", true);
  fs.utimesSync(deletedDir, twoHoursAgo, twoHoursAgo);

  const sweeper = new Sweeper(
    core.blobs,
    core.runRepository,
    new DatasetRepository(core.db.kysely),
    core.log,
    {
      intervalMs: 60_000,
    },
  );
  const report = await sweeper.sweep();
  assert.deepEqual(
    report.orphanBlobs.sort(),
    [
      `files/${ds.id}/file_01AAAAAAAAAAAAAAAAAAAAAAAA`,
      "files/ds_01CCCCCCCCCCCCCCCCCCCCCCCC/file_01DDDDDDDDDDDDDDDDDDDDDDDD",
    ].sort(),
  );
  assert.equal(fs.existsSync(orphan), false);
  assert.equal(fs.existsSync(deletedBlob), false);
  assert.equal(fs.existsSync(deletedDir), true, "its directory was changed just now (the blob went)");
  assert.equal(fs.existsSync(recordedOld), true, "a recorded blob stays, however old");
  assert.equal(fs.existsSync(young), true, "a young blob may be an upload being recorded");
  assert.equal((await core.datasets.getFile("alice", ds.id, kept.id)).ioPairsCount, 1);

  // An hour later the empty directory goes too.
  fs.utimesSync(deletedDir, twoHoursAgo, twoHoursAgo);
  await sweeper.sweep();
  assert.equal(fs.existsSync(deletedDir), false, "an empty dataset directory an hour old is removed");
  assert.equal(fs.existsSync(core.blobs.pathOf(`files/${ds.id}`)), true);
});

test("a run taken back from a dead worker loses its work directory, not its checkpoint", async (t) => {
  const env = await testEnv(t, "sqlite", { CONDUIT_TRAIN_CONCURRENCY: "0" });
  const { core, ds } = await coreWithDataset(t, env);
  const run = await runIn(core, ds.id, "QUEUED", []);
  // A worker claims it with a lease that runs out at once, writes, and dies.
  assert.equal((await core.runRepository.claimNext("dead-worker", 1))?.id, run);
  writeFiles(core, run, ["work/base-f32.gguf", "work/examples.jsonl", "checkpoint/adapter.gguf"]);
  await new Promise((resolve) => setTimeout(resolve, 10));

  await core.scheduler.tick();
  assert.equal((await core.runRepository.getById(run))?.status, "QUEUED");
  assert.deepEqual(filesOf(core, run), ["checkpoint/adapter.gguf"]);
});

test("a killed upload's temp file is swept at the next start, however new; another host's or a live process's stays", async (t) => {
  const env = await testEnv(t, "sqlite");
  const tmp = path.join(env.dataDir, "blobs", ".tmp");
  fs.mkdirSync(tmp, { recursive: true });
  // A process of this host that is gone: a pid no process has (pids stay below 2^22 on Linux).
  const dead = path.join(tmp, `${os.hostname()}~4194399~0badcafe~${Date.now()}-0123456789abcdef`);
  // The last server of a container had this process's pid (1, say), but it was another instance.
  const samePid = path.join(tmp, `${os.hostname()}~${process.pid}~deadbeef~${Date.now()}-0123456789abcdef`);
  const otherHost = path.join(tmp, `another-host~4194399~0badcafe~${Date.now()}-0123456789abcdef`);
  const live = path.join(tmp, `${os.hostname()}~${process.ppid}~0badcafe~${Date.now()}-0123456789abcdef`);
  for (const file of [dead, samePid, otherHost, live]) fs.writeFileSync(file, "part of an upload");
  const core = await createCore(loadConfig(env.env));
  t.after(() => core.close());
  const report = await new Sweeper(
    core.blobs,
    core.runRepository,
    new DatasetRepository(core.db.kysely),
    core.log,
    { intervalMs: 600_000 },
  ).sweep({
    atStart: true,
  });
  assert.deepEqual(report.tempFiles.sort(), [path.basename(dead), path.basename(samePid)].sort());
  assert.equal(fs.existsSync(otherHost), true, "another server sharing the store may still be writing it");
  assert.equal(fs.existsSync(live), true, "its process still runs");
  // This process's own temp files are never abandoned.
  const own = core.blobs.tempPath();
  fs.writeFileSync(own, "mine");
  assert.deepEqual((await core.blobs.sweepTemp()).length, 0);
  assert.equal(fs.existsSync(own), true);
});

test("an imported adapter's file without its record (a crash in an import or a delete) is swept once old", async (t) => {
  const env = await testEnv(t, "sqlite");
  const core = await createCore(loadConfig(env.env));
  t.after(() => core.close());
  const twoHoursAgo = new Date(Date.now() - 2 * 60 * 60 * 1000);
  const file = (id: string, old: boolean) => {
    const full = core.blobs.pathOf(`adapters/${id}.gguf`);
    fs.mkdirSync(path.dirname(full), { recursive: true });
    fs.writeFileSync(full, "GGUF");
    if (old) fs.utimesSync(full, twoHoursAgo, twoHoursAgo);
    return full;
  };
  const repository = new AdapterRepository(core.db.kysely);
  const recorded = file("ad_01AAAAAAAAAAAAAAAAAAAAAAAA", true);
  await repository.insert({
    id: "ad_01AAAAAAAAAAAAAAAAAAAAAAAA",
    userId: "alice",
    name: "kept",
    baseModel: "tiny",
    format: "gguf",
    rank: 4,
    alpha: 8,
    weights: 1,
    sizeBytes: 4,
    path: recorded,
    createdAt: "2026-01-01 00:00:00.000",
  });
  const orphan = file("ad_01BBBBBBBBBBBBBBBBBBBBBBBB", true);
  const young = file("ad_01CCCCCCCCCCCCCCCCCCCCCCCC", false);
  const sweeper = new Sweeper(
    core.blobs,
    core.runRepository,
    new DatasetRepository(core.db.kysely),
    core.log,
    {
      intervalMs: 60_000,
      adapters: repository,
    },
  );
  const report = await sweeper.sweep();
  assert.deepEqual(report.orphanBlobs, ["adapters/ad_01BBBBBBBBBBBBBBBBBBBBBBBB.gguf"]);
  assert.equal(fs.existsSync(orphan), false);
  assert.equal(fs.existsSync(recorded), true, "a recorded adapter's file stays, however old");
  assert.equal(fs.existsSync(young), true, "a young file may be an import being recorded");
});
