import assert from "node:assert/strict";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { test, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import Fastify from "fastify";
import { chromium, type Browser, type Page } from "playwright-core";
import uiRoutes from "../../src/api/routes/ui.ts";
import { ConduitClient } from "../../src/client/ConduitClient.ts";
import type { ChatRequest } from "../../src/contract/client.ts";
import { buildTestApp, KEY_A, testEnv } from "../lib/helper.ts";

/**
 * The dashboard end to end: a real server on 127.0.0.1, a real headless Chromium, the whole loop
 * (sign in, dataset, upload, run, live chart, READY, chat). Screenshots go to test-artifacts/ui/.
 */

const chromiumPath = "/usr/bin/chromium";
const root = fileURLToPath(new URL("../..", import.meta.url));
const distDir = path.join(root, "ui", "dist");
const shots = path.join(root, "test-artifacts", "ui");

/** Builds the dashboard when this checkout has no build yet (`npm run build:ui` does the same). */
async function ensureBuilt(): Promise<void> {
  if (fs.existsSync(path.join(distDir, "index.html"))) return;
  const { build } = await import("vite");
  await build({ configFile: path.join(root, "ui", "vite.config.ts"), logLevel: "warn" });
}

/** A listening server like `npm start`'s (users alice and bob), with the trainer running. */
async function startServer(t: TestContext): Promise<string> {
  const environment = await testEnv(t, "sqlite", { CONDUIT_TRAIN_CONCURRENCY: "1" });
  const { app, core } = await buildTestApp(t, environment, { scheduler: { pollMs: 250 } });
  core.scheduler.start();
  return app.listen({ host: "127.0.0.1", port: 0 });
}

async function shot(page: Page, name: string): Promise<void> {
  await page.screenshot({ path: path.join(shots, `${name}.png`), fullPage: true });
}

const launchArgs = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

test("/ui routes: SPA fallback, public assets, 404 for missing files, 503 without a build", async (t) => {
  await ensureBuilt();
  const app = Fastify();
  await app.register(uiRoutes, { distDir });
  const missing = Fastify();
  await missing.register(uiRoutes, { distDir: path.join(os.tmpdir(), "conduit-no-such-dist") });
  t.after(() => Promise.all([app.close(), missing.close()]));

  for (const url of [
    "/ui",
    "/ui/",
    "/ui/index.html",
    "/ui/runs/ft_123",
    "/ui/datasets/ds_1",
    "/ui/playground?model=tiny",
  ]) {
    const res = await app.inject({ url });
    assert.equal(res.statusCode, 200, url);
    assert.match(res.headers["content-type"] as string, /text\/html/);
    assert.match(res.body, /<div id="app">/);
    assert.match(res.headers["content-security-policy"] as string, /default-src 'self'/);
  }
  const index = (await app.inject({ url: "/ui/" })).body;
  const asset = index.match(/\/ui\/(assets\/[^"]+\.js)/)?.[1];
  assert.ok(asset, "index.html loads a script from /ui/assets/");
  const script = await app.inject({ url: `/ui/${asset}` });
  assert.equal(script.statusCode, 200);
  assert.match(script.headers["content-type"] as string, /javascript/);
  assert.match(script.headers["cache-control"] as string, /immutable/);
  assert.equal((await app.inject({ url: "/ui/assets/nope.js" })).statusCode, 404);
  const escape = await app.inject({ url: "/ui/assets/..%2f..%2f..%2fpackage.json" });
  assert.ok(
    escape.statusCode >= 400 && !escape.body.includes('"name": "conduit"'),
    "no files outside ui/dist",
  );

  const notBuilt = await missing.inject({ url: "/ui/runs/ft_1" });
  assert.equal(notBuilt.statusCode, 503);
  assert.match(notBuilt.body, /npm run build:ui/);
});

test("dashboard end to end in Chromium", { timeout: 600_000 }, async (t) => {
  if (!fs.existsSync(chromiumPath)) {
    t.skip(`${chromiumPath} is missing: install Debian's chromium to run the dashboard test`);
    return;
  }
  await ensureBuilt();
  fs.mkdirSync(shots, { recursive: true });
  const base = await startServer(t);

  const browser: Browser = await chromium.launch({ executablePath: chromiumPath, args: launchArgs });
  t.after(() => browser.close());
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  // The page may reach this server only: anything else is refused and fails the test.
  const elsewhere: string[] = [];
  await context.route("**/*", (route) => {
    const url = route.request().url();
    if (url.startsWith(`${base}/`) || url.startsWith("data:")) return route.continue();
    elsewhere.push(url);
    return route.abort();
  });
  const page = await context.newPage();
  const pageErrors: string[] = [];
  page.on("pageerror", (error) => pageErrors.push(error.message));
  // Refused API calls (the wrong key, the bad file) log "Failed to load resource"; anything else is a bug.
  page.on("console", (message) => {
    if (message.type() === "error" && !message.text().startsWith("Failed to load resource"))
      pageErrors.push(message.text());
  });
  page.setDefaultTimeout(15_000);

  await t.test("signs in with the keyboard; a wrong key is refused in plain words", async () => {
    await page.goto(`${base}/ui/`);
    await page.getByRole("heading", { name: "Conduit" }).waitFor();
    await shot(page, "signin");
    await page.keyboard.press("Tab");
    assert.equal(await page.evaluate(() => document.activeElement?.id), "api-key");
    await page.keyboard.type("not-a-key-at-all");
    await page.keyboard.press("Enter");
    await page.getByRole("alert").filter({ hasText: "That API key was not accepted." }).waitFor();
    await page.getByLabel("API key", { exact: true }).fill(KEY_A);
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Datasets", level: 1 }).waitFor();
    assert.equal(await page.evaluate(() => localStorage.getItem("conduit.apiKey")), KEY_A);
  });

  await t.test("creates a dataset, refuses a bad file by line, uploads and previews a good one", async () => {
    await page.getByLabel("Dataset name", { exact: true }).fill("greetings");
    await page.getByRole("button", { name: "Create dataset" }).click();
    await page.getByRole("heading", { name: "greetings", level: 1 }).waitFor();
    assert.match(page.url(), /\/ui\/datasets\/ds_/);

    await page.getByLabel("File", { exact: true }).setInputFiles({
      name: "bad.jsonl",
      mimeType: "application/jsonl",
      buffer: Buffer.from('{"input":"a","output":"b"}\n{"input":"a"}\n'),
    });
    await page.getByRole("button", { name: "Upload" }).click();
    const refusal = page.getByRole("alert").filter({ hasText: "The file was not accepted" });
    await refusal.waitFor();
    assert.match(await refusal.innerText(), /line 2/);
    await shot(page, "dataset-invalid-file");

    // A slow link shows the progress bar; the file is then deleted again.
    const cdp = await context.newCDPSession(page);
    await cdp.send("Network.enable");
    await cdp.send("Network.emulateNetworkConditions", {
      offline: false,
      latency: 0,
      downloadThroughput: -1,
      uploadThroughput: 400 * 1024,
    });
    const big = Array.from({ length: 12_000 }, (_, i) =>
      JSON.stringify({ input: `q${i}`, output: `a${i} ${"x".repeat(60)}` }),
    );
    await page.getByLabel("File", { exact: true }).setInputFiles({
      name: "big.jsonl",
      mimeType: "application/jsonl",
      buffer: Buffer.from(`${big.join("\n")}\n`),
    });
    await page.getByRole("button", { name: "Upload" }).click();
    const progress = page.getByRole("progressbar", { name: "Upload progress" });
    await progress.waitFor();
    await page.waitForFunction(() => Number(document.querySelector("progress")?.value) > 0);
    await shot(page, "dataset-upload-progress");
    await page
      .getByRole("status")
      .filter({ hasText: "Uploaded big.jsonl: 12000 IO pairs." })
      .waitFor({ timeout: 60_000 });
    await cdp.send("Network.emulateNetworkConditions", {
      offline: false,
      latency: 0,
      downloadThroughput: -1,
      uploadThroughput: -1,
    });
    page.once("dialog", (dialog) => void dialog.accept());
    await page.getByRole("button", { name: "Delete big.jsonl" }).click();
    await page.getByRole("button", { name: "Delete big.jsonl" }).waitFor({ state: "detached" });

    const pairs = Array.from({ length: 60 }, (_, i) =>
      JSON.stringify({ input: `say hi ${i % 6}`, output: `hello ${i % 6}!` }),
    );
    await page.getByLabel("File", { exact: true }).setInputFiles({
      name: "greetings.jsonl",
      mimeType: "application/jsonl",
      buffer: Buffer.from(`${pairs.join("\n")}\n`),
    });
    await page.getByRole("button", { name: "Upload" }).click();
    await page.getByRole("status").filter({ hasText: "Uploaded greetings.jsonl: 60 IO pairs." }).waitFor();
    await page.getByRole("button", { name: "Preview greetings.jsonl" }).click();
    const preview = page.getByRole("table").filter({ hasText: "say hi 0" });
    await preview.waitFor();
    assert.equal(await preview.locator("tbody tr").count(), 50);
    assert.equal(await preview.locator("tbody tr").first().locator("td").first().innerText(), "1");

    await page.getByLabel("New name", { exact: true }).fill("hellos");
    await page.getByRole("button", { name: "Rename" }).click();
    await page.getByRole("heading", { name: "hellos", level: 1 }).waitFor();
    await shot(page, "dataset");
    await page.getByRole("link", { name: "Datasets" }).first().click();
    await page.getByRole("link", { name: "hellos", exact: true }).waitFor();
    await shot(page, "datasets");
  });

  await t.test("starts a run on tiny from the form, with every field and its default", async () => {
    await page.getByRole("navigation").getByRole("link", { name: "Runs" }).click();
    await page.getByRole("heading", { name: "Start a run" }).waitFor();
    // Epochs, learning rate and rank are chosen by the server unless a number is typed.
    assert.equal(await page.getByLabel("Learning rate", { exact: true }).inputValue(), "auto");
    assert.equal(await page.getByLabel("Epochs", { exact: true }).inputValue(), "auto");
    assert.equal(await page.getByLabel("Complexity", { exact: true }).inputValue(), "1");
    assert.equal(await page.getByLabel("Steps", { exact: true }).inputValue(), "");
    assert.equal(await page.getByLabel("Method", { exact: true }).inputValue(), "lora");
    assert.equal(await page.getByLabel("LoRA rank", { exact: true }).inputValue(), "auto");
    assert.equal(await page.getByLabel("LoRA alpha", { exact: true }).inputValue(), "");
    assert.equal(await page.getByLabel("Train on inputs", { exact: true }).isChecked(), false);
    assert.equal(await page.getByLabel("Early stopping", { exact: true }).inputValue(), "");
    assert.equal(await page.getByLabel("Judge model", { exact: true }).inputValue(), "");
    // The LoRA settings are there for LoRA runs only.
    await page.getByLabel("Method", { exact: true }).selectOption("full");
    assert.equal(await page.getByLabel("LoRA rank", { exact: true }).count(), 0);
    await page.getByLabel("Method", { exact: true }).selectOption("lora");
    await page.getByLabel("LoRA rank", { exact: true }).waitFor();
    for (const label of ["System prompt", "Name", "Tracker project", "Tracker entity"])
      await page.getByLabel(label, { exact: true }).waitFor();
    await page.getByLabel("Dataset", { exact: true }).selectOption({ label: "hellos (60 pairs)" });
    await page.getByLabel("Base model", { exact: true }).selectOption("tiny");
    // Enough steps that the chart is seen growing before the run ends, and that the run learns
    // the shape of the answers ("hello N!").
    await page.getByLabel("Epochs", { exact: true }).fill("40");
    await page.getByLabel("Learning rate", { exact: true }).fill("0.003");
    await page.getByLabel("Name", { exact: true }).fill("hello-run");
    await page.getByLabel("Judge model", { exact: true }).selectOption("tiny");
    await shot(page, "runs");
    // Neither a number nor "auto": the browser asks again before anything is sent.
    await page.getByLabel("LoRA rank", { exact: true }).fill("big");
    await page.getByRole("button", { name: "Start run" }).click();
    assert.equal(
      await page
        .getByLabel("LoRA rank", { exact: true })
        .evaluate((input) => (input as HTMLInputElement).validity.valid),
      false,
    );
    assert.match(page.url(), /\/ui\/runs$/);
    await page.getByLabel("LoRA rank", { exact: true }).fill("auto");
    await page.getByRole("button", { name: "Start run" }).click();
    await page.getByRole("heading", { name: /hello-run/, level: 1 }).waitFor();
    assert.match(page.url(), /\/ui\/runs\/ft_/);
    // How long it takes, from creation: the plan (no run of tiny before it), or the trainer's pace once it steps.
    await page
      .getByText(/^Estimate: .+ \((no earlier run to measure: a prior|at the trainer's pace)/)
      .waitFor();
    // The configuration shows what auto chose for the rank, and that it was auto.
    const config = page.locator("dl.config");
    await config.getByText("autoSettings").waitFor();
    assert.match(await config.innerText(), /autoSettings\s+loraRank/);
    assert.match(await config.innerText(), /loraRank\s+\d+/);
    assert.match(await config.innerText(), /judgeModel\s+tiny/);
  });

  await t.test("training: the chart and log update live and the run becomes READY", async () => {
    // The page never reloads: what changes comes over the events stream.
    const heading = page.getByRole("heading", { level: 1 });
    const summary = page.locator("figure.chart figcaption");
    const seen = new Set<string>();
    const deadline = Date.now() + 240_000;
    while (!(await heading.innerText()).includes("READY")) {
      assert.ok(Date.now() < deadline, "the run became READY within 4 minutes");
      seen.add((await summary.textContent()) ?? "");
      await page.waitForTimeout(100);
    }
    const lossSummaries = [...seen].filter((text) => /Loss over \d+ steps/.test(text));
    assert.ok(lossSummaries.length >= 2, `the chart grew while training: ${[...seen].join(" | ")}`);
    assert.match(
      (await summary.textContent()) ?? "",
      /Loss over \d+ steps\. Train loss [\d.]+ at step \d+\. Eval loss/,
    );
    assert.match(await page.getByLabel("Run log", { exact: true }).innerText(), /READY/);
    await page.getByText(/^Estimate: took \d+(s|m\d\ds) \(estimated (a few seconds|about .+)\)$/).waitFor();
    assert.ok((await page.locator(".chart canvas").count()) > 0);
    // Once READY: the examples it learned worst, each with its loss.
    await page.getByRole("heading", { name: "Worst examples" }).waitFor();
    const worst = page.getByRole("region", { name: "Worst examples" }).locator("tbody tr");
    await worst.first().waitFor();
    assert.ok((await worst.count()) <= 10);
    assert.match(await worst.first().innerText(), /say hi \d+/);
    await shot(page, "run");
  });

  await t.test("playground: chats with the READY run, streaming the answer", async () => {
    await page.getByRole("link", { name: "Chat with this model" }).click();
    await page.getByRole("heading", { name: "Playground" }).waitFor();
    assert.match(await page.getByLabel("Model", { exact: true }).inputValue(), /^ft_/);
    assert.equal(await page.getByLabel("Max tokens", { exact: true }).inputValue(), "256");
    // Greedy, without the Conduit API's repetition penalties: the run answers what it learned.
    await page.getByLabel("Max tokens", { exact: true }).fill("16");
    await page.getByLabel("Temperature", { exact: true }).fill("0");
    await page.getByLabel("Presence penalty", { exact: true }).fill("0");
    await page.getByLabel("Frequency penalty", { exact: true }).fill("0");
    // Every text the answer shows while it streams, in order.
    await page.evaluate(() => {
      const seen: string[] = [];
      Object.assign(window, { answerTexts: seen });
      const transcript = document.querySelector(".transcript") as HTMLElement;
      new MutationObserver(() => {
        const text = document.querySelector(".turn-assistant p")?.textContent;
        if (text !== undefined && text !== null && text !== seen.at(-1)) seen.push(text);
      }).observe(transcript, { subtree: true, childList: true, characterData: true });
    });
    await page.getByLabel("Message", { exact: true }).fill("say hi 1");
    const chat = page.waitForResponse((response) => response.url().endsWith("/conduit/v1/chat"));
    await page.keyboard.press("Enter");
    const response = await chat;
    assert.match(response.headers()["content-type"] ?? "", /text\/event-stream/);
    const request = response.request().postDataJSON() as Record<string, unknown>;
    assert.equal(request.stream, true);
    // "Clear conversation" is enabled again once the answer has finished streaming.
    await page.locator("button:enabled", { hasText: "Clear conversation" }).waitFor({ timeout: 120_000 });
    assert.equal(await page.getByRole("alert").count(), 0, "no error shown");
    const answer = await page.locator(".turn-assistant p").innerText();
    assert.match(answer, /^hello \d!$/, "the run answers in the shape of its data");
    // The same greedy request streams the same chunks, which the page shows joined.
    const deltas: string[] = [];
    const client = new ConduitClient({ baseUrl: base, key: KEY_A });
    for await (const delta of client.chatStream(request as unknown as ChatRequest)) deltas.push(delta);
    assert.ok(deltas.length >= 2, `the answer came in several chunks: ${JSON.stringify(deltas)}`);
    assert.equal(deltas.join(""), answer);
    // The turn showed "…" first, then the answer as it grew.
    const [placeholder, ...shown] = await page.evaluate(
      () => (window as unknown as { answerTexts: string[] }).answerTexts,
    );
    assert.equal(placeholder, "…", "the turn was on screen before the answer arrived");
    assert.equal(shown.at(-1), answer);
    for (const text of shown)
      assert.ok(answer.startsWith(text), `the answer only grew: ${shown.join(" | ")}`);
    await shot(page, "playground");
  });

  await t.test(
    "the runs list refreshes its summaries while a run is live, and stops once none is",
    async () => {
      // Started over the API with enough epochs to stay live for a while; cancelled from here.
      const datasets = (await (
        await fetch(`${base}/conduit/dataset`, { headers: { "x-api-key": KEY_A } })
      ).json()) as { id: string }[];
      const created = await fetch(`${base}/conduit/finetuning`, {
        method: "POST",
        headers: { "x-api-key": KEY_A, "content-type": "application/json" },
        body: JSON.stringify({
          datasetID: datasets[0]?.id,
          baseModelName: "tiny",
          epochs: 1000,
          name: "long-run",
        }),
      });
      assert.equal(created.status, 200);
      const { id } = (await created.json()) as { id: string };
      const runsRequests: string[] = [];
      const isList = (url: string) => new URL(url).pathname === "/conduit/finetuning";
      const record = (request: { url(): string }) => {
        const url = new URL(request.url());
        if (url.pathname.startsWith("/conduit/finetuning")) runsRequests.push(`${url.pathname}${url.search}`);
      };
      page.on("request", record);
      await page.getByRole("navigation").getByRole("link", { name: "Runs" }).click();
      const row = page.getByRole("row").filter({ hasText: "long-run" });
      await row.waitFor();
      // The list is summaries (no logs): while a run is live it is fetched again, one request for every run.
      await page.waitForRequest((r) => isList(r.url()), { timeout: 10_000 });
      const cancelled = await fetch(`${base}/conduit/finetuning/${id}/cancel`, {
        method: "POST",
        headers: { "x-api-key": KEY_A },
      });
      assert.equal(cancelled.status, 200);
      await row.getByText("CANCELLED").waitFor({ timeout: 10_000 });
      const listed = runsRequests.length;
      // Longer than the 3 s refresh: with nothing live, nothing more is fetched.
      await page.waitForTimeout(4_000);
      page.off("request", record);
      assert.equal(runsRequests.length, listed, `no refresh once nothing is live: ${runsRequests.join(" ")}`);
      assert.ok(
        runsRequests.every((url) => isList(`${base}${url}`)),
        `only the list is fetched: ${runsRequests.join(" ")}`,
      );
      const deleted = await fetch(`${base}/conduit/finetuning/${id}`, {
        method: "DELETE",
        headers: { "x-api-key": KEY_A },
      });
      assert.equal(deleted.status, 200);
    },
  );

  await t.test("phone width: pages and their tables fit the screen", async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    /** How far the page, or any table inside its scroll box, is wider than the screen. */
    const overflow = () =>
      page.evaluate(() =>
        Math.max(
          document.documentElement.scrollWidth - window.innerWidth,
          ...[...document.querySelectorAll(".table-scroll")].map((box) => box.scrollWidth - box.clientWidth),
        ),
      );
    for (const [name, url] of [
      ["datasets-phone", "/ui/datasets"],
      ["runs-phone", "/ui/runs"],
      ["playground-phone", "/ui/playground"],
    ] as const) {
      await page.goto(`${base}${url}`);
      await page.locator("main h1").waitFor();
      await page.waitForLoadState("networkidle");
      const over = await overflow();
      assert.ok(over <= 1, `${url} overflows the phone screen by ${over}px`);
      await shot(page, name);
    }
    // The dataset page: its files table and a preview, stacked like the lists.
    await page.goto(`${base}/ui/datasets`);
    await page.getByRole("link", { name: "hellos", exact: true }).click();
    await page.getByRole("button", { name: "Preview greetings.jsonl" }).click();
    await page.getByRole("table").filter({ hasText: "say hi 0" }).waitFor();
    const over = await overflow();
    assert.ok(over <= 1, `the dataset page overflows the phone screen by ${over}px`);
    await shot(page, "dataset-phone");
    const runLink = page.getByRole("link", { name: "hello-run", exact: true });
    await page.goto(`${base}/ui/runs`);
    await runLink.click();
    await page.getByRole("heading", { name: "Loss" }).waitFor();
    await shot(page, "run-phone");
    await page.setViewportSize({ width: 1280, height: 860 });
  });

  await t.test("signs out", async () => {
    await page.getByRole("button", { name: "Sign out" }).click();
    await page.getByLabel("API key", { exact: true }).waitFor();
    assert.equal(await page.evaluate(() => localStorage.getItem("conduit.apiKey")), null);
  });

  assert.deepEqual(elsewhere, [], "the page reached only the Conduit server");
  assert.deepEqual(pageErrors, [], "no script errors or Content-Security-Policy violations on the page");
});
