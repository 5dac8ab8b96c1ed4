import fs from "node:fs";
import path from "node:path";
import type { Command } from "commander";
import { SingleBar } from "cli-progress";
import type { EvalRunWire, EvalSourceWire, GraderSpec } from "../contract/evals.ts";
import { CliError, exitCodes, table, type CliContext } from "./context.ts";

/** `--grader` names: the API's types, and `exact` for `exact_match`. */
const GRADERS: Record<string, GraderSpec> = {
  exact: { type: "exact_match" },
  exact_match: { type: "exact_match" },
  exact_loose: { type: "exact_match", name: "exact_loose", normalize: ["case", "whitespace", "punctuation"] },
  contains: { type: "contains" },
  similarity: { type: "similarity" },
  fuzzy: { type: "similarity", name: "fuzzy", metric: "fuzzy_match" },
};

function graders(list: string): GraderSpec[] {
  return list.split(",").map((name) => {
    const grader = GRADERS[name.trim()];
    if (!grader)
      throw new CliError(`--grader ${name}: one of ${Object.keys(GRADERS).join(", ")}`, exitCodes.usage);
    return grader;
  });
}

/**
 * A local file of pairs or chat examples, uploaded to a dataset of its own (the server reads and checks it, as any
 * upload); else a file id of yours on the server.
 */
async function sourceOf(ctx: CliContext, file: string): Promise<EvalSourceWire> {
  if (!fs.existsSync(file)) {
    if (/^file_/.test(file)) return { type: "file", fileId: file };
    throw new CliError(`--file ${file}: no such file (or a file id of yours, file_…)`, exitCodes.usage);
  }
  const client = ctx.client();
  const name = path.basename(file);
  const dataset = await client.createDataset(`eval ${name}`.slice(0, 256));
  const uploaded = await client.uploadFile(dataset.id, await fs.openAsBlob(file), { name });
  return { type: "file", fileId: uploaded.id };
}

/** One row per model: each grader's passed/total and mean score, tokens and mean latency. */
export function summaryTable(run: EvalRunWire): string {
  const names = run.results[0]?.graders.map((g) => g.name) ?? [];
  const rows = [["model", ...names, "tokens out", "s/answer"]];
  for (const totals of run.results) {
    const n = totals.answered + totals.errored;
    rows.push([
      totals.model,
      ...totals.graders.map((g) =>
        g.type === "similarity" ? g.meanScore.toFixed(3) : `${g.passed}/${n} (${g.meanScore.toFixed(2)})`,
      ),
      String(totals.completionTokens),
      totals.meanLatencySeconds.toFixed(2),
    ]);
  }
  return table(rows);
}

export function evalsCommand(program: Command, ctx: CliContext): void {
  const evals = program
    .command("evals")
    .description("score models on pairs: base and fine-tunes side by side");

  evals
    .command("run")
    .description("score models on every pair of a file, with a progress bar and a summary table")
    .option(
      "-f, --file <file>",
      "a local file of IO pairs or chat examples (JSONL, JSON, CSV), or a file id of yours",
    )
    .option(
      "-r, --run <id>",
      "a READY run of yours: its validation file or held-out pairs (instead of --file)",
    )
    .requiredOption("-m, --models <a,b>", "models: base names, run ids or ft: names")
    .option(
      "-g, --grader <names>",
      `graders, by commas: ${Object.keys(GRADERS).join(", ")}`,
      "exact,similarity",
    )
    .option("--max-tokens <n>", "most tokens of each answer", "128")
    .option("--system-prompt <text>", "system prompt of every question (a fine-tune's own wins for it)")
    .option("--name <name>", "the eval's name")
    .action(
      async (opts: {
        file?: string;
        run?: string;
        models: string;
        grader: string;
        maxTokens: string;
        systemPrompt?: string;
        name?: string;
      }) => {
        if ((opts.file === undefined) === (opts.run === undefined))
          throw new CliError("give one of --file and --run", exitCodes.usage);
        const source: EvalSourceWire = opts.run
          ? { type: "run", runId: opts.run }
          : await sourceOf(ctx, opts.file as string);
        const maxTokens = Number(opts.maxTokens);
        if (!Number.isInteger(maxTokens) || maxTokens < 1)
          throw new CliError(`--max-tokens ${opts.maxTokens}: a positive integer`, exitCodes.usage);
        const client = ctx.client();
        const created = await client.createEval({
          name: opts.name ?? (opts.file ? path.basename(opts.file) : `run ${opts.run}`),
          source,
          graders: graders(opts.grader),
          ...(opts.systemPrompt === undefined ? {} : { systemPrompt: opts.systemPrompt }),
        });
        const models = opts.models
          .split(",")
          .map((m) => m.trim())
          .filter((m) => m !== "");
        let run = await client.createEvalRun(created.id, { models, maxTokens });
        const bar =
          !ctx.json && process.stderr.isTTY === true
            ? new SingleBar({
                format: "{bar} {value}/{total} answers  {model}",
                stream: process.stderr,
                hideCursor: true,
                clearOnComplete: true,
                barsize: 30,
              })
            : undefined;
        bar?.start(run.progress.total, 0, { model: "" });
        let status: string = run.status;
        let lastLine = -1;
        try {
          for await (const event of client.evalRunEvents(created.id, run.id)) {
            if (event.event === "progress") {
              const { completed, total, model } = event.data.progress;
              bar?.update(completed, { model: model ?? "" });
              // Without a terminal: a line per tenth.
              if (!bar && !ctx.json && Math.floor((10 * completed) / total) !== lastLine) {
                lastLine = Math.floor((10 * completed) / total);
                process.stderr.write(`${completed}/${total} answers\n`);
              }
            } else status = event.data.status;
          }
        } finally {
          bar?.stop();
        }
        run = await client.getEvalRun(created.id, run.id);
        ctx.print({ eval: created, run }, () => {
          console.log(
            `eval ${created.id}, run ${run.id}: ${run.status}${run.error ? ` (${run.error})` : ""}`,
          );
          console.log(summaryTable(run));
        });
        if (status !== "COMPLETED")
          throw new CliError(
            `eval run ${run.id} ended ${status}${run.error ? `: ${run.error}` : ""}`,
            exitCodes.failure,
          );
      },
    );

  evals
    .command("list")
    .description("list your evals")
    .action(async () => {
      const list = await ctx.client().listEvals();
      ctx.print(list, () =>
        console.log(
          table([
            ["id", "name", "graders", "created"],
            ...list.map((e) => [e.id, e.name, e.graders.map((g) => String(g.name)).join(","), e.createdAt]),
          ]),
        ),
      );
    });

  evals
    .command("show")
    .description("an eval run's summary table and, with --items, every answer")
    .argument("<eval>", "eval id")
    .argument("[run]", "eval run id (default: the latest)")
    .option("--items", "each item: question, expected, each model's answer and scores")
    .action(async (evalId: string, runId: string | undefined, opts: { items?: boolean }) => {
      const client = ctx.client();
      const run = runId ? await client.getEvalRun(evalId, runId) : (await client.listEvalRuns(evalId))[0];
      if (!run) throw new CliError(`eval ${evalId} has no runs`, exitCodes.notFound);
      const results = opts.items ? await client.evalResults(evalId, run.id, { limit: 10_000 }) : [];
      ctx.print(opts.items ? { run, results } : run, () => {
        console.log(`${run.name}: ${run.status} ${run.progress.completed}/${run.progress.total}`);
        console.log(summaryTable(run));
        for (const result of results)
          console.log(
            `#${result.item} ${result.model}: ${JSON.stringify(result.input)} → ${JSON.stringify(result.answer.trim())} ` +
              `(want ${JSON.stringify(result.expected)}) ${result.scores.map((s) => `${s.name} ${s.score.toFixed(2)}`).join(", ")}`,
          );
      });
    });
}
