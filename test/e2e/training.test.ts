import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { describe, test } from "node:test";
import type { FastifyInstance } from "fastify";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import {
  as,
  asAlice,
  buildTestApp,
  datasetOf,
  KEY_A,
  runEnded,
  startRun,
  testEnv,
  waitForRun,
  type TestEnv,
} from "../lib/helper.ts";
import { madeUpPairs, madeUpWords } from "../lib/helper.ts";

const words = madeUpWords;
const pairs = madeUpPairs();

/** The tiny model, 128 wide (the default 64 memorises too slowly for a test), as model `tiny128`. */
async function tiny128(env: TestEnv): Promise<string> {
  const file = path.join(env.dataDir, "models", "tiny128.gguf");
  await createTinyModel(file, { seed: 1, embeddingLength: 128 });
  return file;
}

/** A full fine-tune of `model` on a dataset, with settings that memorise a few pairs; waits until it is READY. */
async function memorised(app: FastifyInstance, datasetID: string, model: string) {
  const id = await startRun(app, { datasetID, baseModelName: model, method: "full", lr: 0.003, epochs: 200 });
  // A generous limit: a shared 2-core machine under load trains several times slower.
  const run = await waitForRun(app, id, runEnded, { timeoutMs: 360_000 });
  assert.equal(run.status, "READY", run.logs.join("\n"));
  return { id, run };
}

/** An app whose scheduler runs, polling every 200 ms. */
async function trainingApp(t: { after(fn: () => unknown): void }, env?: TestEnv) {
  const built = await buildTestApp(t, env ?? (await testEnv(t)), {
    scheduler: { pollMs: 200, concurrency: 1 },
  });
  built.core.scheduler.start();
  return built;
}

describe("fine-tuning runs on the tiny model", () => {
  test("full fine-tuning memorises 20 IO pairs: greedy inference through the API reproduces at least 18", async (t) => {
    const env = await testEnv(t);
    // The default tiny model (64 wide) memorises too slowly for a test; 128 wide does it in ~30 s.
    await tiny128(env);
    const { app } = await trainingApp(t, env);
    const datasetID = await datasetOf(app, pairs);
    const { id, run } = await memorised(app, datasetID, "tiny128");
    assert.ok(run.stats.step > 0 && run.stats.step === run.stats.totalSteps);
    assert.ok(Array.isArray(run.stats.lossSeries) && run.stats.lossSeries.length > 1);
    const first = run.stats.lossSeries[0].trainLoss;
    const last = run.stats.lossSeries.at(-1).trainLoss;

    assert.ok(last < first / 4, `loss fell from ${first} to ${last}`);

    let exact = 0;
    let learned = pairs[0]!;
    for (const pair of pairs) {
      const res = await app.inject({
        method: "POST",
        url: `/conduit/finetuning/${id}/inference`,
        headers: asAlice,
        // The Conduit API's run fields are accepted alongside the chat fields.
        // the Conduit API's default penalties (1.0) would push a greedy answer off repeated letters.
        payload: {
          prompt: pair.input,
          temperature: 0,
          presence_penalty: 0,
          frequency_penalty: 0,
          max_tokens: 24,
          datasetID,
          lr: 1,
        },
      });
      assert.equal(res.statusCode, 200, res.body);
      if (res.json().response === pair.output) {
        exact++;
        learned = pair;
      } else
        console.log(`missed: ${pair.input} -> ${JSON.stringify(res.json().response)} (want ${pair.output})`);
    }
    assert.ok(exact >= 18, `${exact}/20 reproduced exactly`);

    // The served model keeps its base's context (llama.cpp's save writes the training window),
    // so the Conduit API's default max_tokens of 256 works.
    const defaults = await as(app, KEY_A).post(`/conduit/finetuning/${id}/inference`, {
      prompt: learned.input,
    });
    assert.equal(defaults.statusCode, 200, defaults.body);

    // The run id is a model everywhere else too.
    const chat = await as(app, KEY_A).post("/conduit/v1/chat", {
      model: id,
      prompt: learned.input,
      temperature: 0,
      presence_penalty: 0,
      frequency_penalty: 0,
      max_tokens: 24,
    });
    assert.equal(chat.json().choices[0].text, learned.output);
    const models = (await as(app, KEY_A).get("/v1/models")).json();
    assert.ok(models.data.some((m: { id: string }) => m.id === id));

    // Deleting a READY run removes its model.
    const modelDir = path.join(env.dataDir, "blobs", "runs", id);
    assert.ok(fs.existsSync(path.join(modelDir, "model.gguf")));
    assert.equal((await as(app, KEY_A).delete(`/conduit/finetuning/${id}`)).statusCode, 200);
    assert.equal(fs.existsSync(modelDir), false);
    const gone = await as(app, KEY_A).post("/conduit/v1/chat", { model: id, prompt: "x" });
    assert.equal(gone.statusCode, 404);
  });
});

// The run lifecycle's edges (cancel, delete, lost lease, shutdown, a failed or crashed trainer, a dead
// worker's run, the events stream) are in scheduler.test.ts, with a fake trainer; trainer.test.ts has the
// real trainer's side of each (cancel at a step boundary, a corrupt model, a kill, the token limit).

/** Greedy answers of `model` (a run id) to each input, through the Conduit API's chat endpoint. */
async function answers(app: FastifyInstance, model: string, inputs: string[]): Promise<string[]> {
  const out: string[] = [];
  for (const input of inputs) {
    const res = await as(app, KEY_A).post("/conduit/v1/chat", {
      model,
      prompt: input,
      temperature: 0,
      presence_penalty: 0,
      frequency_penalty: 0,
      max_tokens: 24,
    });
    assert.equal(res.statusCode, 200, res.body);
    out.push(res.json().choices[0].text);
  }
  return out;
}

describe("LoRA runs on the tiny model", () => {
  /** Settings with which a LoRA adapter memorises the 20 pairs on the random tiny model (see bench/README.md §LoRA). */
  const memorise = { method: "lora", loraRank: 32, loraAlpha: 64, lr: 0.003, epochs: 200 };

  for (const baseType of ["F32", "Q8_0"] as const) {
    test(`memorises 20 IO pairs on a frozen ${baseType} base: >= 18 exact through the API, a small adapter`, async (t) => {
      // Without the BLAS backend (npm run setup:trainer), which trains every base in F32: this is QLoRA's path.
      const env = await testEnv(t, "sqlite", { CONDUIT_TRAINER_BLAS: "off" });
      const f32 = await tiny128(env);
      const f32Bytes = fs.statSync(f32).size;
      if (baseType !== "F32") {
        const { convertModel } = await import("../../src/train/native/runTraining.ts");
        convertModel(f32, path.join(env.dataDir, "models", "tiny128-q8.gguf"), "Q8_0");
        fs.rmSync(f32);
      }
      const baseModelName = baseType === "F32" ? "tiny128" : "tiny128-q8";
      const { app } = await trainingApp(t, env);
      const datasetID = await datasetOf(app, pairs);
      const id = await startRun(app, { datasetID, baseModelName, ...memorise });
      const run = await waitForRun(app, id, runEnded, { timeoutMs: 360_000 });
      assert.equal(run.status, "READY", run.logs.join("\n"));
      assert.ok(
        run.logs.some((line) => line.includes("LoRA rank 32")),
        run.logs.join("\n"),
      );
      // QLoRA: a quantized base is trained through as it is, never converted.
      assert.ok(!run.logs.some((line) => /convert/i.test(line)), run.logs.join("\n"));

      const got = await answers(
        app,
        id,
        pairs.map((p) => p.input),
      );
      const exact = got.filter((text, i) => text === pairs[i]!.output).length;
      // The Conduit API's run endpoint serves the same adapter on the same base.
      const conduit = await as(app, KEY_A).post(`/conduit/finetuning/${id}/inference`, {
        prompt: pairs[0]!.input,
        temperature: 0,
        presence_penalty: 0,
        frequency_penalty: 0,
        max_tokens: 24,
      });
      assert.equal(conduit.statusCode, 200, conduit.body);
      assert.equal(conduit.json().response, got[0]);
      t.diagnostic(`${baseType} base: ${exact}/20 exact, loss ${run.stats.final.finalTrainLoss}`);
      assert.ok(exact >= 18, `${exact}/20 exact: ${JSON.stringify(got)}`);

      // The run keeps only its adapter: its F32 parameters and a header, no copy of the model.
      const adapter = path.join(env.dataDir, "blobs", "runs", id, "adapter.gguf");
      const adapterBytes = fs.statSync(adapter).size;
      const parameters = run.stats.final.trainableParameters;
      assert.ok(
        adapterBytes < 4 * parameters + 65_536,
        `adapter ${adapterBytes} B for ${parameters} parameters`,
      );
      assert.ok(adapterBytes < f32Bytes / 3, `adapter ${adapterBytes} B, F32 model ${f32Bytes} B`);
      assert.equal(fs.existsSync(path.join(env.dataDir, "blobs", "runs", id, "model.gguf")), false);
      assert.equal(run.stats.final.outputBytes, adapterBytes);

      // The artifact is that adapter, and it loads on the base in plain node-llama-cpp.
      const download = await as(app, KEY_A).get(`/conduit/finetuning/${id}/artifact`);
      assert.equal(download.statusCode, 200);
      assert.match(String(download.headers["content-disposition"]), new RegExp(`${id}-lora\\.gguf`));
      assert.deepEqual(download.rawPayload, fs.readFileSync(adapter));
      const copy = path.join(env.dataDir, "downloaded.gguf");
      fs.writeFileSync(copy, download.rawPayload);
      const { getLlama, LlamaLogLevel } = await import("node-llama-cpp");
      const llama = await getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.warn });
      const model = await llama.loadModel({
        modelPath: path.join(env.dataDir, "models", `${baseModelName}.gguf`),
      });
      t.after(() => model.dispose());
      const context = await model.createContext({
        contextSize: 256,
        lora: { adapters: [{ filePath: copy }] },
      });
      const learned = pairs.find((p, i) => got[i] === p.output)!;
      const sequence = context.getSequence();
      const prompt = `<|im_start|>user\n${learned.input}<|im_end|>\n<|im_start|>assistant\n`;
      const generated: number[] = [];
      for await (const token of sequence.evaluate(
        [...(model.tokens.bos !== null ? [model.tokens.bos] : []), ...model.tokenize(prompt, true)],
        { temperature: 0 },
      )) {
        if (model.isEogToken(token) || generated.length >= 24) break;
        generated.push(token);
      }
      assert.equal(model.detokenize(generated as never), learned.output);
      await context.dispose();

      // Deleting the run removes its adapter.
      assert.equal((await as(app, KEY_A).delete(`/conduit/finetuning/${id}`)).statusCode, 200);
      assert.equal(fs.existsSync(adapter), false);
    });
  }

  test("two LoRA runs of one base answer differently while the base is loaded once", async (t) => {
    const env = await testEnv(t);
    await tiny128(env);
    const { app, core } = await trainingApp(t, env);
    // The same four questions, answered differently by each dataset.
    const questions = pairs.slice(0, 4).map((p) => p.input);
    const first = questions.map((input, i) => ({ input, output: `${words[i + 10]} ${i}` }));
    const second = questions.map((input, i) => ({ input, output: `${words[i + 15]} ${i + 5}` }));
    const ids: string[] = [];
    for (const items of [first, second]) {
      const id = await startRun(app, {
        datasetID: await datasetOf(app, items),
        baseModelName: "tiny128",
        ...memorise,
        epochs: 600,
      });
      const run = await waitForRun(app, id, runEnded, { timeoutMs: 360_000 });
      assert.equal(run.status, "READY", run.logs.join("\n"));
      ids.push(id);
    }
    const engine = core.engine;
    const before = engine.stats();
    const a = await answers(app, ids[0]!, questions);
    const b = await answers(app, ids[1]!, questions);
    const base = await answers(app, "tiny128", questions);
    assert.deepEqual(
      a,
      first.map((p) => p.output),
    );
    assert.deepEqual(
      b,
      second.map((p) => p.output),
    );
    assert.notDeepEqual(base, a);
    const stats = engine.stats();
    // Three servable models (the base and two adapters), one copy of the weights.
    assert.equal(stats.loadedModels - before.loadedModels, 3);
    assert.equal(stats.loadedBases, 1);
    const loaded = engine.loaded();
    assert.equal(new Set(loaded.map((m) => m.path)).size, 1);
    assert.deepEqual(
      loaded
        .filter((m) => m.lora !== undefined)
        .map((m) => m.id)
        .sort(),
      [...ids].sort(),
    );
  });
});

/** A READY run's examples through the API, worst first. */
async function examplesOf(
  app: FastifyInstance,
  id: string,
  query = "",
): Promise<
  { split: string; index: number; input: string; output: string; loss: number | null; tokens: number }[]
> {
  const res = await as(app, KEY_A).get(`/conduit/finetuning/${id}/examples?limit=100${query}`);
  assert.equal(res.statusCode, 200, res.body);
  return res.json();
}

describe("runs that learn by default", () => {
  test("a run with every setting left to auto learns 10 pairs, trained on the answers only", async (t) => {
    const env = await testEnv(t);
    await tiny128(env);
    const { app } = await trainingApp(t, env);
    const ten = pairs.slice(0, 10);
    const res = await as(app, KEY_A).post("/conduit/finetuning", {
      datasetID: await datasetOf(app, ten),
      baseModelName: "tiny128",
    });
    assert.equal(res.statusCode, 200, res.body);
    const { id, config } = res.json();
    assert.deepEqual([...config.autoSettings].sort(), ["epochs", "loraRank", "lr"]);
    assert.equal(config.trainOnInputs, false);
    assert.ok(config.epochs > 3 && config.lr > 0 && config.loraRank >= 8, JSON.stringify(config));
    const run = await waitForRun(app, id, runEnded, { timeoutMs: 360_000 });
    assert.equal(run.status, "READY", run.logs.join("\n"));
    assert.ok(
      run.logs.some((line) => line.includes("auto settings: 200 epochs")),
      run.logs.join("\n"),
    );
    assert.ok(
      run.logs.some((line) => line.includes("trained on the answers only")),
      run.logs.join("\n"),
    );

    // the Conduit API's default request parameters, except a greedy temperature.
    const got: string[] = [];
    for (const pair of ten) {
      const chat = await as(app, KEY_A).post("/conduit/v1/chat", {
        model: id,
        prompt: pair.input,
        temperature: 0,
      });
      assert.equal(chat.statusCode, 200, chat.body);
      got.push(chat.json().choices[0].text);
    }
    const exact = got.filter((text, i) => text === ten[i]!.output).length;
    t.diagnostic(
      `auto (${config.epochs} epochs, lr ${config.lr}, rank ${config.loraRank}): ${exact}/10 exact`,
    );
    assert.ok(exact >= 9, `${exact}/10 exact: ${JSON.stringify(got)}`);

    // Only answer tokens count: the loss is per answer token, and every example has a few.
    const examples = await examplesOf(app, id, "&sort=index");
    assert.equal(examples.length, 10);
    assert.ok(
      examples.every((e) => e.split === "train" && e.tokens >= 3 && e.tokens <= 12),
      JSON.stringify(examples),
    );
    assert.equal(
      run.stats.final.lossTokens / run.stats.final.epochs,
      examples.reduce((s, e) => s + e.tokens, 0),
    );

    // The run's own endpoint takes response_format too: the answer follows the schema.
    const structured = await as(app, KEY_A).post(`/conduit/finetuning/${id}/inference`, {
      prompt: ten[0]!.input,
      temperature: 0,
      max_tokens: 64,
      response_format: {
        type: "json_schema",
        json_schema: {
          name: "flag",
          schema: {
            type: "object",
            properties: { ok: { type: "boolean" } },
            required: ["ok"],
            additionalProperties: false,
          },
        },
      },
    });
    assert.equal(structured.statusCode, 200, structured.body);
    assert.equal(typeof JSON.parse(structured.json().response).ok, "boolean", structured.body);
  });

  test("the best checkpoint by validation loss is the one served; early stopping and a warning", async (t) => {
    const env = await testEnv(t);
    await tiny128(env);
    const { app } = await trainingApp(t, env);
    const six = pairs.slice(0, 6);
    // The validation file asks the same questions with other answers: the more the run memorises its
    // training answers, the worse it does there, so its best evaluation comes early.
    const contrary = six.map((p, i) => ({ input: p.input, output: `${words[(i * 3 + 11) % 20]} ${i + 40}` }));
    const validationDataset = await datasetOf(app, contrary);
    const files = (await as(app, KEY_A).get(`/conduit/dataset/${validationDataset}/files`)).json();
    const id = await startRun(app, {
      datasetID: await datasetOf(app, six),
      baseModelName: "tiny128",
      validationFileID: files[0].id,
      earlyStoppingPatience: 5,
      epochs: 300,
    });
    const run = await waitForRun(app, id, runEnded, { timeoutMs: 360_000 });
    assert.equal(run.status, "READY", run.logs.join("\n"));
    const { final } = run.stats;
    assert.equal(final.stoppedEarly, true, run.logs.join("\n"));
    assert.equal(run.stats.stoppedEarly, true);
    assert.ok(final.epochs < 300);
    assert.equal(run.stats.bestEpoch, final.bestEpoch);
    // Five evaluations without a drop beyond the noise margin; the served checkpoint is the one with the lowest
    // eval loss, before the last.
    assert.ok(final.bestEpoch < final.epochs, JSON.stringify(final));
    assert.ok(final.finalEvalLoss > final.bestEvalLoss);
    // The served checkpoint is the lowest eval loss the run measured, not a later one near it.
    const evalLosses = (run.stats.evalLossSeries as { evalLoss: number }[]).map((e) => e.evalLoss);
    assert.equal(final.bestEvalLoss, Math.min(...evalLosses), JSON.stringify(evalLosses));
    assert.ok(
      run.logs.some((line) => line.includes("stopping early")),
      run.logs.join("\n"),
    );
    assert.ok(
      run.stats.warnings.some((w: string) => w.includes("eval loss rose")),
      JSON.stringify(run.stats.warnings),
    );

    // The examples' losses are measured with the served weights: on the validation file they average to
    // the best evaluation's loss, not the last one's.
    const validation = await examplesOf(app, id, "&split=validation");
    assert.equal(validation.length, 6);
    const tokens = validation.reduce((sum, e) => sum + e.tokens, 0);
    const mean = validation.reduce((sum, e) => sum + e.loss! * e.tokens, 0) / tokens;
    t.diagnostic(
      `best epoch ${final.bestEpoch}/${final.epochs}: served ${mean}, best ${final.bestEvalLoss}, last ${final.finalEvalLoss}`,
    );
    assert.ok(
      Math.abs(mean - final.bestEvalLoss) < 1e-3 * final.bestEvalLoss,
      `${mean} vs ${final.bestEvalLoss}`,
    );
    // The checkpoint directory is gone once the run is READY.
    assert.equal(fs.existsSync(path.join(env.dataDir, "blobs", "runs", id, "checkpoint")), false);
  });

  test("per-example loss ranks a mislabeled pair first", async (t) => {
    const env = await testEnv(t);
    await tiny128(env);
    const { app } = await trainingApp(t, env);
    // One question asked three times with one answer, and once more with a contrary one.
    const question = pairs[0]!;
    const items = [
      question,
      ...pairs.slice(1, 5),
      question,
      { input: question.input, output: "frost 99" },
      question,
    ];
    const id = await startRun(app, {
      datasetID: await datasetOf(app, items),
      baseModelName: "tiny128",
      epochs: 100,
    });
    const run = await waitForRun(app, id, runEnded, { timeoutMs: 360_000 });
    assert.equal(run.status, "READY", run.logs.join("\n"));
    const ranked = await examplesOf(app, id);
    t.diagnostic(ranked.map((e) => `${e.index} ${e.output} ${e.loss?.toFixed(3)}`).join("; "));
    assert.equal(ranked[0]!.output, "frost 99");
    assert.equal(ranked[0]!.index, 6);
    // Per answer token, so the one contrary word is diluted, yet it stands well above the agreeing copies.
    const copies = ranked.filter((e) => e.input === question.input && e.output === question.output);
    assert.equal(copies.length, 3);
    assert.ok(
      copies.every((e) => ranked[0]!.loss! > 2 * e.loss!),
      JSON.stringify(ranked),
    );
  });

  test("a run interrupted by a restart resumes from its checkpoint", async (t) => {
    const env = await testEnv(t);
    await tiny128(env);
    const { app: first } = await trainingApp(t, env);
    const id = await startRun(first, {
      datasetID: await datasetOf(first, pairs.slice(0, 4)),
      baseModelName: "tiny128",
      epochs: 400,
    });
    const state = path.join(env.dataDir, "blobs", "runs", id, "checkpoint", "latest.json");
    const deadline = Date.now() + 120_000;
    while (!fs.existsSync(state)) {
      assert.ok(Date.now() < deadline, "no checkpoint was written");
      await new Promise((r) => setTimeout(r, 100));
    }
    // Let it train on past the checkpoint, then shut the server down mid-run.
    await new Promise((r) => setTimeout(r, 1500));
    await first.close();
    const saved = JSON.parse(fs.readFileSync(state, "utf8"));
    assert.ok(saved.step > 0);

    const { app: second } = await trainingApp(t, env);
    const run = await waitForRun(second, id, runEnded, { timeoutMs: 240_000 });
    assert.equal(run.status, "READY", run.logs.join("\n"));
    assert.ok(
      run.logs.some((line) => line.includes(`resuming from the checkpoint at step ${saved.step}`)),
      run.logs.join("\n"),
    );
    const { final } = run.stats;
    assert.equal(final.resumedFromStep, saved.step);
    assert.equal(final.epochs, 400);
    // The second attempt trained only the steps after the checkpoint (one window of all four pairs per epoch).
    const perStep = (await examplesOf(second, id)).reduce((sum, e) => sum + e.tokens, 0);
    assert.equal(final.steps, 400);
    assert.equal(final.lossTokens, (400 - saved.step) * perStep);
  });
});

describe("clean ends on the fallback template", () => {
  test("a fine-tune of a model without a template or turn tokens ends its answers with EOS: no marker fragments at any max_tokens", async (t) => {
    const env = await testEnv(t);
    // No chat template and no ChatML tokens: the ChatML fallback, written as plain text.
    await createTinyModel(path.join(env.dataDir, "models", "bare128.gguf"), {
      seed: 1,
      embeddingLength: 128,
      chatTemplate: null,
      turnTokens: null,
    });
    const { app } = await trainingApp(t, env);
    const colours = [
      { input: "What colour is grass?", output: "green" },
      { input: "What colour is the sky?", output: "blue" },
      { input: "What colour is snow?", output: "white" },
      { input: "What colour is blood?", output: "red" },
    ];
    const { id } = await memorised(app, await datasetOf(app, colours), "bare128");
    const model = (await as(app, KEY_A).get(`/conduit/v1/models/${id}`)).json();
    assert.deepEqual(model.chat_template, { source: "fallback", name: "chatml" });

    const fragments = /<\||im_|_end|\|>|<\/s>/;
    for (const pair of colours)
      for (let maxTokens = 1; maxTokens <= 8; maxTokens++) {
        const res = await app.inject({
          method: "POST",
          url: "/v1/chat/completions",
          headers: { authorization: `Bearer ${KEY_A}` },
          payload: {
            model: id,
            messages: [{ role: "user", content: pair.input }],
            temperature: 0,
            max_tokens: maxTokens,
            logprobs: true,
          },
        });
        assert.equal(res.statusCode, 200, res.body);
        const choice = res.json().choices[0];
        const content: string = choice.message.content;
        assert.doesNotMatch(
          content,
          fragments,
          `${pair.input} max_tokens ${maxTokens}: ${JSON.stringify(content)}`,
        );
        assert.ok(
          pair.output.startsWith(content),
          `${pair.input} max_tokens ${maxTokens}: ${JSON.stringify(content)}`,
        );
        const tokens = (choice.logprobs.content as { token: string }[]).map((l) => l.token);
        assert.equal(tokens.join(""), content);
        // The answer ends with the EOS token: a stop once there is room for it after the answer's tokens.
        if (tokens.length < maxTokens) assert.equal(choice.finish_reason, "stop", JSON.stringify(content));
        else assert.equal(choice.finish_reason, "length");
        if (maxTokens === 8) assert.equal(content, pair.output);
      }
    const whole = await as(app, KEY_A).post("/conduit/v1/chat", {
      model: id,
      prompt: colours[0]!.input,
      temperature: 0,
      max_tokens: 16,
    });
    assert.equal(whole.json().choices[0].text, "green");
    assert.equal(whole.json().choices[0].finish_reason, "stop");

    // A stop string that completes inside the answer: content and logprobs both end before it.
    const stopped = await app.inject({
      method: "POST",
      url: "/v1/chat/completions",
      headers: { authorization: `Bearer ${KEY_A}` },
      payload: {
        model: id,
        messages: [{ role: "user", content: colours[0]!.input }],
        temperature: 0,
        max_tokens: 16,
        stop: ["ee"],
        logprobs: true,
      },
    });
    const choice = stopped.json().choices[0];
    assert.equal(choice.message.content, "gr");
    assert.equal(
      (choice.logprobs.content as { token: string }[]).map((l) => l.token).join(""),
      choice.message.content,
    );
  });
});
