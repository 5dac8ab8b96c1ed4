/**
 * The mixed-adapter build: node-llama-cpp's own llama.cpp and addon, patched so that each sequence of a context
 * carries its own LoRA adapters (`llama_set_adapters_lora_seq`, bin/patches/), compiled by
 * `npm run setup:adapters` (bin/setup-adapters.sh) into `.cache/llama-mixed-adapters/` beside copies of the
 * prebuilt ggml libraries (the same CPU variants, chosen at load as the prebuilt binaries choose them). With it a
 * decode serves sequences of different adapters at once; without it the engine groups sequences by adapter
 * (SequenceBatcher.ts), so nothing needs compiling for the service to run.
 */
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import type { Llama, LlamaLogLevel } from "node-llama-cpp";
import type { AdapterBatchingSetting } from "../contract/accelerator.ts";
import { nodeLlamaCppVersion } from "../model/nodeLlamaCpp.ts";
export type { AdapterBatchingSetting };

/** What `npm run setup:adapters` writes. */
export const PROJECT_MIXED_ADAPTER_BUILD = fileURLToPath(
  new URL("../../.cache/llama-mixed-adapters/", import.meta.url),
);

/** The setup command, for messages. */
export const ADAPTERS_SETUP_COMMAND = "npm run setup:adapters";

/** How generations of different adapters share a context's decodes, for the start log and `/healthz`. */
export type AdapterBatching =
  { batching: "per-sequence"; build: string } | { batching: "grouped"; reason: string };

/** Whether `llama` was made from a build whose contexts take adapters per sequence. */
export function adapterBatchingOf(llama: Llama): AdapterBatching {
  const bindings = (
    llama as unknown as { _bindings?: { AddonContext?: { prototype?: Record<string, unknown> } } }
  )._bindings;
  return typeof bindings?.AddonContext?.prototype?.setSequenceLoras === "function"
    ? { batching: "per-sequence", build: "the node-llama-cpp instance the engine was given" }
    : {
        batching: "grouped",
        reason: "the engine was given a node-llama-cpp instance of the prebuilt binaries",
      };
}

export type MixedAdapterBuildStatus =
  | { available: true; dir: string; nodeLlamaCpp: string; llamaCpp: string }
  | { available: false; reason: string };

/** What build.json says (written by bin/setup-adapters.sh). */
interface BuildInfo {
  nodeLlamaCpp?: unknown;
  llamaCpp?: unknown;
  addon?: unknown;
}

/**
 * Whether the mixed-adapter build can be used: present in `dir`, complete, and compiled for the installed
 * node-llama-cpp (whose ggml it links). Cheap: a few stats and build.json.
 */
export function mixedAdapterBuildStatus(
  setting: AdapterBatchingSetting,
  dir: string = PROJECT_MIXED_ADAPTER_BUILD,
): MixedAdapterBuildStatus {
  if (setting === "grouped") return { available: false, reason: "CONDUIT_ADAPTER_BATCHING is grouped" };
  let info: BuildInfo;
  try {
    info = JSON.parse(fs.readFileSync(path.join(dir, "build.json"), "utf8")) as BuildInfo;
  } catch {
    return { available: false, reason: `no mixed-adapter build (${ADAPTERS_SETUP_COMMAND} makes one)` };
  }
  const installed = nodeLlamaCppVersion();
  if (typeof info.nodeLlamaCpp !== "string" || info.nodeLlamaCpp !== installed)
    return {
      available: false,
      reason:
        `the mixed-adapter build was compiled for node-llama-cpp ${String(info.nodeLlamaCpp)}, and ` +
        `${installed ?? "none"} is installed: run ${ADAPTERS_SETUP_COMMAND} again`,
    };
  const addon = typeof info.addon === "string" ? info.addon : "";
  if (addon === "" || !fs.existsSync(path.join(dir, addon)))
    return {
      available: false,
      reason: `the mixed-adapter build in ${dir} is incomplete: run ${ADAPTERS_SETUP_COMMAND}`,
    };
  return {
    available: true,
    dir,
    nodeLlamaCpp: installed!,
    llamaCpp: typeof info.llamaCpp === "string" ? info.llamaCpp : "unknown",
  };
}

/** node-llama-cpp's internals this needs (its package exports neither): found beside its entry point. */
interface NodeLlamaCppInternals {
  Llama: {
    _create(options: Record<string, unknown>): Promise<Llama>;
  };
  defaultLlamaVramPadding: unknown;
  defaultLlamaRamPadding: unknown;
}

async function internals(): Promise<NodeLlamaCppInternals> {
  const dist = path.dirname(createRequire(import.meta.url).resolve("node-llama-cpp"));
  const [llamaModule, getLlamaModule] = await Promise.all([
    import(pathToFileURL(path.join(dist, "bindings", "Llama.js")).href) as Promise<{ Llama?: unknown }>,
    import(pathToFileURL(path.join(dist, "bindings", "getLlama.js")).href) as Promise<
      Record<string, unknown>
    >,
  ]);
  const Llama = llamaModule.Llama as NodeLlamaCppInternals["Llama"] | undefined;
  if (typeof Llama?._create !== "function")
    throw new Error("node-llama-cpp's Llama._create is gone: src/engine/mixedAdapterBuild.ts needs updating");
  return {
    Llama,
    defaultLlamaVramPadding: getLlamaModule.defaultLlamaVramPadding,
    defaultLlamaRamPadding: getLlamaModule.defaultLlamaRamPadding,
  };
}

/**
 * A node-llama-cpp instance on the mixed-adapter build in `dir` (CPU only), made as node-llama-cpp makes one
 * for a local build: its addon loaded from `dir`, the ggml backends found there.
 */
export async function loadMixedAdapterLlama(
  dir: string,
  options: {
    logLevel: LlamaLogLevel;
    logger: (level: LlamaLogLevel, message: string) => void;
    maxThreads: number;
  },
): Promise<Llama> {
  const info = JSON.parse(fs.readFileSync(path.join(dir, "build.json"), "utf8")) as BuildInfo;
  const bindingPath = path.join(dir, String(info.addon));
  const bindings = createRequire(import.meta.url)(bindingPath) as { AddonContext?: { prototype?: object } };
  if (
    typeof (bindings.AddonContext?.prototype as Record<string, unknown> | undefined)?.setSequenceLoras !==
    "function"
  )
    throw new Error(`${bindingPath} has no setSequenceLoras: run ${ADAPTERS_SETUP_COMMAND} again`);
  const buildMetadata = JSON.parse(
    fs.readFileSync(path.join(dir, "_nlcBuildMetadata.json"), "utf8"),
  ) as unknown;
  const { Llama, defaultLlamaVramPadding, defaultLlamaRamPadding } = await internals();
  return Llama._create({
    bindings,
    bindingPath,
    buildType: "localBuild",
    buildMetadata,
    logLevel: options.logLevel,
    logger: options.logger,
    maxThreads: options.maxThreads,
    vramPadding: defaultLlamaVramPadding,
    ramPadding: defaultLlamaRamPadding,
    debug: false,
    tempDir: false,
  });
}
