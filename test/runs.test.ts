import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { describe, test, type TestContext } from "node:test";
import type { FastifyInstance } from "fastify";
import { asAlice, asBob, backends, build, KEY_A, testEnv } from "./helper.ts";
import { loadConfig } from "../src/config.ts";
import { createCore, type Core, type CoreOverrides } from "../src/core.ts";
import { LORA_TARGETS } from "../src/train/loraTargets.ts";

// Run lifecycle over HTTP; training itself is covered by the trainer tests.
const models: CoreOverrides = {};

async function datasetWithPairs(app: FastifyInstance, name = "d") {
  const ds = (
    await app.inject({ method: "POST", url: "/conduit/dataset", headers: asAlice, payload: { name } })
  ).json();
  await app.inject({
    method: "POST",
    url: `/conduit/dataset/${ds.id}/upload`,
    headers: asAlice,
    payload: {
      name: "a.jsonl",
      ioPairs: [
        { input: "a", output: "b" },
        { input: "c", output: "d" },
      ],
    },
  });
  return ds as { id: string; name: string };
}

/** The core behind a test app (helper.ts decorates the app with it). */
function coreOf(app: FastifyInstance): Core {
  return (app as FastifyInstance & { conduit: Core }).conduit;
}

async function createRun(app: FastifyInstance, payload: Record<string, unknown>) {
  const res = await app.inject({ method: "POST", url: "/conduit/finetuning", headers: asAlice, payload });
  assert.equal(res.statusCode, 200, res.body);
  return res.json() as { id: string; status: string; config: Record<string, unknown> };
}

/** Polls a run until it has ended. */
async function waitUntilEnded(app: FastifyInstance, id: string, timeoutMs = 120_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const run = (await app.inject({ url: `/conduit/finetuning/${id}`, headers: asAlice })).json();
    if (["READY", "FAILED", "CANCELLED"].includes(run.status))
      return run as { status: string; logs: string[] };
    if (Date.now() > deadline) throw new Error(`timed out; run is ${run.status}: ${run.logs.join("\n")}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** A core without HTTP (the queue's own view) and a dataset with one pair. */
async function queueCore(t: TestContext, backend: "sqlite" | "postgres") {
  const env = await testEnv(t, backend);
  const core = await createCore(loadConfig(env.env), models);
  t.after(() => core.close());
  const ds = await core.datasets.create("alice", "d");
  await core.datasets.upload("alice", ds.id, {
    name: "a.jsonl",
    source: Readable.from(['{"input":"a","output":"b"}\n']),
  });
  return { core, ds, env };
}

for (const backend of backends()) {
  describe(`runs (${backend})`, () => {
    test("create returns a queued run with every seed field and the effective config", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const res = await app.inject({
        method: "POST",
        url: "/conduit/finetuning",
        headers: asAlice,
        payload: {
          datasetID: ds.id,
          baseModelName: "tiny",
          lr: 0.001,
          epochs: 2,
          name: "first",
          trackerProject: "p",
        },
      });
      assert.equal(res.statusCode, 200, res.body);
      const run = res.json();
      assert.match(run.id, /^ft_/);
      assert.equal(run.userId, "alice");
      assert.equal(run.datasetId, ds.id);
      assert.equal(run.datasetID, ds.id);
      assert.equal(run.datasetName, "d");
      assert.equal(run.name, "first");
      assert.equal(run.ioPairsCount, 2);
      assert.equal(run.status, "QUEUED");
      assert.match(run.trackerURL, new RegExp(`/ui/runs/${run.id}$`));
      assert.ok(Array.isArray(run.logs) && run.logs.length === 1 && run.logs[0].endsWith("run queued"));
      assert.deepEqual(run.stats, {});
      assert.equal(run.error, null);
      assert.equal(run.config.lr, 0.001);
      assert.equal(run.config.epochs, 2);
      assert.equal(run.config.complexity, 1);
      assert.equal(run.config.steps, null);
      assert.equal(run.config.baseModelName, "tiny");
      assert.equal(run.config.trackerProject, "p");
      assert.equal(run.config.trackerEntity, null);

      const byName = await app.inject({
        method: "POST",
        url: "/conduit/finetuning",
        headers: asAlice,
        payload: { datasetName: "d", baseModelName: "tiny" },
      });
      assert.equal(byName.statusCode, 200, byName.body);
      assert.equal(byName.json().datasetId, ds.id);
      assert.equal(byName.json().name, "d-tiny");

      const one = await app.inject({
        url: `/conduit/finetuning/${run.id}`,
        headers: { authorization: `Token ${KEY_A}` },
      });
      assert.deepEqual(one.json(), run);
      const list = await app.inject({ url: "/conduit/finetuning", headers: asAlice });
      assert.deepEqual(
        list.json().map((r: { id: string }) => r.id),
        [byName.json().id, run.id],
      );
      const page = await app.inject({ url: "/conduit/finetuning?limit=1&offset=1", headers: asAlice });
      assert.deepEqual(
        page.json().map((r: { id: string }) => r.id),
        [run.id],
      );
    });

    test("bad configs are 400/404 naming the field, and nothing is queued", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const empty = (
        await app.inject({
          method: "POST",
          url: "/conduit/dataset",
          headers: asAlice,
          payload: { name: "empty" },
        })
      ).json();
      const cases: [Record<string, unknown>, number, string][] = [
        [{ baseModelName: "tiny" }, 400, "datasetID"],
        [{ datasetID: ds.id, baseModelName: "tiny", lr: 0 }, 400, "lr"],
        [{ datasetID: ds.id, baseModelName: "tiny", lr: -1 }, 400, "lr"],
        [{ datasetID: ds.id, baseModelName: "tiny", lr: "fast" }, 400, "lr"],
        [{ datasetID: ds.id, baseModelName: "tiny", epochs: 0 }, 400, "epochs"],
        [{ datasetID: ds.id, baseModelName: "tiny", epochs: 1.5 }, 400, "epochs"],
        [{ datasetID: ds.id, baseModelName: "tiny", complexity: 0 }, 400, "complexity"],
        [{ datasetID: ds.id, baseModelName: "tiny", complexity: 1.5 }, 400, "complexity"],
        [{ datasetID: ds.id, baseModelName: "tiny", steps: 0 }, 400, "steps"],
        [{ datasetID: ds.id, baseModelName: "tiny", epoch: 3 }, 400, "epoch"],
        [{ datasetID: ds.id }, 400, "baseModelName"],
        [{ datasetID: ds.id, baseModelName: "nope" }, 404, "baseModelName"],
        [{ datasetID: "ds_missing", baseModelName: "tiny" }, 404, "datasetID"],
        [{ datasetName: "missing", baseModelName: "tiny" }, 404, "datasetName"],
        [{ datasetID: empty.id, baseModelName: "tiny" }, 400, "datasetID"],
      ];
      for (const [payload, status, param] of cases) {
        const res = await app.inject({
          method: "POST",
          url: "/conduit/finetuning",
          headers: asAlice,
          payload,
        });
        assert.equal(res.statusCode, status, `${JSON.stringify(payload)} → ${res.body}`);
        assert.equal(res.json().error.param, param, res.body);
      }
      assert.deepEqual((await app.inject({ url: "/conduit/finetuning", headers: asAlice })).json(), []);
    });

    test("LoRA is the default method; explicit LoRA settings are stored; a full run stores null for them", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const lora = (s: Record<string, unknown>) => ({
        method: s.method,
        loraRank: s.loraRank,
        loraAlpha: s.loraAlpha,
        loraTargets: s.loraTargets,
      });
      const cases: [Record<string, unknown>, Record<string, unknown>][] = [
        [{}, { method: "lora", loraRank: 16, loraAlpha: 32, loraTargets: [...LORA_TARGETS] }],
        [{ method: "lora" }, { method: "lora", loraRank: 16, loraAlpha: 32, loraTargets: [...LORA_TARGETS] }],
        // alpha follows the rank unless given
        [{ loraRank: 4 }, { method: "lora", loraRank: 4, loraAlpha: 8, loraTargets: [...LORA_TARGETS] }],
        [
          { loraRank: 256, loraAlpha: 0.5, loraTargets: ["ffn_down", "attn_q"] },
          { method: "lora", loraRank: 256, loraAlpha: 0.5, loraTargets: ["ffn_down", "attn_q"] },
        ],
        [
          { loraRank: 1, loraAlpha: 4096 },
          { method: "lora", loraRank: 1, loraAlpha: 4096, loraTargets: [...LORA_TARGETS] },
        ],
        [{ method: "full" }, { method: "full", loraRank: null, loraAlpha: null, loraTargets: null }],
      ];
      for (const [settings, expected] of cases) {
        const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", ...settings });
        assert.deepEqual(lora(run.config), expected, JSON.stringify(settings));
        assert.equal(run.config.complexity, 1);
        const stored = (await app.inject({ url: `/conduit/finetuning/${run.id}`, headers: asAlice })).json();
        assert.deepEqual(lora(stored.config), expected, "as stored");
      }
    });

    test("bad LoRA settings are a 400 naming the field, and nothing is queued", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const cases: [Record<string, unknown>, string, RegExp][] = [
        [{ loraRank: 0 }, "loraRank", /"loraRank" must be >= 1/],
        [{ loraRank: 257 }, "loraRank", /"loraRank" must be <= 256/],
        [{ loraRank: 1.5 }, "loraRank", /"loraRank" must be integer/],
        [{ loraRank: "16" }, "loraRank", /"loraRank" must be integer/],
        [{ loraAlpha: 0 }, "loraAlpha", /"loraAlpha" must be > 0/],
        [{ loraAlpha: -1 }, "loraAlpha", /"loraAlpha" must be > 0/],
        [{ loraAlpha: 4097 }, "loraAlpha", /"loraAlpha" must be <= 4096/],
        [{ loraTargets: [] }, "loraTargets", /"loraTargets" must NOT have fewer than 1 items/],
        [{ loraTargets: "attn_q" }, "loraTargets", /"loraTargets" must be array/],
        [
          { loraTargets: ["attn_k"] },
          "loraTargets",
          /"attn_k" cannot be a LoRA target: .*no gradient.*KV cache/,
        ],
        [{ loraTargets: ["attn_q", "attn_v"] }, "loraTargets", /"attn_v" cannot be a LoRA target/],
        [
          { loraTargets: ["attn_q", "mlp"] },
          "loraTargets",
          /"mlp" is not a LoRA target; the targets are attn_q, /,
        ],
        [{ loraTargets: ["ffn_up", "ffn_up"] }, "loraTargets", /"loraTargets" must NOT have duplicate items/],
        [{ method: "qlora" }, "method", /"method" must be one of "lora", "full"/],
        [
          { method: "full", loraRank: 8 },
          "loraRank",
          /"loraRank" is a LoRA setting; leave it out with "method": "full"/,
        ],
        [{ method: "full", loraAlpha: 16 }, "loraAlpha", /"loraAlpha" is a LoRA setting/],
        [{ method: "full", loraTargets: ["attn_q"] }, "loraTargets", /"loraTargets" is a LoRA setting/],
      ];
      for (const [settings, param, message] of cases) {
        const res = await app.inject({
          method: "POST",
          url: "/conduit/finetuning",
          headers: asAlice,
          payload: { datasetID: ds.id, baseModelName: "tiny", ...settings },
        });
        assert.equal(res.statusCode, 400, `${JSON.stringify(settings)} → ${res.body}`);
        const { error } = res.json();
        assert.equal(error.code, "invalid_request", res.body);
        assert.equal(error.param, param, res.body);
        assert.match(error.message, message);
      }
      // The service refuses the same without the HTTP schema (the scheduler's and tests' way in).
      await assert.rejects(
        coreOf(app).runs.create("alice", { datasetID: ds.id, baseModelName: "tiny", loraTargets: [] }),
        /at least one target/,
      );
      await assert.rejects(
        coreOf(app).runs.create("alice", {
          datasetID: ds.id,
          baseModelName: "tiny",
          loraTargets: ["attn_q", "attn_q"],
        }),
        /lists a target twice/,
      );
      assert.deepEqual((await app.inject({ url: "/conduit/finetuning", headers: asAlice })).json(), []);
    });

    test("artifact: the owner downloads a READY run's file; 409 before READY, 404 for others, 401 without a key", async (t) => {
      const { app, config } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny" });
      const url = `/conduit/finetuning/${run.id}/artifact`;

      const queued = await app.inject({ url, headers: asAlice });
      assert.equal(queued.statusCode, 409, queued.body);
      assert.equal(queued.json().error.code, "conflict");
      assert.match(queued.json().error.message, new RegExp(`run ${run.id} is QUEUED, not READY`));
      const bobs = await app.inject({ url, headers: asBob });
      assert.equal(bobs.statusCode, 404, bobs.body);
      assert.equal(bobs.json().error.code, "not_found");
      assert.equal((await app.inject({ url })).statusCode, 401);
      assert.equal((await app.inject({ url, headers: { "x-api-key": "wrong-key-123" } })).statusCode, 401);

      // READY, as a worker finishes it (training itself is below and in training.test.ts).
      const file = path.join(config.dataDir, "adapter.gguf");
      const bytes = Buffer.concat([Buffer.from("GGUF"), Buffer.alloc(300_000, 7)]);
      fs.writeFileSync(file, bytes);
      const repo = coreOf(app).runRepository;
      assert.equal((await repo.claimNext("w", 60_000))?.id, run.id);
      assert.ok(await repo.finish(run.id, "w", { status: "READY", modelPath: file }));
      const res = await app.inject({ url, headers: asAlice });
      assert.equal(res.statusCode, 200, res.body);
      assert.equal(res.headers["content-type"], "application/octet-stream");
      assert.equal(res.headers["content-length"], String(bytes.length));
      assert.equal(res.headers["content-disposition"], `attachment; filename="${run.id}-lora.gguf"`);
      assert.ok(res.rawPayload.equals(bytes), "the downloaded bytes are the stored file");
      assert.equal((await app.inject({ url, headers: asBob })).statusCode, 404, "still not bob's");

      // The file gone from disk: a clear 404, not a 500, and no server path in it.
      fs.rmSync(file);
      const missing = await app.inject({ url, headers: asAlice });
      assert.equal(missing.statusCode, 404, missing.body);
      assert.equal(missing.json().error.code, "not_found");
      assert.match(
        missing.json().error.message,
        /is READY but its file .*-lora\.gguf is not in this server's storage/,
      );
      assert.ok(!missing.body.includes(config.dataDir), missing.body);

      const cancelled = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", method: "full" });
      await app.inject({
        method: "POST",
        url: `/conduit/finetuning/${cancelled.id}/cancel`,
        headers: asAlice,
      });
      const notReady = await app.inject({
        url: `/conduit/finetuning/${cancelled.id}/artifact`,
        headers: asAlice,
      });
      assert.equal(notReady.statusCode, 409);
      assert.match(notReady.json().error.message, /is CANCELLED, not READY/);
    });

    test("cancel a queued run; cancelling again is 409; delete", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const run = (
        await app.inject({
          method: "POST",
          url: "/conduit/finetuning",
          headers: asAlice,
          payload: { datasetID: ds.id, baseModelName: "tiny" },
        })
      ).json();
      const cancel = await app.inject({
        method: "POST",
        url: `/conduit/finetuning/${run.id}/cancel`,
        headers: asAlice,
      });
      assert.equal(cancel.statusCode, 200);
      assert.deepEqual(cancel.json(), { message: "SUCCESS" });
      const after = (await app.inject({ url: `/conduit/finetuning/${run.id}`, headers: asAlice })).json();
      assert.equal(after.status, "CANCELLED");
      assert.match(after.logs.at(-1), /cancelled by the user/);
      const again = await app.inject({
        method: "POST",
        url: `/conduit/finetuning/${run.id}/cancel`,
        headers: asAlice,
      });
      assert.equal(again.statusCode, 409);
      assert.equal(again.json().error.code, "conflict");
      const del = await app.inject({
        method: "DELETE",
        url: `/conduit/finetuning/${run.id}`,
        headers: asAlice,
      });
      assert.deepEqual(del.json(), { message: "SUCCESS" });
      assert.equal(
        (await app.inject({ url: `/conduit/finetuning/${run.id}`, headers: asAlice })).statusCode,
        404,
      );
      assert.equal(
        (await app.inject({ method: "DELETE", url: `/conduit/finetuning/${run.id}`, headers: asAlice }))
          .statusCode,
        404,
      );
      assert.equal(
        (await app.inject({ method: "POST", url: `/conduit/finetuning/${run.id}/cancel`, headers: asAlice }))
          .statusCode,
        404,
      );
    });

    test("the runs table is a job queue: claim, heartbeat, finish, crash recovery", async (t) => {
      const { core, ds } = await queueCore(t, backend);
      const first = await core.runs.create("alice", { datasetID: ds.id, baseModelName: "tiny" });
      const second = await core.runs.create("alice", { datasetID: ds.id, baseModelName: "tiny" });
      const repo = core.runRepository;

      const claimed = await repo.claimNext("w1", 60_000);
      assert.equal(claimed?.id, first.id);
      assert.equal(claimed?.status, "RUNNING");
      assert.equal((await repo.claimNext("w2", 60_000))?.id, second.id);
      assert.equal(await repo.claimNext("w3", 60_000), undefined);
      assert.equal(await repo.heartbeat(first.id, "w1", 60_000), true);
      assert.equal(await repo.heartbeat(first.id, "w2", 60_000), false, "only the holder renews");
      assert.equal(await repo.updateStats(first.id, "w1", { step: 3 }), true);
      assert.equal(await repo.finish(first.id, "w1", { status: "READY", modelPath: "/m.gguf" }), true);
      const ready = await core.runs.get("alice", first.id);
      assert.equal(ready.status, "READY");
      assert.deepEqual(ready.stats, { step: 3 });
      await assert.rejects(core.runs.cancel("alice", first.id), /cannot be cancelled/);

      // The second worker dies: once its lease runs out the run goes back to the queue.
      assert.equal(await repo.heartbeat(second.id, "w2", -1), true);
      const recovered = await repo.recoverExpired(3);
      assert.deepEqual(recovered, { requeued: [second.id], failed: [] });
      const requeued = await core.runs.get("alice", second.id);
      assert.equal(requeued.status, "QUEUED");
      assert.match(requeued.logs.at(-1) ?? "", /re-queued/);
      // Cancelled while running: the worker's heartbeat and finish see it and change nothing.
      assert.equal((await repo.claimNext("w4", 60_000))?.id, second.id);
      await core.runs.cancel("alice", second.id);
      assert.equal(await repo.heartbeat(second.id, "w4", 60_000), false);
      assert.equal(await repo.finish(second.id, "w4", { status: "READY" }), false);
      assert.equal((await core.runs.get("alice", second.id)).status, "CANCELLED");
      // Too many attempts: FAILED with the reason.
      const third = await core.runs.create("alice", { datasetID: ds.id, baseModelName: "tiny" });
      for (let i = 0; i < 3; i++) {
        assert.equal((await repo.claimNext("w", -1))?.id, third.id);
        await repo.recoverExpired(3);
      }
      const failed = await core.runs.get("alice", third.id);
      assert.equal(failed.status, "FAILED");
      assert.match(failed.error ?? "", /too many times/);
    });

    test("the queue is first in, first out, also for runs created in the same millisecond", async (t) => {
      const { core, ds } = await queueCore(t, backend);
      const created: string[] = [];
      for (let i = 0; i < 40; i++)
        created.push((await core.runs.create("alice", { datasetID: ds.id, baseModelName: "tiny" })).id);
      const claimed: string[] = [];
      for (
        let run = await core.runRepository.claimNext("w", 60_000);
        run;
        run = await core.runRepository.claimNext("w", 60_000)
      )
        claimed.push(run.id);
      assert.deepEqual(claimed, created);
      const listed = (await core.runs.list("alice", { limit: 100, offset: 0 })).map((r) => r.id);
      assert.deepEqual(listed, created.toReversed(), "the list is newest first");
    });

    test("log lines appended at once are all kept, in call order", async (t) => {
      const { core, ds, env } = await queueCore(t, backend);
      const run = await core.runs.create("alice", { datasetID: ds.id, baseModelName: "tiny" });
      const lines = Array.from({ length: 40 }, (_, i) => `line ${i}`);
      await Promise.all(lines.map((line) => core.runRepository.appendLog(run.id, line)));
      // Servers sharing one PostgreSQL database append to the same run (a cancel on one while
      // another trains it). SQLite is one server's alone.
      const other = backend === "postgres" ? await createCore(loadConfig(env.env), models) : undefined;
      if (other) t.after(() => other.close());
      await Promise.all(
        lines.flatMap((line) => [
          core.runRepository.appendLog(run.id, `a ${line}`),
          (other ?? core).runRepository.appendLog(run.id, `b ${line}`),
        ]),
      );
      const logs = (await core.runs.get("alice", run.id)).logs.map((l) => l.replace(/^\S+ \S+ /, ""));
      assert.equal(logs.length, 1 + 3 * lines.length);
      assert.deepEqual(logs.slice(1, 1 + lines.length), lines);
      for (const server of ["a", "b"])
        assert.deepEqual(
          logs.filter((l) => l.startsWith(`${server} `)),
          lines.map((l) => `${server} ${l}`),
        );
      const seqs = (await core.runRepository.logsSince(run.id, -1)).map((l) => l.seq);
      assert.deepEqual(seqs, [...seqs.keys()]);
    });

    test("a log line for a deleted run is dropped quietly (delete right after cancel)", async (t) => {
      const { core, ds } = await queueCore(t, backend);
      const run = await core.runs.create("alice", { datasetID: ds.id, baseModelName: "tiny" });
      await core.runs.cancel("alice", run.id);
      await core.runs.delete("alice", run.id);
      await core.runRepository.appendLog(run.id, "trainer stopped: partial files removed");
      assert.deepEqual(await core.runRepository.logsSince(run.id, -1), []);
      assert.equal(await core.runRepository.getById(run.id), undefined);
    });

    test("a cancel racing the run's end answers SUCCESS only when the run ends CANCELLED", async (t) => {
      const { core, ds } = await queueCore(t, backend);
      const repo = core.runRepository;
      const ids: string[] = [];
      for (let i = 0; i < 10; i++) {
        ids.push((await core.runs.create("alice", { datasetID: ds.id, baseModelName: "tiny" })).id);
        assert.ok(await repo.claimNext("w", 60_000));
      }
      await Promise.all(
        ids.map(async (id) => {
          const [cancel] = await Promise.allSettled([
            core.runs.cancel("alice", id),
            repo.finish(id, "w", { status: "READY", modelPath: "/m.gguf" }),
          ]);
          const final = (await core.runs.get("alice", id)).status;
          if (cancel.status === "fulfilled") assert.equal(final, "CANCELLED", `${id}: cancel said SUCCESS`);
          else {
            assert.match(String(cancel.reason), /READY and cannot be cancelled/);
            assert.equal(final, "READY");
          }
        }),
      );
    });
  });
}

test("artifact: a full run trained on the tiny model downloads as <run id>.gguf, the stored model byte for byte", async (t) => {
  const { app } = await build(t, "sqlite", { scheduler: { pollMs: 200, concurrency: 1 } });
  coreOf(app).scheduler.start();
  const ds = await datasetWithPairs(app);
  const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", method: "full", epochs: 1 });
  const ended = await waitUntilEnded(app, run.id);
  assert.equal(ended.status, "READY", ended.logs.join("\n"));
  const stored = await coreOf(app).runs.artifact("alice", run.id);
  const res = await app.inject({ url: `/conduit/finetuning/${run.id}/artifact`, headers: asAlice });
  assert.equal(res.statusCode, 200, res.body);
  assert.equal(res.headers["content-type"], "application/octet-stream");
  assert.equal(res.headers["content-disposition"], `attachment; filename="${run.id}.gguf"`);
  const expected = fs.readFileSync(stored.path);
  assert.equal(res.headers["content-length"], String(expected.length));
  assert.equal(stored.sizeBytes, expected.length);
  assert.equal(res.rawPayload.subarray(0, 4).toString(), "GGUF");
  assert.ok(res.rawPayload.equals(expected), "the downloaded bytes are the stored model");
});
