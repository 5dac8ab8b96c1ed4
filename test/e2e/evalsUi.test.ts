import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
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
