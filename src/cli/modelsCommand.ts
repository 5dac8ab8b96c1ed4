import fs from "node:fs";
import path from "node:path";
import { SingleBar } from "cli-progress";
import type { Command } from "commander";
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

/** Seconds as `45s`, `12m05s`, `3h20m`. */
function duration(seconds: number): string {
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m${String(seconds % 60).padStart(2, "0")}s`;
  return `${Math.floor(seconds / 3600)}h${String(Math.floor((seconds % 3600) / 60)).padStart(2, "0")}m`;
}

export function modelsCommand(program: Command, ctx: CliContext): void {
  const models = program
    .command("models")
    .description("list models (server), download or create models (local CONDUIT_MODELS_DIR)");

  models
    .command("list")
    .description("models the server can serve: the models directory and your READY runs")
    .action(async () => {
      const list = await ctx.client().listModels();
      ctx.print(list, () =>
        console.log(
          table([
            ["ID", "KIND", "BASE", "CONTEXT", "SIZE", "QUANT", "OWNER"],
            ...list.map((m) => [
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
    .command("import-adapter")
    .description(
      "import a LoRA adapter trained elsewhere for a base model: a GGUF adapter file, or a PEFT folder " +
        "(adapter_model.safetensors + adapter_config.json); prints its id, a model name",
    )
    .argument("<path>", "a GGUF LoRA adapter, or a folder holding a PEFT adapter")
    .requiredOption("--base <model>", "the model of the server's models directory the adapter was trained on")
    .option("--name <name>", "a label for listings (default: its id)")
    .action(async (where: string, opts: { base: string; name?: string }) => {
      const stat = fs.statSync(where, { throwIfNoEntry: false });
      if (!stat) throw new CliError(`${where} does not exist`, exitCodes.usage);
      const files = stat.isDirectory()
        ? {
            adapterModel: await fs.openAsBlob(path.join(where, "adapter_model.safetensors")),
            adapterConfig: await fs.openAsBlob(path.join(where, "adapter_config.json")),
          }
        : { file: await fs.openAsBlob(where) };
      const adapter = await ctx.client().importAdapter(opts.base, files, opts.name);
      ctx.print(adapter, () =>
        console.log(
          `${adapter.id} (${adapter.format}, rank ${adapter.rank}, ${adapter.weights} weights of ${adapter.base_model})`,
        ),
      );
    });

  models
    .command("adapters")
    .description("your imported adapters")
    .action(async () => {
      const list = await ctx.client().listAdapters();
      ctx.print(list, () =>
        console.log(
          table([
            ["ID", "NAME", "BASE", "FORMAT", "RANK", "ALPHA", "SIZE", "CREATED"],
            ...list.map((a) => [
              a.id,
              a.name,
              a.base_model,
              a.format,
              String(a.rank),
              String(a.alpha),
              size(a.size_bytes),
              a.created_at,
            ]),
          ]),
        ),
      );
    });

  models
    .command("delete-adapter")
    .description("delete an imported adapter and its file")
    .argument("<adapter-id>")
    .action(async (id: string) => {
      const result = await ctx.client().deleteAdapter(id);
      ctx.print(result, () => console.log(`deleted ${id}`));
    });

  models
    .command("ps")
    .description("models loaded in the server's memory now (base models and your fine-tunes), like ps")
    .action(async () => {
      const list = await ctx.client().listLoadedModels();
      ctx.print(list, () =>
        console.log(
          list.length === 0
            ? "no model is loaded"
            : table([
                ["ID", "KIND", "BASE", "MEMORY", "CONTEXT", "ACTIVE", "QUEUED", "IDLE"],
                ...list.map((m) => [
                  m.id,
                  m.kind,
                  m.base_model ?? "-",
                  size(m.memory_bytes),
                  String(m.context_size),
                  String(m.active_generations),
                  String(m.queued_requests),
                  m.active_generations > 0 ? "busy" : duration(m.idle_seconds),
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
    .option("--id <id>", "model id to save it as (file name without .gguf; default: from the reference)")
    .action(async (ref: string, opts: { id?: string }) => {
      const { ModelRegistry } = await import("../model/ModelRegistry.ts");
      const registry = new ModelRegistry({ modelsDir: ctx.config.modelsDir });
      // On a terminal, a bar from the first byte; elsewhere a line now and then, so a log shows it moving.
      const bar = ctx.json
        ? undefined
        : new SingleBar({
            format: "{bar} {percentage}% {done} of {size}",
            stream: process.stderr,
            noTTYOutput: true,
            notTTYSchedule: 10_000,
          });
      let started = false;
      try {
        const info = await registry.pull(
          ref,
          ({ downloadedBytes, totalBytes }) => {
            if (!bar) return;
            const payload = { done: size(downloadedBytes), size: totalBytes > 0 ? size(totalBytes) : "?" };
            if (!started) bar.start(Math.max(totalBytes, 1), downloadedBytes, payload);
            else bar.update(downloadedBytes, payload);
            started = true;
          },
          { timeoutMs: ctx.config.pullTimeout, ...(opts.id !== undefined ? { id: opts.id } : {}) },
        );
        ctx.print(info, () => console.log(`${info.id} (${info.path})`));
      } finally {
        if (started) bar?.stop();
      }
    });

  models
    .command("create-tiny")
    .description("write a tiny randomly initialised Llama model (for tests, demos and offline installs)")
    .option("--id <id>", "model id (file name without .gguf)", "tiny")
    .option("--seed <n>", "random seed (same seed, same file)", "1")
    .action(async (opts: { id: string; seed: string }) => {
      const { isValidModelId } = await import("../model/ModelRegistry.ts");
      const { createTinyModel } = await import("../model/tinyModel.ts");
      if (!isValidModelId(opts.id)) throw new CliError(`invalid model id "${opts.id}"`, exitCodes.usage);
      const seed = Number(opts.seed);
      if (!Number.isInteger(seed)) throw new CliError("--seed must be an integer", exitCodes.usage);
      const file = path.join(ctx.config.modelsDir, `${opts.id}.gguf`);
      const info = await createTinyModel(file, { seed });
      ctx.print({ id: opts.id, ...info }, () => console.log(opts.id));
    });
}
