import path from "node:path";
import { SingleBar } from "cli-progress";
import type { Command } from "commander";
import { isValidModelId, ModelRegistry } from "../model/ModelRegistry.ts";
import { createTinyModel } from "../model/tinyModel.ts";
import type { ServableModel } from "../inference/InferenceService.ts";
import { CliError, exitCodes, table, type CliContext } from "./context.ts";

/** Bytes in the largest unit that keeps a number of at least 1: `685 KiB`, `1.3 GiB`. */
function size(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${unit === 0 || value >= 10 ? Math.round(value) : value.toFixed(1)} ${units[unit]}`;
}

export function modelsCommand(program: Command, ctx: CliContext): void {
  const models = program
    .command("models")
    .description("list models (server), download or create models (local CONDUIT_MODELS_DIR)");

  models
    .command("list")
    .description("models the server can serve: the models directory and your READY runs")
    .action(async () => {
      const list = await ctx.client().request<{ data: ServableModel[] }>("GET", "/conduit/v1/models");
      ctx.print(list.data, () =>
        console.log(
          table([
            ["ID", "KIND", "BASE", "CONTEXT", "SIZE", "QUANT", "OWNER"],
            ...list.data.map((m) => [
              m.id,
              m.kind,
              m.base_model ?? "-",
              m.context_length === null ? "-" : String(m.context_length),
              m.size_bytes === null ? "-" : size(m.size_bytes),
              m.quantization ?? "-",
              m.owned_by,
            ]),
          ]),
        ),
      );
    });

  models
    .command("pull")
    .description(
      "download a model into the models directory (hf:user/repo:quant, hf:user/repo/file.gguf or https://…)",
    )
    .argument("<ref>")
    .action(async (ref: string) => {
      const registry = new ModelRegistry({ modelsDir: ctx.config.modelsDir });
      const bar = ctx.json
        ? undefined
        : new SingleBar({ format: "{bar} {percentage}% {value}/{total} MB", stream: process.stderr });
      let started = false;
      const info = await registry.pull(ref, ({ downloadedBytes, totalBytes }) => {
        if (!bar || totalBytes === 0) return;
        const mb = (n: number) => Math.round(n / 1024 / 1024);
        if (!started) bar.start(mb(totalBytes), 0);
        started = true;
        bar.update(mb(downloadedBytes));
      });
      bar?.stop();
      ctx.print(info, () => console.log(`${info.id} (${info.path})`));
    });

  models
    .command("create-tiny")
    .description("write a tiny randomly initialised Llama model (for tests, demos and offline installs)")
    .option("--id <id>", "model id (file name without .gguf)", "tiny")
    .option("--seed <n>", "random seed (same seed, same file)", "1")
    .action(async (opts: { id: string; seed: string }) => {
      if (!isValidModelId(opts.id)) throw new CliError(`invalid model id "${opts.id}"`, exitCodes.usage);
      const seed = Number(opts.seed);
      if (!Number.isInteger(seed)) throw new CliError("--seed must be an integer", exitCodes.usage);
      const file = path.join(ctx.config.modelsDir, `${opts.id}.gguf`);
      const info = await createTinyModel(file, { seed });
      ctx.print({ id: opts.id, ...info }, () => console.log(`${opts.id} (${file})`));
    });
}
