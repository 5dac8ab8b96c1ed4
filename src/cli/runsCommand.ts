import { ollamaModelfile } from "../model/ollamaModelfile.ts";
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import { pipeline } from "node:stream/promises";
import { MultiBar, SingleBar } from "cli-progress";
import type { Command } from "commander";
import { describeEstimate } from "../contract/estimate.ts";
import type { RunStats } from "../contract/runs.ts";
import type { CreateRunBodyWire, ExamplesQueryWire, RunWire } from "../contract/schemas.ts";
import { CliError, exitCodes, fields, page, table, type CliContext } from "./context.ts";

function number(name: string) {
  return (value: string): number => {
    const n = Number(value);
    if (!Number.isFinite(n)) throw new CliError(`--${name} must be a number`, exitCodes.usage);
    return n;
  };
}

/** A setting that takes a number or `auto` (the server's default for it). */
function numberOrAuto(name: string) {
  const parse = number(name);
  return (value: string): number | "auto" => {
    if (value === "auto") return "auto";
    try {
      return parse(value);
    } catch {
      throw new CliError(`--${name} must be a number or auto`, exitCodes.usage);
    }
  };
}

/** One line of at most `width` characters: line breaks shown as `⏎`, the rest cut with `…`. */
function cell(text: string, width: number): string {
  const line = text.replace(/\r?\n/g, "⏎");
  return line.length > width ? `${line.slice(0, width - 1)}…` : line;
}

function formatSeconds(seconds: unknown): string {
  if (typeof seconds !== "number" || !Number.isFinite(seconds)) return "-";
  const s = Math.round(seconds);
  return s >= 60 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s` : `${s}s`;
}

/** Streams a READY run's artifact to `file` (through `<file>.part`, so a failed download leaves nothing). */
async function download(
  ctx: CliContext,
  id: string,
  output: string | undefined,
  format: "adapter" | "merged" = "adapter",
  dir = ".",
) {
  const artifact = await ctx.client().downloadArtifact(id, undefined, format);
  const file = output ?? path.join(dir, artifact.fileName ?? `${id}.gguf`);
  const total = artifact.sizeBytes ?? 0;
  const mb = (n: number) => Math.round(n / 1024 / 1024);
  const bar =
    ctx.json || total === 0
      ? undefined
      : new SingleBar({ format: "{bar} {percentage}% {value}/{total} MB", stream: process.stderr });
  bar?.start(mb(total), 0);
  const part = `${file}.part`;
  let received = 0;
  try {
    await pipeline(
      artifact.body as unknown as AsyncIterable<Uint8Array>,
      async function* (source: AsyncIterable<Uint8Array>) {
        for await (const chunk of source) {
          received += chunk.length;
          bar?.update(mb(received));
          yield chunk;
        }
      },
      fs.createWriteStream(part),
    );
    if (total > 0 && received !== total)
      throw new CliError(`the download of ${id} ended after ${received} of ${total} bytes`);
    await fsp.rename(part, file);
  } catch (error) {
    await fsp.rm(part, { force: true });
    throw error;
  } finally {
    bar?.stop();
  }
  return { id, path: path.resolve(file), sizeBytes: received };
}

/**
 * `runs download --ollama`: a folder holding the run's GGUF (its adapter, or with `--merged` the merged model) and
 * a Modelfile naming it, with the chat template the run was trained with in Ollama's form. Without `--merged`
 * `FROM` names the base's GGUF beside it (`./<base>.gguf`), which the server does not serve: `needs` says to copy it.
 */
async function ollamaFolder(ctx: CliContext, id: string, dir: string, format: "adapter" | "merged") {
  const model = await ctx.client().getModel(id);
  await fsp.mkdir(dir, { recursive: true });
  const gguf = await download(ctx, id, undefined, format, dir);
  const name = path.basename(gguf.path);
  const base = model.base_model;
  const adapter = format === "adapter" && name.endsWith("-lora.gguf");
  const from = adapter && base !== null ? `./${base}.gguf` : `./${name}`;
  const modelfile = ollamaModelfile({
    from,
    adapter: adapter ? `./${name}` : undefined,
    chatTemplate: model.chat_template,
    comments: [
      `Run ${id}${base !== null ? `, fine-tuned from ${base}` : ""}: ollama create <name> -f Modelfile`,
      ...(adapter
        ? [`FROM: the base model's GGUF, ${base}.gguf from the server's models directory, beside this file`]
        : []),
    ],
  });
  await fsp.writeFile(path.join(dir, "Modelfile"), modelfile);
  return {
    id,
    path: path.resolve(dir),
    files: [name, "Modelfile"],
    needs: adapter ? `copy the base model ${base}.gguf into ${path.resolve(dir)} before ollama create` : null,
  };
}

/**
 * The time a run still needs at its step rate: measured between the `stats` events this watch saw (so it
 * follows the pace now), else the run's own steps per elapsed second (a run replayed, or the first event).
 */
export class EtaEstimate {
  private first: { step: number; at: number } | undefined;

  /** Seconds left after `stats` arrived at `now` (ms), or `undefined` when no rate is known yet. */
  update(stats: Pick<RunStats, "step" | "totalSteps" | "elapsedSeconds">, now: number): number | undefined {
    const { step, totalSteps, elapsedSeconds } = stats;
    if (typeof step !== "number" || typeof totalSteps !== "number") return undefined;
    const left = Math.max(0, totalSteps - step);
    if (this.first === undefined || step < this.first.step) this.first = { step, at: now };
    const seen = step - this.first.step;
    if (seen > 0 && now > this.first.at) return (left * (now - this.first.at)) / 1000 / seen;
    if (step > 0 && typeof elapsedSeconds === "number" && elapsedSeconds > 0)
      return (left * elapsedSeconds) / step;
    return undefined;
  }
}

/** `estimate: about 3 min (measured on 2 earlier runs)`, or nothing for a run without one. */
function estimateLine(run: Pick<RunWire, "estimate">): string | undefined {
  return run.estimate ? `estimate: ${describeEstimate(run.estimate)}` : undefined;
}

/**
 * Follows a run's event stream; resolves with its final status. Its estimate first, then log and status lines
 * go to `out` (and how long it took, once READY); on a terminal a progress bar (step, epoch, loss, tokens/s,
 * ETA) stays below them on stderr. `run` is the run as just read, if the caller has it.
 */
async function watch(
  ctx: CliContext,
  id: string,
  out: NodeJS.WriteStream = process.stdout,
  run?: RunWire,
): Promise<string> {
  const bars =
    !ctx.json && process.stderr.isTTY === true
      ? new MultiBar({
          format:
            "step {value}/{total} [{bar}] epoch {epoch} loss {loss} eval {evalLoss} {tps} tok/s ETA {timeLeft}",
          stream: process.stderr,
          hideCursor: true,
          clearOnComplete: true,
          barsize: 24,
        })
      : undefined;
  let bar: ReturnType<MultiBar["create"]> | undefined;
  const eta = new EtaEstimate();
  const say = (line: string) => {
    // With the bar on the same terminal, a line goes above it; elsewhere (a file, a pipe) it goes straight out.
    if (bars && bar && out.isTTY === true) bars.log(`${line}\n`);
    else out.write(`${line}\n`);
  };
  let status = "UNKNOWN";
  /** Whether the run had ended READY before the watch began: its estimate, printed first, says how long it took. */
  let readyBefore = false;
  try {
    if (!ctx.json) {
      const first = run ?? (await ctx.client().getRun(id));
      readyBefore = first.status === "READY";
      const line = estimateLine(first);
      if (line) say(line);
    }
    const events = ctx.client().runEvents(id, {
      onRetry: (error) => {
        if (!ctx.json) say(`(${error.message} Reconnecting…)`);
      },
    });
    for await (const { event, data } of events) {
      if (ctx.json) console.log(JSON.stringify({ event, data }));
      if (event === "log") {
        if (!ctx.json) say(data.line);
      } else if (event === "stats" && bars && typeof data.totalSteps === "number") {
        const payload = {
          epoch: `${String(data.epoch ?? "-")}/${String(data.epochs ?? "-")}`,
          loss: typeof data.trainLoss === "number" ? data.trainLoss.toFixed(4) : "-",
          evalLoss: typeof data.evalLoss === "number" ? data.evalLoss.toFixed(4) : "-",
          tps: typeof data.tokensPerSecond === "number" ? data.tokensPerSecond.toFixed(0) : "-",
          timeLeft: formatSeconds(eta.update(data, Date.now())),
        };
        const step = Number(data.step ?? 0);
        if (!bar) bar = bars.create(data.totalSteps, step, payload);
        else {
          bar.setTotal(data.totalSteps);
          bar.update(step, payload);
        }
      } else if (event === "status") {
        status = data.status;
        if (!ctx.json) say(`status: ${status}${data.error ? ` (${data.error})` : ""}`);
      }
    }
    if (status === "READY" && !readyBefore && !ctx.json) {
      const line = estimateLine(await ctx.client().getRun(id));
      if (line) say(line);
    }
  } finally {
    if (bars?.isActive) {
      bars.update(); // writes the lines still waiting above the bar
      bars.stop();
    }
  }
  return status;
}

export function runsCommand(program: Command, ctx: CliContext): void {
  const runs = program
    .command("runs")
    .description("start, follow, pause, resume, cancel and delete fine-tuning runs");

  createCommand(runs, ctx);
  readCommands(runs, ctx);
  controlCommands(runs, ctx);
}

/** `runs create`: every setting of a run as an option, and `--watch`. */
function createCommand(runs: Command, ctx: CliContext): void {
  runs
    .command("create")
    .description("start a fine-tuning run (defaults as documented in docs/fine-tuning.md)")
    .option("-d, --dataset <id>", "dataset id")
    .option("--dataset-name <name>", "dataset name (instead of --dataset)")
    .option("-m, --model <id>", "base model id (default: the server's CONDUIT_DEFAULT_MODEL)")
    .option(
      "--lr <rate>",
      "learning rate, or auto: chosen from the model's width and the method (default auto)",
      numberOrAuto("lr"),
    )
    .option(
      "--epochs <n>",
      "passes over the data, or auto: chosen from the number of pairs (default auto)",
      numberOrAuto("epochs"),
    )
    .option("--steps <n>", "cap on optimizer steps", number("steps"))
    .option(
      "--method <method>",
      'how to fine-tune: "lora" (an adapter, the default), "full" (every weight) or "dpo" (an adapter, by ' +
        "preference tuning on preference examples; the torch trainer)",
    )
    .option("--beta <beta>", "DPO's beta, in (0, 100] (dpo only; default 0.1)", number("beta"))
    .option(
      "--from-run <id>",
      "a READY supervised LoRA run whose adapter a dpo run continues (its model is the reference)",
    )
    .option(
      "--trainer <name>",
      'the trainer: "torch" or "llama.cpp" (default: the server\'s CONDUIT_TRAINER)',
    )
    .option(
      "--lora-rank <n>",
      "LoRA rank, 1 to 256, or auto: chosen from the dataset's size and the model's width (default auto)",
      numberOrAuto("lora-rank"),
    )
    .option("--lora-alpha <n>", "LoRA alpha, in (0, 4096] (default 2 × rank)", number("lora-alpha"))
    .option(
      "--lora-targets <list>",
      "comma-separated weights that get adapters (default all: attn_q,attn_output,ffn_gate,ffn_up,ffn_down)",
      (value: string) => value.split(",").map((t) => t.trim()),
    )
    .option(
      "--complexity <fraction>",
      "fraction of the top blocks that get adapters (lora) or train (full), in (0, 1]",
      number("complexity"),
    )
    .option(
      "--train-on-inputs",
      "train on the whole conversation, prompts included (default: the loss counts the answers only)",
    )
    .option(
      "--validation-file <fileId>",
      "a file (of this or another of your datasets) whose pairs are the eval set; one of this dataset is left out of training",
    )
    .option(
      "--early-stopping <patience>",
      "stop after this many evaluations in a row without a new best eval loss, 1 to 100 (default: never)",
      number("early-stopping"),
    )
    .option("--system-prompt <text>", "system prompt to train and serve with")
    .option(
      "--judge-model <model>",
      "a model that also grades the run's automatic before/after, scoring each answer from 0 to 1 (default: none)",
    )
    .option("--name <name>", "run name")
    .option("--tracker-project <name>", "experiment tracker project")
    .option("--tracker-entity <name>", "experiment tracker entity")
    .option("-w, --watch", "follow the run until it ends")
    .action(async (opts: Record<string, string | string[] | number | boolean | undefined>) => {
      if (!opts.dataset && !opts.datasetName)
        throw new CliError("pass --dataset <id> or --dataset-name <name>", exitCodes.usage);
      const body = Object.fromEntries(
        Object.entries({
          datasetID: opts.dataset,
          datasetName: opts.datasetName,
          baseModelName: opts.model,
          lr: opts.lr,
          epochs: opts.epochs,
          steps: opts.steps,
          method: opts.method,
          beta: opts.beta,
          fromRunID: opts.fromRun,
          trainer: opts.trainer,
          loraRank: opts.loraRank,
          loraAlpha: opts.loraAlpha,
          loraTargets: opts.loraTargets,
          complexity: opts.complexity,
          trainOnInputs: opts.trainOnInputs,
          validationFileID: opts.validationFile,
          earlyStoppingPatience: opts.earlyStopping,
          systemPrompt: opts.systemPrompt,
          judgeModel: opts.judgeModel,
          name: opts.name,
          trackerProject: opts.trackerProject,
          trackerEntity: opts.trackerEntity,
        }).filter(([, v]) => v !== undefined),
      );
      const run = await ctx.client().createRun(body as CreateRunBodyWire);
      // The id alone, so that `R=$(conduit runs create …)` works, even with --watch (it follows on stderr).
      ctx.print(run, () => console.log(run.id));
      if (opts.watch) {
        const status = await watch(ctx, run.id, process.stderr, run);
        if (status !== "READY") process.exitCode = exitCodes.failure;
      } else if (!ctx.json) {
        const line = estimateLine(run);
        if (line) console.error(line);
      }
    });
}

/** `runs list`, `runs show` and `runs examples`: reading runs. */
function readCommands(runs: Command, ctx: CliContext): void {
  runs
    .command("list")
    .description("list your runs, newest first")
    .option("--limit <n>", "how many", "100")
    .option("--offset <n>", "skip this many", "0")
    .action(async (opts: { limit: string; offset: string }) => {
      const list = await ctx.client().listRuns(page(opts));
      ctx.print(list, () =>
        console.log(
          table([
            ["ID", "NAME", "STATUS", "MODEL", "DATASET", "CREATED"],
            ...list.map((r) => [
              r.id,
              r.name,
              r.status,
              String(r.config.baseModelName ?? ""),
              r.datasetName,
              r.createdAt,
            ]),
          ]),
        ),
      );
    });

  runs
    .command("show")
    .description("show a run: status, estimate, before/after evaluation, config, stats and log")
    .argument("<run-id>")
    .action(async (id: string) => {
      const run = await ctx.client().getRun(id);
      ctx.print(run, () => {
        console.log(`${run.name} (${run.id}): ${run.status}${run.error ? ` — ${run.error}` : ""}`);
        console.log(
          `dataset ${run.datasetName} (${run.datasetId}), ${run.ioPairsCount} pairs; ${run.trackerURL}`,
        );
        const estimate = estimateLine(run);
        if (estimate) console.log(estimate);
        // The automatic before/after, worded as the run's log line says it.
        if (run.evaluation) console.log(`evaluation: ${run.evaluation.summary}`);
        console.log(["config:", ...fields(run.config, "  ")].join("\n"));
        const { lossSeries: _l, evalLossSeries: _e, ...stats } = run.stats;
        if (Object.keys(stats).length > 0) console.log(["stats:", ...fields(stats, "  ")].join("\n"));
        for (const line of run.logs) console.log(line);
      });
    });

  runs
    .command("examples")
    .description("a READY run's training and validation examples with their loss, the worst learned first")
    .argument("<run-id>")
    .option("--sort <order>", "loss (worst first) or index (upload order)", "loss")
    .option("--split <split>", "train or validation (default: both)")
    .option("--limit <n>", "how many", "20")
    .option("--offset <n>", "skip this many", "0")
    .action(async (id: string, opts: { sort: string; split?: string; limit: string; offset: string }) => {
      // The server checks the words: a wrong --sort or --split is its 400, naming the field.
      const { items, total } = await ctx.client().listExamples(id, {
        sort: opts.sort as ExamplesQueryWire["sort"],
        ...(opts.split ? { split: opts.split as ExamplesQueryWire["split"] } : {}),
        ...page(opts),
      });
      ctx.print(items, () => {
        console.log(
          table([
            ["LOSS", "SPLIT", "INDEX", "INPUT", "OUTPUT"],
            ...items.map((e) => [
              e.loss === null ? "-" : e.loss.toFixed(4),
              e.split,
              String(e.index),
              cell(e.input, 40),
              cell(e.output, 40),
            ]),
          ]),
        );
        const first = Number(opts.offset) + 1;
        if (total !== undefined)
          console.log(
            items.length === 0
              ? `no examples here (${total} in all)`
              : `examples ${first}–${first + items.length - 1} of ${total}`,
          );
      });
    });
}

/** `runs watch`, `download`, `cancel`, `pause`, `resume`, `checkpoints` and `delete`: following and acting on a run. */
function controlCommands(runs: Command, ctx: CliContext): void {
  runs
    .command("watch")
    .description("follow a run live with a progress bar until it ends (exit 0 when READY)")
    .argument("<run-id>")
    .action(async (id: string) => {
      const status = await watch(ctx, id);
      if (status !== "READY") process.exitCode = exitCodes.failure;
    });

  runs
    .command("download")
    .description("download a READY run's result: its LoRA adapter, or the model of a full run")
    .argument("<run-id>")
    .option(
      "-o, --output <path>",
      "file to write (default: <run id>-lora.gguf, <run id>-merged.gguf or <run id>.gguf, here); with --ollama, the folder (default: <run id>-ollama)",
    )
    .option("--merged", "a LoRA run's adapter merged into its base: one GGUF that needs no adapter")
    .option(
      "--ollama",
      "a folder for `ollama create`: the GGUF and a Modelfile (FROM, ADAPTER, TEMPLATE, stop)",
    )
    .action(async (id: string, opts: { output?: string; merged?: boolean; ollama?: boolean }) => {
      const format = opts.merged ? "merged" : "adapter";
      if (!opts.ollama) {
        const result = await download(ctx, id, opts.output, format);
        ctx.print(result, () => console.log(`${result.path} (${result.sizeBytes} bytes)`));
        return;
      }
      const result = await ollamaFolder(ctx, id, opts.output ?? `${id}-ollama`, format);
      ctx.print(result, () =>
        console.log(`${result.path}: ${result.files.join(", ")}${result.needs ? `\n${result.needs}` : ""}`),
      );
    });

  runs
    .command("cancel")
    .description("cancel a queued or running run")
    .argument("<run-id>")
    .action(async (id: string) => {
      const result = await ctx.client().cancelRun(id);
      ctx.print(result, () => console.log(`cancelled ${id}`));
    });

  runs
    .command("pause")
    .description(
      "pause a queued or running run: its trainer stops, its checkpoint is kept (resume goes on from it)",
    )
    .argument("<run-id>")
    .action(async (id: string) => {
      const run = await ctx.client().pauseRun(id);
      ctx.print(run, () => console.log(`${id}: ${run.status}`));
    });

  runs
    .command("resume")
    .description("resume a paused run from its checkpoint")
    .argument("<run-id>")
    .action(async (id: string) => {
      const run = await ctx.client().resumeRun(id);
      ctx.print(run, () => console.log(`${id}: ${run.status}`));
    });

  runs
    .command("checkpoints")
    .description("list a READY run's kept checkpoints, newest first, with the model name that serves each")
    .argument("<run-id>")
    .action(async (id: string) => {
      const list = await ctx.client().listCheckpoints(id);
      ctx.print(list, () =>
        console.log(
          table([
            ["STEP", "EPOCH", "TRAIN LOSS", "EVAL LOSS", "MODEL"],
            ...list.map((c) => [
              String(c.step),
              String(c.epoch),
              c.trainLoss.toFixed(4),
              c.evalLoss === null ? "-" : c.evalLoss.toFixed(4),
              c.model,
            ]),
          ]),
        ),
      );
    });

  runs
    .command("delete")
    .description("delete a run and its model (a live run is cancelled first)")
    .argument("<run-id>")
    .action(async (id: string) => {
      const result = await ctx.client().deleteRun(id);
      ctx.print(result, () => console.log(`deleted ${id}`));
    });
}
