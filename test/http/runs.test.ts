import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { describe, test, type TestContext } from "node:test";
import { createParser } from "eventsource-parser";
import type { FastifyInstance } from "fastify";
import {
  asAlice,
  asBob,
  backends,
  build,
  buildTestApp,
  createDataset,
  KEY_A,
  testEnv,
  tinyModel,
  as,
  KEY_B,
} from "../lib/helper.ts";
import { waitForRun } from "../lib/helper.ts";
import { runScenarios, type ApiScenario } from "../lib/scenario.ts";
import { readGgufFileInfo } from "node-llama-cpp";
import { GgmlType } from "../../src/model/gguf/GgufWriter.ts";
import { loadConfig } from "../../src/config.ts";
import { createCore, type CoreOverrides } from "../../src/core.ts";
import { chooseAutoSettings, readModelShape } from "../../src/train/autoSettings.ts";
import { type TrainMethod } from "../../src/contract/runs.ts";
import { LLAMA_CPP_LORA_TARGETS } from "../../src/train/native/llamaCppTrainer.ts";

// Run lifecycle over HTTP; training itself is covered by the trainer tests.
const models: CoreOverrides = {};

async function datasetWithPairs(app: FastifyInstance, name = "d") {
  const ds = (await as(app, KEY_A).post("/conduit/dataset", { name })).json();
  await as(app, KEY_A).post(`/conduit/dataset/${ds.id}/upload`, {
    name: "a.jsonl",
    ioPairs: [
      { input: "a", output: "b" },
      { input: "c", output: "d" },
    ],
  });
  return ds as { id: string; name: string };
}

/** Uploads pairs as a file of a dataset of Alice's; returns the file's record. */
async function upload(
  app: FastifyInstance,
  datasetId: string,
  name: string,
  pairs: number,
  headers = asAlice,
) {
  const res = await app.inject({
    method: "POST",
    url: `/conduit/dataset/${datasetId}/upload`,
    headers,
    payload: {
      name,
      ioPairs: Array.from({ length: pairs }, (_, i) => ({ input: `q${i}`, output: `a${i}` })),
    },
  });
  assert.equal(res.statusCode, 200, res.body);
  return res.json() as { id: string; name: string; size: number; ioPairsCount: number };
}

/** What "auto" chooses for Alice's dataset (all of its files) on the tiny model. */
async function autoChoice(app: FastifyInstance, datasetId: string, method: TrainMethod, except?: string) {
  const files = (await as(app, KEY_A).get(`/conduit/dataset/${datasetId}/files`)).json() as {
    id: string;
    size: number;
    ioPairsCount: number;
  }[];
  const training = files.filter((f) => f.id !== except);
  return chooseAutoSettings({
    method,
    pairs: training.reduce((sum, f) => sum + f.ioPairsCount, 0),
    characters: training.reduce((sum, f) => sum + f.size, 0),
    model: await readModelShape(await tinyModel()),
  });
}

/** The core behind a test app (helper.ts decorates the app with it). */
async function createRun(app: FastifyInstance, payload: Record<string, unknown>) {
  const res = await as(app, KEY_A).post("/conduit/finetuning", payload);
  assert.equal(res.statusCode, 200, res.body);
  return res.json() as { id: string; status: string; config: Record<string, unknown>; logs: string[] };
}

/**
 * A run request refused with `status` naming `param` (and saying `message`, `invalid_request` for a 400), after
 * which Alice has no run: nothing was queued.
 */
function refusedRun<S>(
  body: Record<string, unknown>,
  status: number,
  param: string,
  message?: RegExp,
): ApiScenario<S> {
  return {
    method: "POST",
    url: "/conduit/finetuning",
    body,
    status,
    error: { ...(status === 400 ? { code: "invalid_request" } : {}), param, ...(message ? { message } : {}) },
    check: async (_response, _setup, app) => {
      assert.deepEqual((await as(app, KEY_A).get("/conduit/finetuning")).json(), []);
    },
  };
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
  describe(`creating runs: the stored config and what is refused (${backend})`, () => {
    test("create returns a queued run with every seed field and the effective config", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const res = await as(app, KEY_A).post("/conduit/finetuning", {
        datasetID: ds.id,
        baseModelName: "tiny",
        lr: 0.001,
        epochs: 2,
        name: "first",
        trackerProject: "p",
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
      assert.ok(Array.isArray(run.logs) && run.logs[0].endsWith("run queued"), run.logs.join("\n"));
      assert.deepEqual(run.stats, {});
      assert.equal(run.error, null);
      assert.equal(run.config.lr, 0.001);
      assert.equal(run.config.epochs, 2);
      // The numbers given are kept; the rank was left to "auto".
      assert.deepEqual(run.config.autoSettings, ["loraRank"]);
      assert.equal(run.logs.length, 3);
      assert.match(run.logs[1], /auto settings: LoRA rank/);
      assert.match(run.logs[2], /trainer: llama\.cpp \(CONDUIT_TRAINER\)/);
      assert.equal(run.config.trainer, "llama.cpp");
      assert.equal(run.config.trainOnInputs, false);
      assert.equal(run.config.validationFileID, null);
      assert.equal(run.config.earlyStoppingPatience, null);
      assert.equal(run.config.complexity, 1);
      assert.equal(run.config.steps, null);
      assert.equal(run.config.baseModelName, "tiny");
      assert.equal(run.config.trackerProject, "p");
      assert.equal(run.config.trackerEntity, null);
      // A run has the same shape everywhere on the Conduit face: no automatic before/after yet.
      assert.equal(run.evaluation, null);

      const byName = await as(app, KEY_A).post("/conduit/finetuning", {
        datasetName: "d",
        baseModelName: "tiny",
      });
      assert.equal(byName.statusCode, 200, byName.body);
      assert.equal(byName.json().datasetId, ds.id);
      assert.equal(byName.json().name, "d-tiny");

      const one = await app.inject({
        url: `/conduit/finetuning/${run.id}`,
        headers: { authorization: `Token ${KEY_A}` },
      });
      assert.deepEqual(one.json(), run);
      const list = await as(app, KEY_A).get("/conduit/finetuning");
      assert.deepEqual(
        list.json().map((r: { id: string }) => r.id),
        [byName.json().id, run.id],
      );
      assert.deepEqual(
        list.json().map((r: { evaluation: unknown }) => r.evaluation),
        [null, null],
      );
      const page = await as(app, KEY_A).get("/conduit/finetuning?limit=1&offset=1");
      assert.deepEqual(
        page.json().map((r: { id: string }) => r.id),
        [run.id],
      );
    });

    test("bad configs are 400/404/409 naming the field, and nothing is queued", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const tiny = { datasetID: ds.id, baseModelName: "tiny" };
      await runScenarios(t, app, [
        refusedRun({ baseModelName: "tiny" }, 400, "datasetID"),
        refusedRun({ ...tiny, lr: 0 }, 400, "lr"),
        refusedRun({ ...tiny, lr: -1 }, 400, "lr"),
        refusedRun({ ...tiny, lr: "fast" }, 400, "lr"),
        refusedRun({ ...tiny, lr: 1.5 }, 400, "lr"),
        refusedRun({ ...tiny, epochs: 0 }, 400, "epochs"),
        refusedRun({ ...tiny, epochs: 1.5 }, 400, "epochs"),
        refusedRun({ ...tiny, epochs: 1001 }, 400, "epochs"),
        refusedRun({ ...tiny, epochs: "AUTO" }, 400, "epochs"),
        refusedRun({ ...tiny, trainOnInputs: "yes" }, 400, "trainOnInputs"),
        refusedRun({ ...tiny, earlyStoppingPatience: 0 }, 400, "earlyStoppingPatience"),
        refusedRun({ ...tiny, earlyStoppingPatience: 101 }, 400, "earlyStoppingPatience"),
        refusedRun({ ...tiny, earlyStoppingPatience: 2.5 }, 400, "earlyStoppingPatience"),
        refusedRun({ ...tiny, earlyStoppingPatience: "3" }, 400, "earlyStoppingPatience"),
        refusedRun({ ...tiny, validationFileID: "" }, 400, "validationFileID"),
        refusedRun({ ...tiny, validationFileID: "file_missing" }, 404, "validationFileID"),
        refusedRun({ ...tiny, complexity: 0 }, 400, "complexity"),
        refusedRun({ ...tiny, complexity: 1.5 }, 400, "complexity"),
        refusedRun({ ...tiny, steps: 0 }, 400, "steps"),
        refusedRun({ ...tiny, epoch: 3 }, 400, "epoch"),
        refusedRun({ datasetID: ds.id }, 400, "baseModelName"),
        refusedRun({ datasetID: ds.id, baseModelName: "nope" }, 404, "baseModelName"),
        refusedRun({ datasetID: "ds_missing", baseModelName: "tiny" }, 404, "datasetID"),
        refusedRun({ datasetName: "missing", baseModelName: "tiny" }, 404, "datasetName"),
      ]);
      // The dataset's state, not the request: a 409 (README, Errors).
      await runScenarios(t, app, [
        {
          ...refusedRun({}, 409, "datasetID"),
          name: "a dataset without pairs is a 409",
          setup: async (app) => (await createDataset(app, "empty")).id,
          body: (empty: string) => ({ datasetID: empty, baseModelName: "tiny" }),
          teardown: async (empty, app) => {
            assert.equal((await as(app, KEY_A).delete(`/conduit/dataset/${empty}`)).statusCode, 200);
          },
        },
      ]);
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
      const rank = (await autoChoice(app, ds.id, "lora")).loraRank;
      const cases: [Record<string, unknown>, Record<string, unknown>][] = [
        [
          {},
          { method: "lora", loraRank: rank, loraAlpha: 2 * rank, loraTargets: [...LLAMA_CPP_LORA_TARGETS] },
        ],
        [
          { method: "lora" },
          { method: "lora", loraRank: rank, loraAlpha: 2 * rank, loraTargets: [...LLAMA_CPP_LORA_TARGETS] },
        ],
        // alpha follows the rank unless given
        [
          { loraRank: 4 },
          { method: "lora", loraRank: 4, loraAlpha: 8, loraTargets: [...LLAMA_CPP_LORA_TARGETS] },
        ],
        [
          { loraRank: 256, loraAlpha: 0.5, loraTargets: ["ffn_down", "attn_q"] },
          { method: "lora", loraRank: 256, loraAlpha: 0.5, loraTargets: ["ffn_down", "attn_q"] },
        ],
        [
          { loraRank: 1, loraAlpha: 4096 },
          { method: "lora", loraRank: 1, loraAlpha: 4096, loraTargets: [...LLAMA_CPP_LORA_TARGETS] },
        ],
        [{ method: "full" }, { method: "full", loraRank: null, loraAlpha: null, loraTargets: null }],
      ];
      for (const [settings, expected] of cases) {
        const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", ...settings });
        assert.deepEqual(lora(run.config), expected, JSON.stringify(settings));
        assert.equal(run.config.complexity, 1);
        const stored = (await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).json();
        assert.deepEqual(lora(stored.config), expected, "as stored");
      }
    });

    test("bad LoRA settings are a 400 naming the field, and nothing is queued", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const lora = (settings: Record<string, unknown>, param: string, message: RegExp) =>
        refusedRun({ datasetID: ds.id, baseModelName: "tiny", ...settings }, 400, param, message);
      await runScenarios(t, app, [
        lora({ loraRank: 0 }, "loraRank", /"loraRank" must be >= 1/),
        lora({ loraRank: 257 }, "loraRank", /"loraRank" must be <= 256/),
        lora({ loraRank: 1.5 }, "loraRank", /"loraRank" must be integer or "auto"/),
        lora({ loraRank: "16" }, "loraRank", /"loraRank" must be integer or "auto"/),
        lora({ loraRank: "Auto" }, "loraRank", /"loraRank" must be integer or "auto"/),
        lora({ loraAlpha: 0 }, "loraAlpha", /"loraAlpha" must be > 0/),
        lora({ loraAlpha: -1 }, "loraAlpha", /"loraAlpha" must be > 0/),
        lora({ loraAlpha: 4097 }, "loraAlpha", /"loraAlpha" must be <= 4096/),
        lora({ loraTargets: [] }, "loraTargets", /"loraTargets" must NOT have fewer than 1 items/),
        lora({ loraTargets: "attn_q" }, "loraTargets", /"loraTargets" must be array/),
        lora(
          { loraTargets: ["attn_k"] },
          "loraTargets",
          /the llama\.cpp trainer cannot train "attn_k": .*no gradient.*KV cache.*npm run setup:torch/,
        ),
        lora(
          { loraTargets: ["attn_q", "attn_v"] },
          "loraTargets",
          /the llama\.cpp trainer cannot train "attn_v"/,
        ),
        lora(
          { loraTargets: ["attn_q", "mlp"] },
          "loraTargets",
          /"mlp" is not a LoRA target; the targets are attn_q, /,
        ),
        lora(
          { loraTargets: ["ffn_up", "ffn_up"] },
          "loraTargets",
          /"loraTargets" must NOT have duplicate items/,
        ),
        lora({ method: "qlora" }, "method", /"method" must be one of "lora", "full"/),
        lora(
          { method: "full", loraRank: 8 },
          "loraRank",
          /"loraRank" is a LoRA setting; leave it out with "method": "full"/,
        ),
        lora({ method: "full", loraRank: "auto" }, "loraRank", /"loraRank" is a LoRA setting/),
        lora({ method: "full", loraAlpha: 16 }, "loraAlpha", /"loraAlpha" is a LoRA setting/),
        lora({ method: "full", loraTargets: ["attn_q"] }, "loraTargets", /"loraTargets" is a LoRA setting/),
      ]);
    });
  });

  describe(`run settings chosen by "auto", validation files and limits (${backend})`, () => {
    test('"auto" is the default for epochs, lr and rank: config holds the chosen numbers, autoSettings and a log line says why', async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const lora = await autoChoice(app, ds.id, "lora");
      const full = await autoChoice(app, ds.id, "full");
      const cases: [Record<string, unknown>, Record<string, unknown>][] = [
        [
          {},
          {
            epochs: lora.epochs,
            lr: lora.lr,
            loraRank: lora.loraRank,
            autoSettings: ["epochs", "lr", "loraRank"],
          },
        ],
        [
          { epochs: "auto", lr: "auto", loraRank: "auto" },
          {
            epochs: lora.epochs,
            lr: lora.lr,
            loraRank: lora.loraRank,
            autoSettings: ["epochs", "lr", "loraRank"],
          },
        ],
        // Explicit numbers win, each on its own.
        [
          { epochs: 7, lr: 0.01, loraRank: 8 },
          { epochs: 7, lr: 0.01, loraRank: 8, autoSettings: [] },
        ],
        [
          { epochs: 7 },
          { epochs: 7, lr: lora.lr, loraRank: lora.loraRank, autoSettings: ["lr", "loraRank"] },
        ],
        [
          { lr: 0.02, loraRank: "auto" },
          { epochs: lora.epochs, lr: 0.02, loraRank: lora.loraRank, autoSettings: ["epochs", "loraRank"] },
        ],
        // A full run has no rank to choose, and its own learning rate.
        [
          { method: "full" },
          { epochs: full.epochs, lr: full.lr, loraRank: null, autoSettings: ["epochs", "lr"] },
        ],
      ];
      const chosen = (c: Record<string, unknown>) => ({
        epochs: c.epochs,
        lr: c.lr,
        loraRank: c.loraRank,
        autoSettings: c.autoSettings,
      });
      for (const [settings, expected] of cases) {
        const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", ...settings });
        const label = JSON.stringify(settings);
        assert.deepEqual(chosen(run.config), expected, label);
        assert.ok(Number.isInteger(run.config.epochs), label);
        assert.equal(typeof run.config.lr, "number", label);
        const stored = (await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).json();
        assert.deepEqual(chosen(stored.config), expected, `${label} as stored`);
        assert.deepEqual(stored.logs, run.logs, `${label}: the response shows the stored log`);
        const auto = expected.autoSettings as ("epochs" | "lr" | "loraRank")[];
        if (auto.length === 0) {
          assert.equal(run.logs.length, 2, `${label}: nothing chosen, nothing said but the trainer`);
          continue;
        }
        assert.equal(run.logs.length, 3, label);
        const [, line] = run.logs;
        const choice = settings.method === "full" ? full : lora;
        assert.match(line ?? "", /^\S+ \S+ auto settings: /, label);
        for (const setting of ["epochs", "lr", "loraRank"] as const)
          assert.equal(
            line?.includes(choice.reasons[setting]),
            auto.includes(setting),
            `${label}: ${setting}`,
          );
      }
    });

    test("a validation file: another own dataset's or this one's (left out of training); another user's is a 404, an empty one a 400", async (t) => {
      const { app, core } = await build(t, backend, models);
      const ds = await datasetWithPairs(app, "train");
      const other = (await as(app, KEY_A).post("/conduit/dataset", { name: "held" })).json();
      const held = await upload(app, other.id, "held.jsonl", 3);
      const run = await createRun(app, {
        datasetID: ds.id,
        baseModelName: "tiny",
        validationFileID: held.id,
        trainOnInputs: true,
        earlyStoppingPatience: 3,
      });
      assert.equal(run.config.validationFileID, held.id);
      assert.equal(run.config.validationFileName, "held.jsonl");
      assert.equal(run.config.trainOnInputs, true);
      assert.equal(run.config.earlyStoppingPatience, 3);
      assert.equal(
        run.config.epochs,
        (await autoChoice(app, ds.id, "lora")).epochs,
        "another dataset's file counts no training pairs",
      );

      // A file of the training dataset itself: auto counts the pairs that are left to train on.
      const big = await datasetWithPairs(app, "big");
      await upload(app, big.id, "more.jsonl", 30);
      const own = await upload(app, big.id, "own-held.jsonl", 40);
      const withOwn = await createRun(app, {
        datasetID: big.id,
        baseModelName: "tiny",
        validationFileID: own.id,
      });
      const left = await autoChoice(app, big.id, "lora", own.id);
      const all = await autoChoice(app, big.id, "lora");
      assert.deepEqual(
        { epochs: withOwn.config.epochs, lr: withOwn.config.lr, loraRank: withOwn.config.loraRank },
        { epochs: left.epochs, lr: left.lr, loraRank: left.loraRank },
      );
      assert.notEqual(left.epochs, all.epochs, "the test tells the two counts apart");
      assert.equal(withOwn.config.validationFileID, own.id);

      // Bob's file is not Alice's to name, whatever he uploads.
      const bobs = (await as(app, KEY_B).post("/conduit/dataset", { name: "b" })).json();
      const bobsFile = await upload(app, bobs.id, "b.jsonl", 2, asBob);
      const empty = await upload(app, other.id, "empty.jsonl", 1);
      await core.db.kysely
        .updateTable("files")
        .set({ io_pairs_count: 0 })
        .where("id", "=", empty.id)
        .execute();
      const onlyFile = (
        (await as(app, KEY_A).get(`/conduit/dataset/${ds.id}/files`)).json() as {
          id: string;
        }[]
      )[0]?.id;
      const cases: [string | undefined, number, RegExp][] = [
        [bobsFile.id, 404, new RegExp(`file ${bobsFile.id} not found`)],
        [empty.id, 400, /has no IO pairs/],
        [onlyFile, 400, /holds every pair of dataset .*none would be left to train on/],
      ];
      for (const [validationFileID, status, message] of cases) {
        const res = await as(app, KEY_A).post("/conduit/finetuning", {
          datasetID: ds.id,
          baseModelName: "tiny",
          validationFileID,
        });
        assert.equal(res.statusCode, status, res.body);
        assert.equal(res.json().error.param, "validationFileID", res.body);
        assert.match(res.json().error.message, message);
      }
      const patience = async (earlyStoppingPatience: number) =>
        (await createRun(app, { datasetID: ds.id, baseModelName: "tiny", earlyStoppingPatience })).config
          .earlyStoppingPatience;
      assert.equal(await patience(1), 1);
      assert.equal(await patience(100), 100);
    });

    test("a run over CONDUIT_MAX_RUN_PAIRS or CONDUIT_MAX_RUN_BYTES is a 400 naming the limit and the numbers; nothing is queued", async (t) => {
      const { app } = await buildTestApp(
        t,
        await testEnv(t, backend, { CONDUIT_MAX_RUN_PAIRS: "4", CONDUIT_MAX_RUN_BYTES: "400" }),
        models,
      );
      const refused = async (payload: Record<string, unknown>, param: string, message: RegExp) => {
        const res = await as(app, KEY_A).post("/conduit/finetuning", payload);
        assert.equal(res.statusCode, 400, res.body);
        assert.equal(res.json().error.code, "invalid_request", res.body);
        assert.equal(res.json().error.param, param, res.body);
        assert.match(res.json().error.message, message);
      };
      const ds = await createDataset(app, "train");
      await upload(app, ds.id, "three.jsonl", 3);
      await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 1, lr: 0.001 });
      // 5 pairs: over the limit, whichever way the dataset is named.
      await upload(app, ds.id, "two.jsonl", 2);
      const overPairs = /the dataset holds 5 IO pairs, more than a run may read \(CONDUIT_MAX_RUN_PAIRS: 4\)/;
      await refused({ datasetID: ds.id, baseModelName: "tiny" }, "datasetID", overPairs);
      await refused({ datasetName: "train", baseModelName: "tiny" }, "datasetName", overPairs);
      // The pairs of a validation file of another dataset count too.
      const small = await createDataset(app, "small");
      await upload(app, small.id, "three.jsonl", 3);
      const held = await createDataset(app, "held");
      const validation = await upload(app, held.id, "held.jsonl", 2);
      await refused(
        { datasetID: small.id, baseModelName: "tiny", validationFileID: validation.id },
        "datasetID",
        /the dataset and the validation file hold 5 IO pairs, more than a run may read \(CONDUIT_MAX_RUN_PAIRS: 4\)/,
      );
      // One long pair: few pairs, too many bytes.
      const long = await createDataset(app, "long");
      const res = await as(app, KEY_A).post(`/conduit/dataset/${long.id}/upload`, {
        name: "long.jsonl",
        ioPairs: [{ input: "x".repeat(500), output: "y" }],
      });
      assert.equal(res.statusCode, 200, res.body);
      const size = (res.json() as { size: number }).size;
      assert.ok(size > 400);
      await refused(
        { datasetID: long.id, baseModelName: "tiny" },
        "datasetID",
        new RegExp(
          `the dataset holds ${size} bytes of IO pairs, more than a run may read \\(CONDUIT_MAX_RUN_BYTES: 400\\)`,
        ),
      );
      const runs = (await as(app, KEY_A).get("/conduit/finetuning")).json() as unknown[];
      assert.equal(runs.length, 1);
    });

    test("a run whose trainer would not fit in memory beside the loaded models is a 400 naming the numbers; nothing is queued", async (t) => {
      let inUse = 0;
      // The tiny model's llama.cpp LoRA needs about half a GiB: 2 GiB leave it room after the 1 GiB reserve.
      const { app } = await buildTestApp(t, await testEnv(t, backend), {
        ...models,
        memory: { total: () => 2 * 2 ** 30, inUse: () => inUse },
      });
      const ds = await createDataset(app, "train");
      await upload(app, ds.id, "three.jsonl", 3);
      const payload = { datasetID: ds.id, baseModelName: "tiny", trainer: "llama.cpp", epochs: 1 };
      await createRun(app, payload);
      inUse = 0.8 * 2 ** 30;
      const res = await as(app, KEY_A).post("/conduit/finetuning", payload);
      assert.equal(res.statusCode, 400, res.body);
      assert.equal(res.json().error.param, "baseModelName", res.body);
      assert.match(
        res.json().error.message,
        /^the llama\.cpp trainer needs about 0\.\d GiB of memory to train "tiny" \(lora\); this server has 2\.0 GiB, 0\.8 GiB of it held by the models loaded now and 1\.0 GiB kept for the server: 0\.2 GiB free for a trainer$/,
      );
      const runs = (await as(app, KEY_A).get("/conduit/finetuning")).json() as unknown[];
      assert.equal(runs.length, 1);
    });
  });

  describe(`a READY run's examples and artifact (${backend})`, () => {
    test("examples: a READY run's examples with their loss, worst first, by split, paged; 409 before READY or without them, 404 for others", async (t) => {
      const { app, core } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny" });
      const url = `/conduit/finetuning/${run.id}/examples`;
      const get = (query = "", headers = asAlice) => app.inject({ url: `${url}${query}`, headers });

      const queued = await get();
      assert.equal(queued.statusCode, 409, queued.body);
      assert.equal(queued.json().error.code, "conflict");
      assert.match(queued.json().error.message, new RegExp(`run ${run.id} is QUEUED, not READY`));
      assert.equal((await get("", asBob)).statusCode, 404);
      const missing = await as(app, KEY_A).get("/conduit/finetuning/ft_missing/examples");
      assert.equal(missing.statusCode, 404);
      assert.equal(missing.json().error.param, "finetune_id");
      assert.equal((await app.inject({ url })).statusCode, 401);

      const repo = core.runRepository;
      assert.equal((await repo.claimNext("w", 60_000))?.id, run.id);
      assert.ok(await repo.finish(run.id, "w", { status: "READY", modelPath: "/m.gguf" }));
      const none = await get();
      assert.equal(none.statusCode, 409, none.body);
      assert.match(none.json().error.message, /is READY but has no per-example losses/);

      // The file the scheduler writes when a run ends READY (in no particular order here).
      type Example = {
        split: string;
        index: number;
        input: string;
        output: string;
        loss: number | null;
        tokens: number;
      };
      const example = (split: string, index: number, loss: number | null): Example => ({
        split,
        index,
        input: `${split} in ${index}`,
        output: `${split} out ${index}`,
        loss,
        tokens: 3 + index,
      });
      const examples = [
        example("validation", 1, 2.5),
        example("train", 2, 0.1),
        example("train", 0, 1.5),
        example("validation", 0, null),
        example("train", 3, null),
        example("train", 1, 2.5),
        example("validation", 2, 0.05),
        example("train", 4, 3),
      ];
      const file = core.blobs.pathOf(`runs/${run.id}/examples.jsonl`);
      fs.mkdirSync(path.dirname(file), { recursive: true });
      fs.writeFileSync(file, examples.map((e) => JSON.stringify(e)).join("\n") + "\n");
      const keys = (res: { json(): unknown }) =>
        (res.json() as Example[]).map((e) => `${e.split[0]}${e.index}`);

      const worst = await get();
      assert.equal(worst.statusCode, 200, worst.body);
      assert.equal(worst.headers["x-total-count"], "8");
      // Highest loss first; ties train before validation, then by index; no loss last.
      assert.deepEqual(keys(worst), ["t4", "t1", "v1", "t0", "t2", "v2", "t3", "v0"]);
      assert.deepEqual((worst.json() as Example[])[0], example("train", 4, 3));
      assert.deepEqual(keys(await get("?sort=loss&limit=3")), ["t4", "t1", "v1"]);
      assert.deepEqual(keys(await get("?limit=3&offset=6")), ["t3", "v0"]);
      assert.deepEqual(keys(await get("?offset=8")), []);
      const byIndex = await get("?sort=index");
      assert.deepEqual(keys(byIndex), ["t0", "t1", "t2", "t3", "t4", "v0", "v1", "v2"]);
      const validation = await get("?split=validation");
      assert.equal(validation.headers["x-total-count"], "3");
      assert.deepEqual(keys(validation), ["v1", "v2", "v0"]);
      const trainPage = await get("?split=train&sort=index&limit=2&offset=1");
      assert.equal(trainPage.headers["x-total-count"], "5");
      assert.deepEqual(keys(trainPage), ["t1", "t2"]);
      const bad: [string, string][] = [
        ["?sort=worst", "sort"],
        ["?split=test", "split"],
        ["?limit=0", "limit"],
        ["?limit=1001", "limit"],
        ["?offset=-1", "offset"],
        ["?page=2", "page"],
      ];
      await runScenarios(
        t,
        app,
        bad.map(([query, param]) => ({
          method: "GET",
          url: `${url}${query}`,
          status: 400,
          error: { param },
        })),
      );
      assert.equal((await get("", asBob)).statusCode, 404, "still not bob's");
    });

    test("artifact: the owner downloads a READY run's file; 409 before READY, 404 for others, 401 without a key", async (t) => {
      const { app, config, core } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny" });
      const url = `/conduit/finetuning/${run.id}/artifact`;

      const queued = await as(app, KEY_A).get(url);
      assert.equal(queued.statusCode, 409, queued.body);
      assert.equal(queued.json().error.code, "conflict");
      assert.match(queued.json().error.message, new RegExp(`run ${run.id} is QUEUED, not READY`));
      const bobs = await as(app, KEY_B).get(url);
      assert.equal(bobs.statusCode, 404, bobs.body);
      assert.equal(bobs.json().error.code, "not_found");
      assert.equal((await app.inject({ url })).statusCode, 401);
      assert.equal((await app.inject({ url, headers: { "x-api-key": "wrong-key-123" } })).statusCode, 401);

      // READY, as a worker finishes it (training itself is below and in training.test.ts).
      const file = path.join(config.dataDir, "adapter.gguf");
      const bytes = Buffer.concat([Buffer.from("GGUF"), Buffer.alloc(300_000, 7)]);
      fs.writeFileSync(file, bytes);
      const repo = core.runRepository;
      assert.equal((await repo.claimNext("w", 60_000))?.id, run.id);
      assert.ok(await repo.finish(run.id, "w", { status: "READY", modelPath: file }));
      const res = await as(app, KEY_A).get(url);
      assert.equal(res.statusCode, 200, res.body);
      assert.equal(res.headers["content-type"], "application/octet-stream");
      assert.equal(res.headers["content-length"], String(bytes.length));
      assert.equal(res.headers["content-disposition"], `attachment; filename="${run.id}-lora.gguf"`);
      assert.ok(res.rawPayload.equals(bytes), "the downloaded bytes are the stored file");
      assert.equal((await as(app, KEY_B).get(url)).statusCode, 404, "still not bob's");

      // The file gone from disk: a clear 404, not a 500, and no server path in it.
      fs.rmSync(file);
      const missing = await as(app, KEY_A).get(url);
      assert.equal(missing.statusCode, 404, missing.body);
      assert.equal(missing.json().error.code, "not_found");
      assert.match(
        missing.json().error.message,
        /is READY but its file .*-lora\.gguf is not in this server's storage/,
      );
      assert.ok(!missing.body.includes(config.dataDir), missing.body);

      const cancelled = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", method: "full" });
      await as(app, KEY_A).post(`/conduit/finetuning/${cancelled.id}/cancel`);
      const notReady = await as(app, KEY_A).get(`/conduit/finetuning/${cancelled.id}/artifact`);
      assert.equal(notReady.statusCode, 409);
      assert.match(notReady.json().error.message, /is CANCELLED, not READY/);
    });
  });

  describe(`the run queue: cancel, claim, order, logs (${backend})`, () => {
    test("cancel a queued run; cancelling again is 409; delete", async (t) => {
      const { app } = await build(t, backend, models);
      const ds = await datasetWithPairs(app);
      const run = (
        await as(app, KEY_A).post("/conduit/finetuning", { datasetID: ds.id, baseModelName: "tiny" })
      ).json();
      const cancel = await as(app, KEY_A).post(`/conduit/finetuning/${run.id}/cancel`);
      assert.equal(cancel.statusCode, 200);
      assert.deepEqual(cancel.json(), { message: "SUCCESS" });
      const after = (await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).json();
      assert.equal(after.status, "CANCELLED");
      assert.match(after.logs.at(-1), /cancelled by the user/);
      const again = await as(app, KEY_A).post(`/conduit/finetuning/${run.id}/cancel`);
      assert.equal(again.statusCode, 409);
      assert.equal(again.json().error.code, "conflict");
      const del = await as(app, KEY_A).delete(`/conduit/finetuning/${run.id}`);
      assert.deepEqual(del.json(), { message: "SUCCESS" });
      assert.equal((await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).statusCode, 404);
      assert.equal((await as(app, KEY_A).delete(`/conduit/finetuning/${run.id}`)).statusCode, 404);
      assert.equal((await as(app, KEY_A).post(`/conduit/finetuning/${run.id}/cancel`)).statusCode, 404);
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
      // Without a scheduler to look, the repository does not claim a checkpoint.
      assert.match(requeued.logs.at(-1) ?? "", /re-queued: .* it starts again from the base model$/);
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
      // After the lines the run was created with ("run queued", what auto chose).
      const first = run.logs.length;
      assert.equal(logs.length, first + 3 * lines.length);
      assert.deepEqual(logs.slice(first, first + lines.length), lines);
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
  const { app, core } = await build(t, "sqlite", { scheduler: { pollMs: 200, concurrency: 1 } });
  core.scheduler.start();
  const ds = await datasetWithPairs(app);
  const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", method: "full", epochs: 1 });
  const ended = await waitForRun(app, run.id);
  assert.equal(ended.status, "READY", ended.logs.join("\n"));
  const stored = await core.runs.artifact("alice", run.id);
  const res = await as(app, KEY_A).get(`/conduit/finetuning/${run.id}/artifact`);
  assert.equal(res.statusCode, 200, res.body);
  assert.equal(res.headers["content-type"], "application/octet-stream");
  assert.equal(res.headers["content-disposition"], `attachment; filename="${run.id}.gguf"`);
  const expected = fs.readFileSync(stored.path);
  assert.equal(res.headers["content-length"], String(expected.length));
  assert.equal(stored.sizeBytes, expected.length);
  assert.equal(res.rawPayload.subarray(0, 4).toString(), "GGUF");
  assert.ok(res.rawPayload.equals(expected), "the downloaded bytes are the stored model");
});

test("a LoRA run's adapter is Q8_0 (rows not a multiple of 32 stay F16), or F16 with CONDUIT_ADAPTER_TYPE=f16", async (t) => {
  for (const setting of ["", "f16"]) {
    const env = await testEnv(t, "sqlite", setting ? { CONDUIT_ADAPTER_TYPE: setting } : {});
    const { app, core } = await buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
    core.scheduler.start();
    const ds = await datasetWithPairs(app);
    const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny", epochs: 1, loraRank: 8 });
    assert.equal(run.config.outputType, setting ? "F16" : "Q8_0");
    const ended = await waitForRun(app, run.id);
    assert.equal(ended.status, "READY", ended.logs.join("\n"));
    const info = await readGgufFileInfo((await core.runs.artifact("alice", run.id)).path, {
      logWarnings: false,
    });
    const types = new Map<string, Set<number>>();
    for (const tensor of info.fullTensorInfo ?? []) {
      const side = tensor.name.endsWith(".lora_a") ? "A" : "B";
      types.set(side, (types.get(side) ?? new Set()).add(tensor.ggmlType));
    }
    // The tiny model is 64 wide: A's rows (64 long) are whole Q8_0 blocks, B's (rank 8) are not.
    assert.deepEqual(
      Object.fromEntries([...types].map(([side, set]) => [side, [...set]])),
      setting ? { A: [GgmlType.F16], B: [GgmlType.F16] } : { A: [GgmlType.Q8_0], B: [GgmlType.F16] },
    );
    assert.ok(
      ended.logs.some((line) => line.includes(`weights, ${setting ? "F16" : "Q8_0"})`)),
      ended.logs.join("\n"),
    );
  }
});

test("run lists are summaries; each stats event carries only the loss points the stream has not sent", async (t) => {
  const { app, core } = await build(t);
  const url = await app.listen({ port: 0, host: "127.0.0.1" });
  const ds = await datasetWithPairs(app);
  const run = await createRun(app, { datasetID: ds.id, baseModelName: "tiny" });
  assert.equal((await core.runRepository.claimNext("w", 60_000))?.id, run.id);
  const train = (steps: number[]) => steps.map((step) => ({ step, trainLoss: 5 - step / 10 }));
  const evals = (steps: number[]) => steps.map((step) => ({ step, epoch: step, evalLoss: 4 }));
  const stats = (trainSteps: number[], evalSteps: number[]) => ({
    step: trainSteps.at(-1),
    totalSteps: 10,
    lossSeries: train(trainSteps),
    evalLossSeries: evals(evalSteps),
  });
  assert.ok(await core.runRepository.updateStats(run.id, "w", stats([1, 2, 3], [2])));

  // The list: no log, no series; the run itself has both.
  const [listed] = (await as(app, KEY_A).get("/conduit/finetuning")).json() as Record<string, unknown>[];
  assert.equal(listed?.id, run.id);
  assert.equal("logs" in (listed ?? {}), false);
  assert.deepEqual((listed as { stats: unknown }).stats, { step: 3, totalSteps: 10 });
  const one = (await as(app, KEY_A).get(`/conduit/finetuning/${run.id}`)).json();
  assert.ok(one.logs.length > 0);
  assert.equal(one.stats.lossSeries.length, 3);

  // The events: the first stats event has every point so far, the next ones only what is new.
  const response = await fetch(`${url}/conduit/finetuning/${run.id}/events`, { headers: asAlice });
  const queue: { event?: string; data: string }[] = [];
  const parser = createParser({ onEvent: (event) => queue.push(event) });
  const reader = response.body!.pipeThrough(new TextDecoderStream()).getReader();
  const nextStats = async () => {
    for (;;) {
      const event = queue.shift();
      if (event?.event === "stats") return JSON.parse(event.data) as Record<string, unknown>;
      if (event) continue;
      const { value, done } = await reader.read();
      assert.ok(!done, "the stream ended before a stats event");
      parser.feed(value);
    }
  };
  const first = await nextStats();
  assert.deepEqual(first.lossSeries, train([1, 2, 3]));
  assert.deepEqual(first.evalLossSeries, evals([2]));
  assert.ok(await core.runRepository.updateStats(run.id, "w", stats([1, 2, 3, 4, 5], [2, 4])));
  const second = await nextStats();
  assert.deepEqual(second.lossSeries, train([4, 5]));
  assert.deepEqual(second.evalLossSeries, evals([4]));
  assert.equal(second.step, 5);
  assert.equal(second.seriesReset, undefined);
  // A run that started over: the series start again, and the event says they replace the old ones.
  assert.ok(await core.runRepository.updateStats(run.id, "w", stats([1], [])));
  const third = await nextStats();
  assert.deepEqual([third.lossSeries, third.evalLossSeries, third.seriesReset], [train([1]), [], true]);
  await reader.cancel();
});
