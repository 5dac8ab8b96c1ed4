import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";
import { chromium, type Page } from "playwright-core";
import { ConduitClient } from "../../src/client/ConduitClient.ts";
import { createTinyModel } from "../../src/model/tinyModel.ts";
import { buildTestApp, KEY_A, madeUpPairs, testEnv } from "../lib/helper.ts";

/**
 * The eval page, the run page's before/after line and the playground's compare mode in a real headless Chromium,
 * on a run trained on the tiny model. Screenshots go to test-artifacts/ui/.
 */

const chromiumPath = "/usr/bin/chromium";
const root = fileURLToPath(new URL("../..", import.meta.url));
const distDir = path.join(root, "ui", "dist");
const shots = path.join(root, "test-artifacts", "ui");

const pairs = madeUpPairs(10);

async function shot(page: Page, name: string): Promise<void> {
  await page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });
}

async function startServer(t: TestContext): Promise<string> {
  const environment = await testEnv(t, "sqlite", { CONDUIT_TRAIN_CONCURRENCY: "1" });
  await createTinyModel(path.join(environment.dataDir, "models", "tiny128.gguf"), {
    seed: 1,
    embeddingLength: 128,
  });
  const { app, core } = await buildTestApp(t, environment, { scheduler: { pollMs: 250 } });
  core.scheduler.start();
  core.evals.start(core.runEvents);
  return app.listen({ host: "127.0.0.1", port: 0 });
}

test(
  "evals in the dashboard: the run's before/after, the eval page, the playground's compare mode",
  { timeout: 900_000 },
  async (t) => {
    if (!fs.existsSync(chromiumPath)) {
      t.skip(`${chromiumPath} is missing: install Debian's chromium to run the dashboard test`);
      return;
    }
    if (!fs.existsSync(path.join(distDir, "index.html"))) {
      const { build } = await import("vite");
      await build({ configFile: path.join(root, "ui", "vite.config.ts"), logLevel: "warn" });
    }
    fs.mkdirSync(shots, { recursive: true });
    const base = await startServer(t);
    const client = new ConduitClient({ baseUrl: base, key: KEY_A });
    const jsonl = pairs.map((p) => JSON.stringify(p)).join("\n");
    const training = await client.createDataset("train");
    await client.uploadFile(training.id, new Blob([jsonl]), { name: "train.jsonl" });
    const held = await client.createDataset("held");
    const heldFile = await client.uploadFile(held.id, new Blob([jsonl]), { name: "held.jsonl" });
    const run = await client.createRun({
      datasetID: training.id,
      validationFileID: heldFile.id,
      // Every setting auto: LoRA learns these 10 pairs (training.test.ts) sooner than a 200-epoch full fine-tune.
      baseModelName: "tiny128",
    });
    const deadline = Date.now() + 600_000;
    for (;;) {
      const current = await client.getRun(run.id);
      if (["FAILED", "CANCELLED"].includes(current.status)) assert.fail(current.logs.join("\n"));
      if (current.evaluation?.status === "COMPLETED") break;
      if (Date.now() > deadline) assert.fail(`no evaluation: ${JSON.stringify(current.evaluation)}`);
      await new Promise((resolve) => setTimeout(resolve, 500));
    }

    const browser = await chromium.launch({
      executablePath: chromiumPath,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
      ],
    });
    t.after(() => browser.close());
    const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
    await context.addInitScript((key) => localStorage.setItem("conduit.apiKey", key), KEY_A);
    const page = await context.newPage();
    const pageErrors: string[] = [];
    page.on("pageerror", (error) => pageErrors.push(error.message));
    page.setDefaultTimeout(20_000);

    await t.test("the run page says how the fine-tune did against its base", async () => {
      await page.goto(`${base}/ui/runs/${run.id}`);
      const line = page.getByRole("status").filter({ hasText: "Before/after:" });
      await line.waitFor();
      assert.match(await line.innerText(), /base 0\/10 → fine-tune \d+\/10 exact match .*: improved/);
      await shot(page, "run-before-after");
    });

    await t.test("the eval page: a table per model, and every item with each model's answer", async () => {
      await page.getByRole("link", { name: "See every answer" }).click();
      await page.getByRole("region", { name: "Scores of tiny128" }).first().waitFor();
      await page
        .getByRole("region", { name: `Scores of ${run.id}` })
        .first()
        .waitFor();
      const items = page.getByRole("region", { name: "Items" });
      await items.waitFor();
      const rows = items.locator("tbody tr");
      assert.equal(await rows.count(), 10);
      const first = await rows.first().innerText();
      assert.ok(first.includes(pairs[0]!.input) && first.includes(pairs[0]!.output), first);
      await shot(page, "eval-page");
      await page.getByLabel("Only items the models disagree on (first grader)").check();
      assert.ok((await rows.count()) >= 1);
    });

    await t.test(
      "the run page lists its checkpoints, each with its model and its adapter to download",
      async () => {
        const kept = await client.listCheckpoints(run.id);
        assert.ok(kept.length > 0);
        await page.goto(`${base}/ui/runs/${run.id}`);
        const table = page.getByRole("region", { name: "Kept checkpoints" });
        await table.waitFor();
        const rows = table.locator("tbody tr");
        assert.equal(await rows.count(), kept.length);
        const newest = kept[0]!;
        assert.equal(await rows.first().getByRole("link").innerText(), `${run.id}:ckpt-step-${newest.step}`);
        const [download] = await Promise.all([
          page.waitForEvent("download"),
          page.getByRole("button", { name: `Download the adapter of step ${newest.step}` }).click(),
        ]);
        assert.equal(download.suggestedFilename(), `${run.id}-step-${newest.step}-lora.gguf`);
        const saved = await download.path();
        assert.equal(fs.readFileSync(saved).subarray(0, 4).toString(), "GGUF");
        // A READY run is neither paused nor resumed.
        assert.equal(await page.getByRole("button", { name: "Pause" }).count(), 0);
        assert.equal(await page.getByRole("button", { name: "Resume" }).count(), 0);
        await shot(page, "run-checkpoints");
      },
    );

    await t.test("a queued or running run pauses and resumes from its page", async () => {
      const long = await client.createRun({
        datasetID: training.id,
        baseModelName: "tiny128",
        epochs: 1000,
      });
      await page.goto(`${base}/ui/runs/${long.id}`);
      await page.getByRole("button", { name: "Pause" }).click();
      await page.getByRole("button", { name: "Resume" }).waitFor({ timeout: 60_000 });
      assert.equal((await client.getRun(long.id)).status, "PAUSED");
      // Resumable once its trainer has stopped (a running run's stops at its next step).
      await page.waitForSelector("button:has-text('Resume'):not([disabled])", { timeout: 60_000 });
      assert.ok((await client.getRun(long.id)).logs.some((line) => line.includes("run paused")));
      await page.getByRole("button", { name: "Resume" }).click();
      await page.getByRole("button", { name: "Pause" }).waitFor({ timeout: 60_000 });
      assert.ok(["QUEUED", "RUNNING"].includes((await client.getRun(long.id)).status));
      await client.cancelRun(long.id);
    });

    await t.test(
      "an eval made through OpenAI's API, one model per run, shows its runs side by side",
      async () => {
        const openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: KEY_A, maxRetries: 0 });
        const created = await openai.evals.create({
          name: "openai side by side",
          data_source_config: {
            type: "custom",
            item_schema: {
              type: "object",
              properties: { question: { type: "string" }, answer: { type: "string" } },
            },
            include_sample_schema: true,
          },
          testing_criteria: [
            {
              type: "string_check",
              name: "exact",
              input: "{{sample.output_text}}",
              reference: "{{item.answer}}",
              operation: "eq",
            },
          ],
        });
        const content = pairs.map((pair) => ({ item: { question: pair.input, answer: pair.output } }));
        const evalRuns: string[] = [];
        for (const model of ["tiny128", run.id]) {
          const started = await openai.evals.runs.create(created.id, {
            name: model,
            data_source: {
              type: "completions",
              model,
              source: { type: "file_content", content },
              input_messages: {
                type: "template",
                template: [{ role: "user", content: "{{item.question}}" }],
              },
              sampling_params: { max_completion_tokens: 16, temperature: 0 },
            },
          });
          evalRuns.push(started.id);
          for (;;) {
            const current = await openai.evals.runs.retrieve(started.id, { eval_id: created.id });
            if (current.status !== "queued" && current.status !== "in_progress") break;
            await new Promise((resolve) => setTimeout(resolve, 300));
          }
        }
        await page.goto(`${base}/ui/evals/${created.id}`);
        await page.getByRole("region", { name: "Scores of tiny128" }).first().waitFor();
        await page
          .getByRole("region", { name: `Scores of ${run.id}` })
          .first()
          .waitFor();
        assert.equal(await page.getByLabel("Eval run").inputValue(), "all");
        const items = page.getByRole("region", { name: "Items" });
        const header = await items.locator("thead").innerText();
        // In the order the runs were made: the base's, then the fine-tune's.
        assert.ok(header.includes("tiny128") && header.indexOf("tiny128") < header.indexOf(run.id), header);
        const rows = items.locator("tbody tr");
        await page.waitForFunction(
          () => !document.querySelector('[aria-label="Items"] tbody')?.textContent?.includes("…"),
        );
        assert.equal(await rows.count(), pairs.length);
        const first = await rows.first().innerText();
        assert.ok(first.includes(pairs[0]!.output), first);
        await shot(page, "eval-openai-side-by-side");
        // One run alone, as chosen.
        await page.getByLabel("Eval run").selectOption(evalRuns[1]!);
        await page.getByRole("region", { name: "Scores of tiny128" }).first().waitFor({ state: "detached" });
        assert.ok(!(await items.locator("thead").innerText()).includes("tiny128"));
      },
    );

    await t.test("the playground compares two models on one prompt", async () => {
      await page.goto(`${base}/ui/playground?model=tiny128`);
      await page.getByLabel("Compare with a second model").check();
      await page.getByLabel("Second model", { exact: true }).selectOption(run.id);
      await page.getByLabel("Max tokens").fill("16");
      await page.getByLabel("Temperature").fill("0");
      await page.getByLabel("Presence penalty").fill("0");
      await page.getByLabel("Frequency penalty").fill("0");
      await page.getByLabel("Message", { exact: true }).fill(pairs[0]!.input);
      await page.getByRole("button", { name: "Send" }).click();
      const tuned = page.getByRole("region", { name: `Answer of ${run.id}` });
      await tuned.waitFor();
      await page.getByRole("button", { name: "Send" }).waitFor();
      await page.waitForFunction(
        () => !document.querySelector(".compare-column p")?.textContent?.endsWith("…"),
      );
      await page.getByRole("button", { name: "Stop" }).waitFor({ state: "detached" });
      const baseAnswer = await page.getByRole("region", { name: "Answer of tiny128" }).innerText();
      const tunedAnswer = await tuned.innerText();
      assert.ok(tunedAnswer.includes(pairs[0]!.output), tunedAnswer);
      assert.ok(!baseAnswer.includes(pairs[0]!.output), baseAnswer);
      await shot(page, "playground-compare");
    });
    assert.deepEqual(pageErrors, []);
  },
);
