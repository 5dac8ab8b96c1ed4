/**
 * Imported LoRA adapters (`/conduit/models/adapters`) on the test model (../shared/models/stories260Ktok512.gguf,
 * a llama with grouped-query attention): a run's GGUF adapter, downloaded and imported, answers greedily as the
 * run does; the same adapter as PEFT files (Hugging Face's Q/K row order, safetensors + adapter_config.json)
 * imported answers the same; the owner alone sees, serves and deletes it; a wrong base, a truncated file, a
 * foreign tensor, a wrong shape and a missing config are 400s naming the field, and nothing is kept.
 */
import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { describe, test } from "node:test";
import { readGgufFileInfo } from "node-llama-cpp";
import type { FastifyInstance } from "fastify";
import { startTrainer } from "../../src/train/trainer.ts";
import { torchPythonForTests } from "../lib/torchPython.ts";
import { torchJob } from "../lib/trainerJob.ts";
import { gguf, writeGguf, type GgufTensor } from "../../src/model/gguf/GgufWriter.ts";
import { adapterTensorType } from "../../src/train/core/loraAdapter.ts";
import { float16ToFloat32, float32ToFloat16 } from "../../src/model/gguf/float16.ts";
import {
  as,
  backends,
  buildTestApp,
  datasetOf,
  KEY_A,
  KEY_B,
  madeUpPairs,
  testEnv,
  waitForRun,
  type Cleanup,
} from "../lib/helper.ts";

const stories = path.resolve(import.meta.dirname, "../../../shared/models/stories260Ktok512.gguf");
const skip = !fs.existsSync(stories) && "../shared/models/stories260Ktok512.gguf is not here (a fresh clone)";

/** Why the torch worker's test skips: no test model, or no Python with the torch trainer's packages. */
function torchSkip(): string | false {
  if (skip) return skip;
  const python = torchPythonForTests();
  return python.ok ? false : python.reason;
}

const BOUNDARY = "----conduit-adapter";

/** A multipart body of text fields and files (`[field, file name, bytes]`). */
function multipart(fields: Record<string, string>, files: [string, string, Buffer][]) {
  const parts: Buffer[] = [];
  for (const [name, value] of Object.entries(fields))
    parts.push(
      Buffer.from(`--${BOUNDARY}\r\nContent-Disposition: form-data; name="${name}"\r\n\r\n${value}\r\n`),
    );
  for (const [name, fileName, bytes] of files)
    parts.push(
      Buffer.from(
        `--${BOUNDARY}\r\nContent-Disposition: form-data; name="${name}"; filename="${fileName}"\r\n` +
          "Content-Type: application/octet-stream\r\n\r\n",
      ),
      bytes,
      Buffer.from("\r\n"),
    );
  parts.push(Buffer.from(`--${BOUNDARY}--\r\n`));
  return {
    payload: Buffer.concat(parts),
    headers: { "content-type": `multipart/form-data; boundary=${BOUNDARY}` },
  };
}

function importAdapter(
  app: FastifyInstance,
  fields: Record<string, string>,
  files: [string, string, Buffer][],
  key = KEY_A,
) {
  const { payload, headers } = multipart(fields, files);
  return as(app, key).post("/conduit/models/adapters", payload, { headers });
}

/** The test model as `stories` in a fresh app's models directory. */
async function storiesApp(t: Cleanup, backend: "sqlite" | "postgres", extra: Record<string, string> = {}) {
  const env = await testEnv(t, backend, extra);
  fs.copyFileSync(stories, path.join(env.dataDir, "models", "stories.gguf"));
  return buildTestApp(t, env, { scheduler: { pollMs: 200, concurrency: 1 } });
}

/** A greedy answer of `model`. */
async function answer(app: FastifyInstance, model: string, prompt: string, key = KEY_A): Promise<string> {
  const res = await as(app, key).post("/conduit/v1/chat", { model, prompt, max_tokens: 24, temperature: 0 });
  assert.equal(res.statusCode, 200, res.body);
  return res.json<{ choices: { text: string }[] }>().choices[0]!.text;
}

const PROMPTS = ["Once upon a time", "The cat"];

/** Trains a LoRA run of alice's on the test model and downloads its adapter. */
async function trainedRun(app: FastifyInstance, core: { scheduler: { start(): void } }) {
  core.scheduler.start();
  const datasetID = await datasetOf(app, madeUpPairs(12));
  const created = await as(app, KEY_A).post("/conduit/finetuning", {
    datasetID,
    baseModelName: "stories",
    method: "lora",
    loraRank: 4,
    loraAlpha: 8,
    // What the llama.cpp trainer trains (K and V get no gradient there); the K rows' order is tested below.
    loraTargets: ["attn_q", "attn_output", "ffn_gate", "ffn_up", "ffn_down"],
    epochs: 4,
    lr: 0.01,
  });
  assert.equal(created.statusCode, 200, created.body);
  const run = await waitForRun(app, created.json<{ id: string }>().id);
  assert.equal(run.status, "READY", run.logs.join("\n"));
  const artifact = await as(app, KEY_A).get(`/conduit/finetuning/${run.id}/artifact`);
  assert.equal(artifact.statusCode, 200, artifact.body);
  return { runId: run.id, adapter: artifact.rawPayload };
}

/** A GGUF adapter's tensors: name, ggml dims and values (F32 or F16). */
async function adapterTensors(
  bytes: Buffer,
): Promise<{ name: string; dims: number[]; values: Float32Array }[]> {
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "conduit-adapter-")), "a.gguf");
  fs.writeFileSync(file, bytes);
  try {
    const info = await readGgufFileInfo(file, { sourceType: "filesystem", logWarnings: false });
    return (info.tensorInfo ?? []).map((t) => {
      const dims = t.dimensions.map(Number);
      const count = dims.reduce((a, b) => a * b, 1);
      const at = Number(t.fileOffset);
      const values = new Float32Array(count);
      for (let i = 0; i < count; i++)
        values[i] =
          Number(t.ggmlType) === 0
            ? bytes.readFloatLE(at + i * 4)
            : Number(t.ggmlType) === 8 // Q8_0: blocks of an F16 scale and 32 bytes
              ? float16ToFloat32(bytes.readUInt16LE(at + Math.floor(i / 32) * 34)) *
                bytes.readInt8(at + Math.floor(i / 32) * 34 + 2 + (i % 32))
              : float16ToFloat32(bytes.readUInt16LE(at + i * 2));
      return { name: t.name, dims, values };
    });
  } finally {
    fs.rmSync(path.dirname(file), { recursive: true, force: true });
  }
}

const HF_MODULES: Record<string, string> = {
  attn_q: "self_attn.q_proj",
  attn_k: "self_attn.k_proj",
  attn_v: "self_attn.v_proj",
  attn_output: "self_attn.o_proj",
  ffn_gate: "mlp.gate_proj",
  ffn_up: "mlp.up_proj",
  ffn_down: "mlp.down_proj",
};

/**
 * Hugging Face's Q/K row order from llama.cpp's (the inverse of `convert_hf_to_gguf.py`'s `permute`): llama.cpp's
 * row `h·d + 2j + s` of head `h` is Hugging Face's row `h·d + s·d/2 + j`.
 */
function hfRows(rows: Float32Array, outputs: number, rank: number, heads: number): Float32Array {
  const out = new Float32Array(rows.length);
  const perHead = outputs / heads;
  for (let h = 0; h < heads; h++)
    for (let j = 0; j < perHead / 2; j++)
      for (let s = 0; s < 2; s++) {
        const llama = h * perHead + 2 * j + s;
        const hf = h * perHead + s * (perHead / 2) + j;
        out.set(rows.subarray(llama * rank, (llama + 1) * rank), hf * rank);
      }
  return out;
}

/** A safetensors file of F32 tensors (`[name, torch shape, values]`). */
function safetensors(tensors: [string, number[], Float32Array][]): Buffer {
  const header: Record<string, unknown> = { __metadata__: { format: "pt" } };
  let offset = 0;
  for (const [name, shape, values] of tensors) {
    header[name] = { dtype: "F32", shape, data_offsets: [offset, offset + values.length * 4] };
    offset += values.length * 4;
  }
  let json = JSON.stringify(header);
  json += " ".repeat((8 - (json.length % 8)) % 8);
  const length = Buffer.alloc(8);
  length.writeBigUInt64LE(BigInt(json.length));
  return Buffer.concat([
    length,
    Buffer.from(json),
    ...tensors.map(([, , values]) => Buffer.from(values.buffer, values.byteOffset, values.byteLength)),
  ]);
}

/** The run's GGUF adapter as a PEFT adapter would hold it (stories: 8 query heads, 4 key/value heads). */
async function asPeft(adapter: Buffer, rank: number, alpha: number) {
  const tensors: [string, number[], Float32Array][] = [];
  for (const t of await adapterTensors(adapter)) {
    const match = /^blk\.(\d+)\.([a-z_]+)\.weight\.lora_([ab])$/.exec(t.name);
    assert.ok(match, t.name);
    const [, block, target, half] = match;
    const name = `base_model.model.model.layers.${block}.${HF_MODULES[target!]}.lora_${half!.toUpperCase()}.weight`;
    // ggml [in, rank] is torch [rank, in]; ggml [rank, out] is torch [out, rank].
    let values = t.values;
    if (half === "b" && (target === "attn_q" || target === "attn_k"))
      values = hfRows(values, t.dims[1]!, rank, target === "attn_q" ? 8 : 4);
    tensors.push([name, [t.dims[1]!, t.dims[0]!], values]);
  }
  const config = {
    peft_type: "LORA",
    r: rank,
    lora_alpha: alpha,
    target_modules: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    bias: "none",
    base_model_name_or_path: "stories260K",
  };
  return { model: safetensors(tensors), config: Buffer.from(JSON.stringify(config)) };
}

/**
 * A GGUF LoRA adapter for the test model with the given tensors (`[name, ggml dims]`), zero-filled, or filled with
 * seeded noise of `noise`'s size.
 */
async function handmadeAdapter(
  tensors: [string, number[]][],
  metadata: Record<string, ReturnType<typeof gguf.str>> = {},
  noise = 0,
): Promise<Buffer> {
  let seed = 12345;
  const next = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31) * 2 - 1;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-adapter-"));
  const file = path.join(dir, "a.gguf");
  try {
    const list: GgufTensor[] = tensors.map(([name, dims]) => ({
      name,
      dims,
      // As a run's adapter is stored (Q8_0 where rows are whole blocks, else F16), and values F16 holds exactly,
      // so that a converted copy (written the same way) is the same adapter.
      type: adapterTensorType("Q8_0", dims[0]!),
      data: new Float32Array(dims.reduce((a, b) => a * b, 1)).map(() =>
        float16ToFloat32(float32ToFloat16(noise * next())),
      ),
    }));
    await writeGguf(
      file,
      {
        "general.architecture": gguf.str("llama"),
        "general.type": gguf.str("adapter"),
        "adapter.type": gguf.str("lora"),
        "adapter.lora.alpha": gguf.f32(8),
        ...metadata,
      },
      list,
    );
    return fs.readFileSync(file);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** `adapter` with the data offset of its 2-D tensor `name` moved 32 bytes on (its tensor info patched). */
function misplaced(adapter: Buffer, name: string): Buffer {
  const bytes = Buffer.from(adapter);
  const at = bytes.indexOf(Buffer.from(name)) + name.length + 4 + 2 * 8 + 4;
  bytes.writeBigUInt64LE(bytes.readBigUInt64LE(at) + 32n, at);
  return bytes;
}

for (const backend of backends()) {
  describe(`imported adapters (${backend})`, { skip }, () => {
    test("a run's GGUF adapter and the same adapter as PEFT files, imported, answer as the run; owner-only; deletable", async (t) => {
      const { app, core } = await storiesApp(t, backend);
      const { runId, adapter } = await trainedRun(app, core);
      const runAnswers = await Promise.all(PROMPTS.map((p) => answer(app, runId, p)));
      const baseAnswers = await Promise.all(PROMPTS.map((p) => answer(app, "stories", p)));
      assert.notDeepEqual(
        runAnswers,
        baseAnswers,
        "the run's adapter changes the answers (the test can tell)",
      );

      const imported = await importAdapter(app, { base_model: "stories", name: "from a run" }, [
        ["file", "adapter.gguf", adapter],
      ]);
      assert.equal(imported.statusCode, 200, imported.body);
      const record = imported.json();
      assert.match(record.id, /^ad_/);
      assert.equal(record.name, "from a run");
      assert.equal(record.base_model, "stories");
      assert.equal(record.format, "gguf");
      assert.equal(record.rank, 4);
      assert.equal(record.alpha, 8);
      assert.equal(record.weights, 5 * 5);
      assert.equal(record.size_bytes, adapter.length);
      assert.deepEqual(await Promise.all(PROMPTS.map((p) => answer(app, record.id, p))), runAnswers);

      const peft = await asPeft(adapter, 4, 8);
      const converted = await importAdapter(app, { base_model: "stories" }, [
        ["adapter_config", "adapter_config.json", peft.config],
        ["adapter_model", "adapter_model.safetensors", peft.model],
      ]);
      assert.equal(converted.statusCode, 200, converted.body);
      const peftRecord = converted.json();
      assert.equal(peftRecord.format, "peft");
      assert.equal(peftRecord.name, peftRecord.id);
      assert.equal(peftRecord.rank, 4);
      assert.deepEqual(
        await Promise.all(PROMPTS.map((p) => answer(app, peftRecord.id, p))),
        runAnswers,
        "the PEFT adapter, converted, answers as the run",
      );

      // Listed, and in the models list with its base, for alice only.
      const list = await as(app, KEY_A).get("/conduit/models/adapters");
      assert.deepEqual(
        list.json().map((a: { id: string }) => a.id),
        [record.id, peftRecord.id],
      );
      const models = (await as(app, KEY_A).get("/conduit/v1/models")).json();
      const entry = models.data.find((m: { id: string }) => m.id === record.id);
      assert.equal(entry?.kind, "adapter");
      assert.equal(entry?.base_model, "stories");
      assert.equal((await as(app, KEY_A).get(`/v1/models/${record.id}`)).statusCode, 200);
      assert.deepEqual((await as(app, KEY_B).get("/conduit/models/adapters")).json(), []);
      const bobsModels = (await as(app, KEY_B).get("/conduit/v1/models")).json();
      assert.ok(!bobsModels.data.some((m: { id: string }) => m.id === record.id));
      assert.equal((await as(app, KEY_B).get(`/conduit/models/adapters/${record.id}`)).statusCode, 404);
      assert.equal((await as(app, KEY_B).delete(`/conduit/models/adapters/${record.id}`)).statusCode, 404);
      const bobChat = await as(app, KEY_B).post("/conduit/v1/chat", {
        model: record.id,
        prompt: "x",
        max_tokens: 2,
      });
      assert.equal(bobChat.statusCode, 404, bobChat.body);
      assert.equal((await as(app, null).get("/conduit/models/adapters")).statusCode, 401);
      assert.equal(
        (await importAdapter(app, { base_model: "stories" }, [["file", "a.gguf", adapter]], "wrong-key-123"))
          .statusCode,
        401,
      );

      // Deleted: its file goes, and it no longer answers.
      const stored = (await core.adapters.get("alice", record.id)).path;
      assert.ok(fs.existsSync(stored));
      const deleted = await as(app, KEY_A).delete(`/conduit/models/adapters/${record.id}`);
      assert.equal(deleted.statusCode, 200, deleted.body);
      assert.ok(!fs.existsSync(stored), "the adapter's file is removed");
      assert.equal((await as(app, KEY_A).get(`/conduit/models/adapters/${record.id}`)).statusCode, 404);
      const gone = await as(app, KEY_A).post("/conduit/v1/chat", {
        model: record.id,
        prompt: "x",
        max_tokens: 2,
      });
      assert.equal(gone.statusCode, 404, gone.body);
      assert.equal((await as(app, KEY_A).get("/conduit/models/adapters")).json().length, 1);
    });

    test("a LoRA run downloads merged into its base: one GGUF that answers as the run, kept with the run", async (t) => {
      const { app, config, core } = await storiesApp(t, backend);
      const built = await trainedRun(app, core);
      const url = `/conduit/finetuning/${built.runId}/artifact?format=merged`;
      const merged = await as(app, KEY_A).get(url);
      assert.equal(merged.statusCode, 200, merged.body);
      assert.equal(
        merged.headers["content-disposition"],
        `attachment; filename="${built.runId}-merged.gguf"`,
      );
      assert.equal(
        merged.headers["content-length"],
        String(fs.statSync(stories).size),
        "the base's types and size",
      );
      const log = (await as(app, KEY_A).get(`/conduit/finetuning/${built.runId}`)).json().logs.join("\n");
      assert.match(log, /merged the adapter into stories: 25 weights, [\d.]+ MiB in [\d.]+ s/);
      // Built once: the second download is the kept file.
      const again = await as(app, KEY_A).get(url);
      assert.ok(again.rawPayload.equals(merged.rawPayload));
      // A base file replaced since (newer than the merge): merged again.
      const logLines = async () =>
        (await as(app, KEY_A).get(`/conduit/finetuning/${built.runId}`))
          .json()
          .logs.filter((line: string) => line.includes("merged the adapter")).length;
      assert.equal(await logLines(), 1);
      const later = new Date(Date.now() + 60_000);
      fs.utimesSync(path.join(config.dataDir, "models", "stories.gguf"), later, later);
      assert.equal((await as(app, KEY_A).get(url)).statusCode, 200);
      assert.equal(await logLines(), 2);
      assert.equal((await as(app, KEY_B).get(url)).statusCode, 404);
      assert.equal(
        (await as(app, KEY_A).get(`/conduit/finetuning/${built.runId}/artifact?format=whole`)).statusCode,
        400,
      );

      // Served as a base model of its own, it answers as the run does.
      fs.writeFileSync(path.join(config.dataDir, "models", "stories-merged.gguf"), merged.rawPayload);
      const runAnswers = await Promise.all(PROMPTS.map((p) => answer(app, built.runId, p)));
      assert.deepEqual(await Promise.all(PROMPTS.map((p) => answer(app, "stories-merged", p))), runAnswers);

      // Deleted with the run.
      const kept = path.join(config.dataDir, "blobs", "runs", built.runId, "merged.gguf");
      assert.ok(fs.existsSync(kept));
      assert.equal((await as(app, KEY_A).delete(`/conduit/finetuning/${built.runId}`)).statusCode, 200);
      assert.ok(!fs.existsSync(kept));
    });

    test(
      "a PEFT adapter the torch worker saved (save_pretrained), imported, answers as the worker's own GGUF adapter",
      { skip: torchSkip() },
      async (t) => {
        const python = torchPythonForTests();
        assert.ok(python.ok);
        const dir = fs.mkdtempSync(path.join(os.tmpdir(), "conduit-peft-"));
        t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
        const peftDir = path.join(dir, "peft");
        const outcome = await startTrainer(
          torchJob({
            method: "lora",
            lora: {
              rank: 4,
              alpha: 8,
              targets: ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"],
            },
            baseModelPath: stories,
            outputPath: path.join(dir, "adapter.gguf"),
            workDir: path.join(dir, "work"),
            samples: Array.from({ length: 12 }, (_, i) => [
              { text: `Once upon a time there was item ${i}.`, train: false },
              { text: ` It was ${(i * 7) % 10} apples.`, train: true },
            ]),
            learningRate: 2e-2,
            epochs: 3,
            seed: 0,
            lrSchedule: { kind: "constant" },
            options: { python: python.python, peftDir },
          }),
        ).done;
        assert.equal(outcome.status, "completed", JSON.stringify(outcome));
        const { app } = await storiesApp(t, backend);
        const viaGguf = await importAdapter(app, { base_model: "stories" }, [
          ["file", "adapter.gguf", fs.readFileSync(path.join(dir, "adapter.gguf"))],
        ]);
        assert.equal(viaGguf.statusCode, 200, viaGguf.body);
        const viaPeft = await importAdapter(app, { base_model: "stories" }, [
          [
            "adapter_model",
            "adapter_model.safetensors",
            fs.readFileSync(path.join(peftDir, "adapter_model.safetensors")),
          ],
          [
            "adapter_config",
            "adapter_config.json",
            fs.readFileSync(path.join(peftDir, "adapter_config.json")),
          ],
        ]);
        assert.equal(viaPeft.statusCode, 200, viaPeft.body);
        assert.equal(viaPeft.json().weights, 7 * 5);
        const ggufAnswers = await Promise.all(PROMPTS.map((p) => answer(app, viaGguf.json().id, p)));
        const baseAnswers = await Promise.all(PROMPTS.map((p) => answer(app, "stories", p)));
        assert.notDeepEqual(ggufAnswers, baseAnswers, "the adapter changes the answers (the test can tell)");
        assert.deepEqual(
          await Promise.all(PROMPTS.map((p) => answer(app, viaPeft.json().id, p))),
          ggufAnswers,
        );
      },
    );

    test("Q and K rows in Hugging Face's order (grouped-query attention) convert to llama.cpp's: PEFT answers as GGUF", async (t) => {
      const { app } = await storiesApp(t, backend);
      const tensors: [string, number[]][] = [];
      for (const block of [0, 1, 2, 3, 4])
        tensors.push(
          [`blk.${block}.attn_q.weight.lora_a`, [64, 4]],
          [`blk.${block}.attn_q.weight.lora_b`, [4, 64]],
          [`blk.${block}.attn_k.weight.lora_a`, [64, 4]],
          [`blk.${block}.attn_k.weight.lora_b`, [4, 32]],
        );
      const adapter = await handmadeAdapter(tensors, {}, 0.5);
      const viaGguf = await importAdapter(app, { base_model: "stories" }, [["file", "a.gguf", adapter]]);
      assert.equal(viaGguf.statusCode, 200, viaGguf.body);
      const peft = await asPeft(adapter, 4, 8);
      const viaPeft = await importAdapter(app, { base_model: "stories" }, [
        ["adapter_model", "adapter_model.safetensors", peft.model],
        ["adapter_config", "adapter_config.json", peft.config],
      ]);
      assert.equal(viaPeft.statusCode, 200, viaPeft.body);
      const ggufAnswers = await Promise.all(PROMPTS.map((p) => answer(app, viaGguf.json().id, p)));
      const baseAnswers = await Promise.all(PROMPTS.map((p) => answer(app, "stories", p)));
      assert.notDeepEqual(ggufAnswers, baseAnswers, "the adapter changes the answers (the test can tell)");
      assert.deepEqual(await Promise.all(PROMPTS.map((p) => answer(app, viaPeft.json().id, p))), ggufAnswers);
    });

    test("a wrong base, a truncated file, a foreign tensor, a wrong shape or a missing config: 400 naming it, nothing kept", async (t) => {
      const { app, config } = await storiesApp(t, backend);
      const good = await handmadeAdapter([
        ["blk.4.attn_q.weight.lora_a", [64, 4]],
        ["blk.4.attn_q.weight.lora_b", [4, 64]],
        ["blk.4.ffn_down.weight.lora_a", [172, 4]],
        ["blk.4.ffn_down.weight.lora_b", [4, 64]],
      ]);
      const zeros = (n: number) => new Float32Array(n);
      const peftTensors = (extra: [string, number[], Float32Array][] = []) =>
        safetensors([
          ["base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", [4, 64], zeros(256)],
          ["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", [32, 4], zeros(128)],
          ...extra,
        ]);
      const peftConfig = (fields: Record<string, unknown> = {}) =>
        Buffer.from(JSON.stringify({ peft_type: "LORA", r: 4, lora_alpha: 8, bias: "none", ...fields }));
      const cases: {
        name: string;
        fields?: Record<string, string>;
        files: [string, string, Buffer][];
        status?: number;
        param: string;
        message: RegExp;
      }[] = [
        {
          name: "a base model that is not there",
          fields: { base_model: "nope" },
          files: [["file", "a.gguf", good]],
          status: 404,
          param: "base_model",
          message: /base model "nope" is not in the models directory/,
        },
        {
          name: "another base (tiny's weights have other shapes)",
          fields: { base_model: "tiny" },
          files: [["file", "a.gguf", good]],
          param: "base_model",
          message: /base model "tiny"/,
        },
        {
          name: "another architecture",
          files: [
            [
              "file",
              "a.gguf",
              await handmadeAdapter([["blk.0.attn_q.weight.lora_a", [64, 4]]], {
                "general.architecture": gguf.str("qwen2"),
              }),
            ],
          ],
          param: "base_model",
          message: /architecture "qwen2", and base model "stories" is "llama"/,
        },
        {
          name: "a truncated file",
          files: [["file", "a.gguf", good.subarray(0, good.length - 100)]],
          param: "file",
          message: /the file is truncated: tensor "blk\.4\.ffn_down\.weight\.lora_b" ends at byte/,
        },
        {
          name: "a tensor's data where GGUF does not put it",
          files: [["file", "a.gguf", misplaced(good, "blk.4.attn_q.weight.lora_b")]],
          param: "file",
          message:
            /tensor "blk\.4\.attn_q\.weight\.lora_b"'s data is at offset 320 of the data section, where GGUF puts it at 288/,
        },
        {
          name: "a file cut inside its header",
          files: [["file", "a.gguf", good.subarray(0, 60)]],
          param: "file",
          message: /GGUF header cannot be read/,
        },
        {
          name: "not a GGUF file",
          files: [["file", "a.gguf", Buffer.from("hello, this is not a model")]],
          param: "file",
          message: /not a GGUF file/,
        },
        {
          name: "a model, not an adapter",
          files: [["file", "stories.gguf", fs.readFileSync(stories)]],
          param: "file",
          message: /not a LoRA adapter \(general\.type is null/,
        },
        {
          name: "a tensor of a weight the base does not have",
          files: [
            [
              "file",
              "a.gguf",
              await handmadeAdapter([
                ["blk.9.attn_q.weight.lora_a", [64, 4]],
                ["blk.9.attn_q.weight.lora_b", [4, 64]],
              ]),
            ],
          ],
          param: "base_model",
          message:
            /tensor "blk\.9\.attn_q\.weight\.lora_a" adapts "blk\.9\.attn_q\.weight", which base model "stories" does not have/,
        },
        {
          name: "a tensor that is not a LoRA half",
          files: [["file", "a.gguf", await handmadeAdapter([["token_embd.weight", [64, 512]]])]],
          param: "file",
          message: /tensor "token_embd\.weight" is not a LoRA tensor/,
        },
        {
          name: "a wrong shape",
          files: [
            [
              "file",
              "a.gguf",
              await handmadeAdapter([
                ["blk.0.attn_k.weight.lora_a", [64, 4]],
                ["blk.0.attn_k.weight.lora_b", [4, 64]],
              ]),
            ],
          ],
          param: "base_model",
          message:
            /"blk\.0\.attn_k\.weight" is \[64, 32\] in base model "stories", so its lora_a must be \[64, rank\] and its lora_b \[rank, 32\]; the adapter's are \[64, 4\] and \[4, 64\]/,
        },
        {
          name: "half a pair",
          files: [["file", "a.gguf", await handmadeAdapter([["blk.0.attn_q.weight.lora_a", [64, 4]]])]],
          param: "file",
          message: /"blk\.0\.attn_q\.weight" has a lora_a but no lora_b tensor/,
        },
        {
          name: "no alpha",
          files: [
            [
              "file",
              "a.gguf",
              await handmadeAdapter(
                [
                  ["blk.0.attn_q.weight.lora_a", [64, 4]],
                  ["blk.0.attn_q.weight.lora_b", [4, 64]],
                ],
                { "adapter.lora.alpha": gguf.str("big") },
              ),
            ],
          ],
          param: "file",
          message: /adapter\.lora\.alpha is NaN/,
        },
        {
          name: "a PEFT adapter without its config",
          files: [["adapter_model", "adapter_model.safetensors", peftTensors()]],
          param: "adapter_config",
          message: /a PEFT adapter needs "adapter_config"/,
        },
        {
          name: "a PEFT config without its tensors",
          files: [["adapter_config", "adapter_config.json", peftConfig()]],
          param: "adapter_model",
          message: /a PEFT adapter needs "adapter_model"/,
        },
        {
          name: "a PEFT tensor of a module Conduit does not map",
          files: [
            [
              "adapter_model",
              "m.safetensors",
              peftTensors([
                ["base_model.model.model.layers.0.self_attn.rotary_emb.lora_A.weight", [4, 8], zeros(32)],
              ]),
            ],
            ["adapter_config", "c.json", peftConfig()],
          ],
          param: "adapter_model",
          message:
            /tensor "base_model\.model\.model\.layers\.0\.self_attn\.rotary_emb\.lora_A\.weight" is not a LoRA tensor/,
        },
        {
          name: "a PEFT tensor of a layer the base does not have",
          files: [
            [
              "adapter_model",
              "m.safetensors",
              peftTensors([
                ["base_model.model.model.layers.7.mlp.up_proj.lora_A.weight", [4, 64], zeros(256)],
              ]),
            ],
            ["adapter_config", "c.json", peftConfig()],
          ],
          param: "base_model",
          message: /adapts "blk\.7\.ffn_up\.weight", which base model "stories" does not have/,
        },
        {
          name: "a PEFT tensor of a wrong shape",
          files: [
            [
              "adapter_model",
              "m.safetensors",
              safetensors([
                ["base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight", [4, 64], zeros(256)],
                ["base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight", [64, 4], zeros(256)],
              ]),
            ],
            ["adapter_config", "c.json", peftConfig()],
          ],
          param: "base_model",
          message: /"blk\.0\.attn_v\.weight" is 32×64 \(out × in\) in base model "stories"/,
        },
        {
          name: "a truncated safetensors file",
          files: [
            ["adapter_model", "m.safetensors", peftTensors().subarray(0, 300)],
            ["adapter_config", "c.json", peftConfig()],
          ],
          param: "adapter_model",
          message: /adapter_model\.safetensors is truncated/,
        },
        {
          name: "a PEFT rank other than its config's",
          files: [
            ["adapter_model", "m.safetensors", peftTensors()],
            ["adapter_config", "c.json", peftConfig({ r: 8 })],
          ],
          param: "adapter_model",
          message: /rank 4\/4, and adapter_config\.json's r is 8/,
        },
        {
          name: "a DoRA adapter",
          files: [
            ["adapter_model", "m.safetensors", peftTensors()],
            ["adapter_config", "c.json", peftConfig({ use_dora: true })],
          ],
          param: "adapter_config",
          message: /use_dora is true/,
        },
        {
          name: "a config that is not JSON",
          files: [
            ["adapter_model", "m.safetensors", peftTensors()],
            ["adapter_config", "c.json", Buffer.from("{r: 4")],
          ],
          param: "adapter_config",
          message: /adapter_config\.json is not JSON/,
        },
        {
          name: "a GGUF and PEFT files at once",
          files: [
            ["file", "a.gguf", good],
            ["adapter_model", "m.safetensors", peftTensors()],
          ],
          param: "file",
          message: /not both/,
        },
        {
          name: "no base model",
          fields: {},
          files: [["file", "a.gguf", good]],
          param: "base_model",
          message: /field "base_model" is required/,
        },
        {
          name: "an unknown field",
          fields: { base_model: "stories", scale: "2" },
          files: [["file", "a.gguf", good]],
          param: "scale",
          message: /multipart field "scale" is not known/,
        },
      ];
      for (const c of cases) {
        const res = await importAdapter(app, c.fields ?? { base_model: "stories" }, c.files);
        assert.equal(res.statusCode, c.status ?? 400, `${c.name}: ${res.body}`);
        assert.equal(res.json().error.param, c.param, `${c.name}: ${res.body}`);
        assert.match(res.json().error.message, c.message, c.name);
      }
      assert.deepEqual((await as(app, KEY_A).get("/conduit/models/adapters")).json(), [], "nothing is kept");
      const blobs = path.join(config.dataDir, "blobs");
      assert.deepEqual(fs.readdirSync(path.join(blobs, ".tmp")), [], "no temp file is left");
      assert.ok(
        !fs.existsSync(path.join(blobs, "adapters")) ||
          fs.readdirSync(path.join(blobs, "adapters")).length === 0,
      );

      // The handmade adapter itself is fine, and chats (its B is zero: it answers as the base does).
      const ok = await importAdapter(app, { base_model: "stories" }, [["file", "a.gguf", good]]);
      assert.equal(ok.statusCode, 200, ok.body);
      assert.equal(await answer(app, ok.json().id, "The cat"), await answer(app, "stories", "The cat"));
    });

    test("an adapter file over CONDUIT_MAX_ADAPTER_BYTES is a 413", async (t) => {
      const { app } = await storiesApp(t, backend, { CONDUIT_MAX_ADAPTER_BYTES: "2048" });
      const big = await handmadeAdapter([
        ["blk.4.ffn_down.weight.lora_a", [172, 4]],
        ["blk.4.ffn_down.weight.lora_b", [4, 64]],
      ]);
      const res = await importAdapter(app, { base_model: "stories" }, [["file", "a.gguf", big]]);
      assert.equal(res.statusCode, 413, res.body);
      assert.match(res.json().error.message, /CONDUIT_MAX_ADAPTER_BYTES/);
    });
  });
}
