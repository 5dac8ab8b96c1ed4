import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { SingleBar, Presets } from "cli-progress";
import type { Command } from "commander";
import { CliError, exitCodes, page, table, type CliContext } from "./context.ts";

/** The size of a local file to upload; a path that is not a readable file is bad input. */
function fileSize(file: string): number {
  let stat: fs.Stats;
  try {
    stat = fs.statSync(file);
    fs.accessSync(file, fs.constants.R_OK);
  } catch (error) {
    const reason =
      (error as NodeJS.ErrnoException).code === "ENOENT" ? "no such file" : (error as Error).message;
    throw new CliError(`cannot read ${file}: ${reason}`, exitCodes.usage);
  }
  if (!stat.isFile()) throw new CliError(`cannot read ${file}: not a file`, exitCodes.usage);
  return stat.size;
}

export function datasetsCommand(program: Command, ctx: CliContext): void {
  const datasets = program
    .command("datasets")
    .description("create, list, rename, delete datasets and upload files");

  datasets
    .command("create")
    .description("create a dataset")
    .argument("<name>")
    .action(async (name: string) => {
      const dataset = await ctx.client().createDataset(name);
      ctx.print(dataset, () => console.log(dataset.id));
    });

  datasets
    .command("list")
    .description("list your datasets, newest first")
    .option("--limit <n>", "how many", "100")
    .option("--offset <n>", "skip this many", "0")
    .action(async (opts: { limit: string; offset: string }) => {
      const list = await ctx.client().listDatasets(page(opts));
      ctx.print(list, () =>
        console.log(
          table([
            ["ID", "NAME", "PAIRS", "STATUS", "CREATED"],
            ...list.map((d) => [d.id, d.name, String(d.ioPairsCount), d.status, d.createdAt]),
          ]),
        ),
      );
    });

  datasets
    .command("show")
    .description("show a dataset and its files")
    .argument("<dataset-id>")
    .action(async (id: string) => {
      const client = ctx.client();
      const dataset = await client.getDataset(id);
      const files = await client.listFiles(id);
      ctx.print({ ...dataset, files }, () => {
        console.log(`${dataset.name} (${dataset.id}): ${dataset.ioPairsCount} pairs, ${dataset.status}`);
        if (files.length > 0)
          console.log(
            table([
              ["FILE", "NAME", "PAIRS", "BYTES"],
              ...files.map((f) => [f.id, f.name, String(f.ioPairsCount), String(f.size)]),
            ]),
          );
      });
    });

  datasets
    .command("rename")
    .description("rename a dataset")
    .argument("<dataset-id>")
    .argument("<name>")
    .action(async (id: string, name: string) => {
      const result = await ctx.client().renameDataset(id, name);
      ctx.print(result, () => console.log(`renamed ${id} to ${name}`));
    });

  datasets
    .command("delete")
    .description("delete a dataset and its files")
    .argument("<dataset-id>")
    .action(async (id: string) => {
      const result = await ctx.client().deleteDataset(id);
      ctx.print(result, () => console.log(`deleted ${id}`));
    });

  datasets
    .command("upload")
    .description(
      "upload a JSONL, JSON or CSV file of IO pairs (validated by the server; errors name the line)",
    )
    .argument("<dataset-id>")
    .argument("<file>")
    .option("--name <name>", "file name to store (default: the file's name)")
    .action(async (id: string, file: string, opts: { name?: string }) => {
      const size = fileSize(file);
      const name = opts.name ?? path.basename(file);
      const bar =
        ctx.json || !process.stderr.isTTY
          ? undefined
          : new SingleBar(
              { format: "upload [{bar}] {percentage}% {value}/{total} bytes", stream: process.stderr },
              Presets.shades_classic,
            );
      bar?.start(size, 0);
      try {
        const body = Readable.toWeb(fs.createReadStream(file)) as ReadableStream<Uint8Array>;
        const uploaded = await ctx
          .client()
          .uploadFile(id, body, { name, size, onProgress: (sent) => bar?.update(sent) });
        bar?.stop();
        ctx.print(uploaded, () =>
          console.log(
            `${uploaded.id}: ${uploaded.ioPairsCount} pairs (${uploaded.format}, ${uploaded.size} bytes)`,
          ),
        );
      } finally {
        bar?.stop();
      }
    });
}
