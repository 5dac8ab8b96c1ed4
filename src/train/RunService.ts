import fs from "node:fs";
import fsp from "node:fs/promises";
import readline from "node:readline";
import os from "node:os";
import type { DatasetService } from "../datasets/DatasetService.ts";
import type { BlobStore } from "../store/BlobStore.ts";
import type { ModelRef } from "../model/types.ts";
import { ConduitError } from "../errors.ts";
import { mergeLora, MergeUnsupportedError } from "../model/gguf/mergeLora.ts";
import { ggmlQuants } from "./libllama/ggmlQuants.ts";
import { newId } from "../store/ids.ts";
import type { DatasetFile, Page } from "../domain/datasets.ts";
import type { RunRepository } from "../store/RunRepository.ts";
import { keptCheckpointPath, methodOf, type Run } from "../domain/runs.ts";
import { runIdOfModelName } from "../domain/modelNames.ts";
import { FollowCursor, type RunFollowEvent } from "./FollowCursor.ts";
import { RunFeed } from "./RunFeed.ts";
import {
  chooseAutoSettings,
  readModelArchitecture,
  readModelShape,
  type ModelShape,
} from "./autoSettings.ts";
import { activeStatuses, type LoraTarget, type RunCheckpoint, type TrainMethod } from "../contract/runs.ts";
import { isPreference, type IoPair } from "../datasets/ioPairs.ts";
import {
  adapterOutputType,
  AUTO_SETTINGS,
  runDefaults,
  trainerOf,
  type AdapterTypeSetting,
  type AutoSetting,
  type RunConfig,
  type TrainerName,
  type TrainerSetting,
  type TrainMethodConfig,
  type TrainObjective,
} from "../domain/runs.ts";
import {
  totalMemory,
  type TrainerBackend,
  type TrainerHost,
  type TrainerStatus,
} from "./core/TrainerBackend.ts";
import { chooseTrainer, type TrainerChoice } from "./trainerChoice.ts";
import { trainers } from "./trainers.ts";
import { DEFAULT_MIN_PAIRS_FOR_EVAL, planSettingsOf, prepareSamples } from "./prepareSamples.ts";
import { cpuShare, planRun, readModelCost } from "./runEstimate.ts";
import { planTrainingData } from "./core/planTrainingData.ts";
import type { RunPlan } from "../contract/estimate.ts";
import type { RunEventBus } from "./runEvents.ts";
import type { CreateRun, ExamplesQuery, RunExample } from "./commands.ts";

/** Finds base models by id (the engine's model registry). */
export interface ModelCatalog {
  resolve(id: string): ModelRef | undefined;
}

/** The method's settings as asked for: a LoRA rank may still be `"auto"` and the alpha left to follow it. */
type MethodRequest =
  | {
      method: "lora";
      loraRank: number | "auto";
      loraAlpha: number | undefined;
      /** Undefined: the trainer's defaults. */
      loraTargets: LoraTarget[] | undefined;
    }
  | { method: "full"; loraRank: null; loraAlpha: null; loraTargets: null };

/**
 * The method and its settings, with defaults filled in; LoRA settings with method `full` are a 400. The targets'
 * shape (known names, at least one, none twice) is the request schema's to check.
 */
function methodRequest(command: CreateRun, from: Run | undefined): MethodRequest {
  const asked = command.method ?? runDefaults.method;
  if (from !== undefined) {
    // The adapter it starts from has its shape: the same base, rank, alpha, targets and blocks.
    for (const field of ["loraRank", "loraAlpha", "loraTargets", "complexity"] as const)
      if (command[field] !== undefined)
        throw new ConduitError(
          "invalid_request",
          `"${field}" is taken from the run the adapter starts from ("fromRunID": ${from.id}); leave it out`,
          { param: field },
        );
    const config = from.config as Extract<RunConfig, { method: "lora" }>;
    return {
      method: "lora",
      loraRank: config.loraRank,
      loraAlpha: config.loraAlpha,
      loraTargets: [...config.loraTargets],
    };
  }
  // A `dpo` run trains a LoRA adapter; what differs is its loss (`dpoRequest`).
  const method = asked === "dpo" ? "lora" : asked;
  if (method === "full") {
    for (const field of ["loraRank", "loraAlpha", "loraTargets"] as const)
      if (command[field] !== undefined)
        throw new ConduitError(
          "invalid_request",
          `"${field}" is a LoRA setting; leave it out with "method": "full" (or use "method": "lora")`,
          { param: field },
        );
    return { method, loraRank: null, loraAlpha: null, loraTargets: null };
  }
  return {
    method,
    loraRank: command.loraRank ?? "auto",
    loraAlpha: command.loraAlpha,
    loraTargets: command.loraTargets === undefined ? undefined : [...command.loraTargets],
  };
}

/**
 * A `dpo` run's β and the run it starts from (unchecked); `undefined` for any other method, which may not give
 * them (a 400 naming the field).
 */
function dpoRequest(command: CreateRun): { beta: number; fromRunID: string | undefined } | undefined {
  if (command.method === "dpo")
    return { beta: command.beta ?? runDefaults.beta, fromRunID: command.fromRunID };
  for (const field of ["beta", "fromRunID"] as const)
    if (command[field] !== undefined)
      throw new ConduitError(
        "invalid_request",
        `"${field}" is a preference-tuning setting; it needs "method": "dpo"`,
        { param: field },
      );
  return undefined;
}

/**
 * The stored method settings once the rank and the trainer are known; the alpha follows the rank unless
 * given, the targets default to all the trainer can train.
 */
function methodConfig(
  request: MethodRequest,
  autoRank: () => number,
  trainer: TrainerBackend,
): TrainMethodConfig {
  if (request.method === "full") return request;
  const loraRank = request.loraRank === "auto" ? autoRank() : request.loraRank;
  return {
    ...request,
    loraRank,
    loraAlpha: request.loraAlpha ?? runDefaults.loraAlphaPerRank * loraRank,
    loraTargets: request.loraTargets ?? [...trainer.loraTargets],
  };
}

/** The order examples are listed in: worst loss first (none last), or training then validation by index. */
function compareExamples(sort: ExamplesQuery["sort"]) {
  const byIndex = (a: RunExample, b: RunExample) =>
    (a.split === b.split ? 0 : a.split === "train" ? -1 : 1) || a.index - b.index;
  if (sort === "index") return byIndex;
  return (a: RunExample, b: RunExample) =>
    (a.loss === null ? (b.loss === null ? 0 : 1) : b.loss === null ? -1 : b.loss - a.loss) || byIndex(a, b);
}

/** A page of a READY run's examples, and how many there are in all (of the asked split). */
export interface ExamplesPage {
  examples: RunExample[];
  total: number;
}

/** A READY run's downloadable file: the adapter of a LoRA run, the model of a full run. */
export interface RunArtifact {
  path: string;
  /** `<run id>-lora.gguf` or `<run id>.gguf`. */
  fileName: string;
  sizeBytes: number;
}

/** What a run trains on, as its creation sees it (the files' sizes, nothing read). */
interface TrainingSet {
  /** The dataset's pairs, less the validation file's when it is one of the dataset's own. */
  pairs: number;
  /** Bytes of those pairs' files (what auto settings look at). */
  characters: number;
  validation: DatasetFile | undefined;
}

/** The latest READY runs of a trainer, model and method whose rate an estimate is measured on. */
const MEASURED_RUNS = 5;
/** Memory kept for the server itself when a run's trainer is checked to fit (its own heap, requests, an upload). */
const MEMORY_RESERVE_BYTES = 2 ** 30;

/** Fine-tuning runs: creation with validated config, reads, cancel and delete. */
export class RunService {
  /** The feed of each followed run, by owner and run id. */
  private readonly feeds = new Map<string, RunFeed>();

  constructor(
    private readonly runs: RunRepository,
    private readonly datasets: DatasetService,
    private readonly models: ModelCatalog,
    private readonly blobs: BlobStore,
    /** Where runs' creation and cancellation are told (`changed` wakes an in-process scheduler at once). */
    private readonly events: RunEventBus,
    private readonly options: {
      defaultModel: string | undefined;
      trackerUrl: (runId: string) => string;
      /** Most pairs and bytes of dataset files a run may read (`CONDUIT_MAX_RUN_PAIRS`, `CONDUIT_MAX_RUN_BYTES`). Defaults to no limit. */
      limits?: { maxPairs: number; maxBytes: number };
      /**
       * Which trainer a run gets (`CONDUIT_TRAINER`), and what the server offers the trainers (whether they are
       * installed, their threads, for the choice and the estimate).
       */
      trainers: { setting: TrainerSetting; host: TrainerHost };
      /** How a LoRA run's adapter is stored (`CONDUIT_ADAPTER_TYPE`). Defaults to `q8_0`. */
      adapterType?: AdapterTypeSetting;
      /**
       * Throws a `model_not_found` error when `userId` cannot name `model` (a run's `judgeModel`). Defaults to
       * taking every name.
       */
      checkModel?: (userId: string, model: string, param: string) => Promise<void>;
      /**
       * The memory a run's trainer must fit in at creation: the machine's (or its container's), less what the
       * server holds now (the models its engine has loaded). Defaults to the machine's, and nothing held.
       */
      memory?: { total?: () => number; inUse?: () => number };
      /**
       * How busy the machine is when a run is planned: the threads that want a core besides the trainer's (the
       * server's own work included: `RecentLoad`) and the cores (the estimate's CPU share, `cpuShare`). Defaults
       * to the 1-minute load average and the machine's cores.
       */
      cpu?: { load?: () => number; cores?: () => number };
    },
  ) {}

  /** A judge must be a model this user can name now: a typo is a 400 at creation, not a judge error on every item. */
  private async checkJudge(userId: string, model: string): Promise<void> {
    await this.options.checkModel?.(userId, model, "judgeModel").catch((error: unknown) => {
      if (error instanceof ConduitError && error.code === "model_not_found")
        throw new ConduitError("invalid_request", error.message.replace(/^model/, "judge model"), {
          param: "judgeModel",
        });
      throw error;
    });
  }

  /**
   * Creates a run, in phases: its dataset, base model and trainer, what it trains on (within the limits), its
   * settings (each defaulted once, here), its estimate; then it is stored QUEUED and the scheduler told.
   */
  async create(userId: string, command: CreateRun): Promise<Run> {
    const dpo = dpoRequest(command);
    const from = dpo?.fromRunID === undefined ? undefined : await this.startingRun(userId, dpo.fromRunID);
    const method = methodRequest(command, from);
    const { dataset, param } = await this.datasetOf(userId, command);
    const { baseModelName, model } = this.baseModelOf(
      from === undefined ? command : { ...command, baseModelName: this.baseOfStart(command, from) },
    );
    const training = await this.trainingSet(userId, dataset, command.validationFileID);
    this.checkLimits(training, param);
    if (command.judgeModel !== undefined) await this.checkJudge(userId, command.judgeModel);
    if (dpo !== undefined) await this.checkPreferences(userId, dataset.id, training, param);
    const trainer = await this.trainerFor(
      method,
      dpo === undefined ? "sft" : "dpo",
      baseModelName,
      model.path,
      command.trainer,
    );
    await this.checkMemory(trainer.trainer, method.method, baseModelName, model.path);
    const settings = await this.settings(
      from === undefined ? command : { ...command, complexity: from.config.complexity },
      method,
      dataset,
      baseModelName,
      model,
      trainer,
      training,
    );
    const logs = settings.logs;
    const trained: RunConfig =
      command.judgeModel === undefined
        ? settings.config
        : { ...settings.config, judgeModel: command.judgeModel };
    const config: RunConfig =
      dpo === undefined ? trained : { ...trained, dpo: { beta: dpo.beta, fromRunID: from?.id ?? null } };
    if (from !== undefined)
      logs.push(`preference tuning starts from run ${from.id}'s adapter; its model is the reference`);
    const id = newId("ft");
    const estimate = await this.plan(id, userId, dataset.id, config, model).catch((error: unknown) => {
      logs.push(`no estimate of the run's duration: ${(error as Error).message}`);
      return null;
    });
    const run = await this.runs.create({
      id,
      userId,
      datasetId: dataset.id,
      datasetName: dataset.name,
      name: config.name,
      ioPairsCount: dataset.ioPairsCount,
      trackerUrl: this.options.trackerUrl(id),
      config: { ...config, ...(command.jobRequest ? { jobRequest: command.jobRequest } : {}) },
      logs,
      estimate,
    });
    this.events.emit("created", run);
    this.events.emit("changed", id);
    return run;
  }

  /**
   * The run a `dpo` run starts from: one of the user's (else a 404), READY, a LoRA adapter trained with the
   * supervised loss.
   */
  private async startingRun(userId: string, name: string): Promise<Run> {
    const id = runIdOfModelName(name) ?? name;
    const run = await this.runs.get(userId, id);
    if (!run) throw new ConduitError("not_found", `run ${id} not found`, { param: "fromRunID" });
    const refuse = (why: string) =>
      new ConduitError("invalid_request", `run ${id} ${why}; "fromRunID" names a READY supervised LoRA run`, {
        param: "fromRunID",
      });
    if (run.status !== "READY" || !run.modelPath) throw refuse(`is ${run.status}, not READY`);
    if (methodOf(run.config) !== "lora") throw refuse('trained every weight ("method": "full")');
    if (run.config.dpo !== undefined) throw refuse("is itself a preference-tuning run");
    return run;
  }

  /** The base model of a run that starts from `from`'s adapter: `from`'s (naming another is a 400). */
  private baseOfStart(command: CreateRun, from: Run): string {
    const base = from.config.baseModelName;
    if (command.baseModelName !== undefined && command.baseModelName !== base)
      throw new ConduitError(
        "invalid_request",
        `"baseModelName" is ${command.baseModelName}, but run ${from.id}'s adapter is for ${base}; leave it out`,
        { param: "baseModelName" },
      );
    return base;
  }

  /**
   * A `dpo` run trains on preference examples only: the first pair of its dataset (or validation file) that is
   * not one is a 400 naming its file and line. Reads every pair once (the estimate reads them again).
   */
  private async checkPreferences(
    userId: string,
    datasetId: string,
    training: TrainingSet,
    param: string,
  ): Promise<void> {
    const sources: [string, AsyncIterable<IoPair>, string][] = [
      [`dataset ${datasetId}`, this.datasets.pairs(userId, datasetId, training.validation?.id), param],
    ];
    if (training.validation !== undefined)
      sources.push([
        `file ${training.validation.id}`,
        this.datasets.filePairs(userId, training.validation.id, "validationFileID"),
        "validationFileID",
      ]);
    for (const [what, pairs, field] of sources)
      for await (const pair of pairs)
        if (!isPreference(pair))
          throw new ConduitError(
            "invalid_request",
            `${what} holds a pair that is not a preference example (line ${pair.line} of its file has no ` +
              'non-preferred answer); "method": "dpo" trains on preference examples only (docs/fine-tuning.md)',
            { param: field },
          );
  }

  /** The run's dataset, by id or name, with pairs to train on; `param` is the field that named it. */
  private async datasetOf(userId: string, command: CreateRun) {
    const datasetId = command.datasetID;
    if (!datasetId && !command.datasetName)
      throw new ConduitError("invalid_request", 'one of "datasetID" and "datasetName" is required', {
        param: "datasetID",
      });
    const dataset = await this.datasets.find(userId, { id: datasetId, name: command.datasetName });
    const param = datasetId ? "datasetID" : "datasetName";
    // The dataset's state, not the request, is what is wrong (the same command works after an upload).
    if (dataset.ioPairsCount === 0)
      throw new ConduitError("conflict", `dataset ${dataset.id} has no IO pairs; upload a file first`, {
        param,
      });
    return { dataset, param };
  }

  /** The run's base model: the one asked for, else the server's default. */
  private baseModelOf(command: CreateRun): { baseModelName: string; model: ModelRef } {
    const baseModelName = command.baseModelName ?? this.options.defaultModel;
    if (!baseModelName)
      throw new ConduitError(
        "invalid_request",
        '"baseModelName" is required (no CONDUIT_DEFAULT_MODEL is set)',
        {
          param: "baseModelName",
        },
      );
    const model = this.models.resolve(baseModelName);
    if (!model)
      throw new ConduitError("model_not_found", `model "${baseModelName}" not found`, {
        param: "baseModelName",
      });
    return { baseModelName, model };
  }

  /**
   * The run's effective settings, each defaulted here and nowhere else: explicit numbers win, each on its own;
   * what is left to "auto" is chosen from the data and the model; the rest from `runDefaults` and the trainer
   * (its LoRA targets). Also the log lines that say how the settings were chosen.
   */
  private async settings(
    command: CreateRun,
    method: MethodRequest,
    dataset: { id: string; name: string },
    baseModelName: string,
    model: ModelRef,
    trainer: TrainerChoice,
    training: TrainingSet,
  ): Promise<{ config: RunConfig; logs: string[] }> {
    const asked = { epochs: command.epochs ?? "auto", lr: command.lr ?? "auto", loraRank: method.loraRank };
    // A full run has no rank (`null`), so it is not among them.
    const autoSettings = AUTO_SETTINGS.filter((setting) => asked[setting] === "auto");
    const choice =
      autoSettings.length > 0
        ? chooseAutoSettings({
            method: method.method,
            objective: command.method === "dpo" ? "dpo" : "sft",
            pairs: training.pairs,
            characters: training.characters,
            model: await this.modelShape(baseModelName, model.path),
          })
        : undefined;
    const chosen = (setting: AutoSetting): number => {
      if (!choice) throw new Error(`no auto choice for ${setting}`);
      return choice[setting];
    };
    const multiplier = command.lrMultiplier ?? 1;
    const lr = (typeof command.lr === "number" ? command.lr : chosen("lr")) * multiplier;
    // Each rate is at most 1 (the schema's check); their product is the service's to refuse.
    if (lr > 1)
      throw new ConduitError(
        "invalid_request",
        `the learning rate would be ${lr} (${lr / multiplier} × ${command.lrMultiplier}); at most 1`,
        { param: "lrMultiplier" },
      );
    const config: RunConfig = {
      baseModelName,
      datasetID: dataset.id,
      datasetName: dataset.name,
      lr,
      epochs: typeof command.epochs === "number" ? command.epochs : chosen("epochs"),
      steps: command.steps ?? null,
      complexity: command.complexity ?? runDefaults.complexity,
      ...methodConfig(method, () => chosen("loraRank"), trainers[trainer.trainer]),
      systemPrompt: command.systemPrompt ?? "",
      name: command.name ?? `${dataset.name}-${baseModelName}`,
      trackerProject: command.trackerProject ?? null,
      trackerEntity: command.trackerEntity ?? null,
      contextSize: runDefaults.contextSize,
      lrSchedule: runDefaults.lrSchedule,
      lrMinFraction: runDefaults.lrMinFraction,
      outputType:
        method.method === "lora"
          ? adapterOutputType(this.options.adapterType ?? "q8_0")
          : runDefaults.outputType,
      evalFraction: runDefaults.evalFraction,
      seed: command.seed ?? runDefaults.seed,
      trainOnInputs: command.trainOnInputs ?? false,
      validationFileID: training.validation?.id ?? null,
      validationFileName: training.validation?.name ?? null,
      earlyStoppingPatience: command.earlyStoppingPatience ?? null,
      autoSettings,
      trainer: trainer.trainer,
    };
    const logs = choice
      ? [`auto settings: ${autoSettings.map((setting) => choice.reasons[setting]).join("; ")}`]
      : [];
    if (command.lrMultiplier !== undefined)
      logs.push(`learning rate ${lr}: ${lr / command.lrMultiplier} × ${command.lrMultiplier} (multiplier)`);
    logs.push(trainer.reason);
    return { config, logs };
  }

  /**
   * What the run trains on: the dataset's pairs and bytes (the text auto settings look at), less
   * the validation file when it is one of the dataset's own. The validation file must be one of
   * the user's (else a 404), hold pairs, and leave some to train on.
   */
  private async trainingSet(
    userId: string,
    dataset: { id: string; ioPairsCount: number },
    validationFileId: string | undefined,
  ): Promise<TrainingSet> {
    let pairs = dataset.ioPairsCount;
    let characters = 0;
    const pageSize = 1000;
    for (let offset = 0; ; offset += pageSize) {
      const files = await this.datasets.listFiles(userId, dataset.id, { limit: pageSize, offset });
      for (const file of files) characters += file.size;
      if (files.length < pageSize) break;
    }
    if (validationFileId === undefined) return { pairs, characters, validation: undefined };
    const validation = await this.datasets.getUserFile(userId, validationFileId, "validationFileID");
    if (validation.ioPairsCount === 0)
      throw new ConduitError(
        "invalid_request",
        `file ${validation.id} has no IO pairs; a validation file needs at least one`,
        { param: "validationFileID" },
      );
    if (validation.datasetId === dataset.id) {
      pairs -= validation.ioPairsCount;
      characters -= validation.size;
      if (pairs <= 0)
        throw new ConduitError(
          "invalid_request",
          `file ${validation.id} holds every pair of dataset ${dataset.id}, so none would be left to train on; ` +
            "upload the validation pairs as a file of their own",
          { param: "validationFileID" },
        );
    }
    return { pairs, characters, validation };
  }

  /**
   * Refuses a run that would read more pairs or bytes than the limits allow, naming the limit and the
   * numbers (its tokens are only known once the trainer has tokenized them: `CONDUIT_MAX_RUN_TOKENS`).
   */
  private checkLimits(training: TrainingSet, param: string): void {
    const limits = this.options.limits;
    if (!limits) return;
    const pairs = training.pairs + (training.validation?.ioPairsCount ?? 0);
    const bytes = training.characters + (training.validation?.size ?? 0);
    const what = training.validation ? "the dataset and the validation file hold" : "the dataset holds";
    if (pairs > limits.maxPairs)
      throw new ConduitError(
        "invalid_request",
        `${what} ${pairs} IO pairs, more than a run may read (CONDUIT_MAX_RUN_PAIRS: ${limits.maxPairs}); ` +
          "train on a smaller dataset",
        { param },
      );
    if (bytes > limits.maxBytes)
      throw new ConduitError(
        "invalid_request",
        `${what} ${bytes} bytes of IO pairs, more than a run may read (CONDUIT_MAX_RUN_BYTES: ${limits.maxBytes}); ` +
          "train on a smaller dataset",
        { param },
      );
  }

  /** The run's trainer (see `chooseTrainer`); a run no trainer here can train is a 400. */
  private async trainerFor(
    method: MethodRequest,
    objective: TrainObjective,
    name: string,
    modelPath: string,
    asked: TrainerName | undefined,
  ): Promise<TrainerChoice> {
    const { setting, host } = this.options.trainers;
    let architecture: string;
    try {
      architecture = await readModelArchitecture(modelPath);
    } catch (error) {
      throw new ConduitError(
        "invalid_request",
        `model "${name}" cannot be read (${(error as Error).message})`,
        {
          param: "baseModelName",
        },
      );
    }
    // A trainer's status (importing PyTorch takes seconds) is only asked for when it could be chosen.
    const candidates =
      asked !== undefined
        ? [trainers[asked]]
        : setting === "auto"
          ? Object.values(trainers)
          : [trainers[setting]];
    const statuses: Partial<Record<TrainerName, TrainerStatus>> = {};
    for (const backend of candidates) statuses[backend.name] = await backend.status(host);
    return chooseTrainer({
      setting,
      asked,
      statuses,
      request: {
        method: method.method,
        objective,
        architecture,
        loraTargets: method.loraTargets ?? undefined,
      },
    });
  }

  /**
   * Refuses a run whose trainer would not fit in memory beside what the server holds now: its measured peak for
   * this base and method (`TrainerBackend.memoryNeed`) against the machine's memory less the loaded models and a
   * reserve for the server itself, the numbers named.
   */
  private async checkMemory(trainer: TrainerName, method: TrainMethod, name: string, modelPath: string) {
    const backend = trainers[trainer];
    const need = await backend.memoryNeed(method, await readModelCost(modelPath), this.options.trainers.host);
    const total = this.options.memory?.total?.() ?? totalMemory();
    const inUse = this.options.memory?.inUse?.() ?? 0;
    const room = total - inUse - MEMORY_RESERVE_BYTES;
    if (need <= room) return;
    const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(1)} GiB`;
    throw new ConduitError(
      "invalid_request",
      `the ${trainer} trainer needs about ${gib(need)} of memory to train "${name}" (${method}); this server has ` +
        `${gib(total)}, ${gib(inUse)} of it held by the models loaded now and ${gib(MEMORY_RESERVE_BYTES)} kept for ` +
        `the server: ${gib(Math.max(0, room))} free for a trainer`,
      { param: "baseModelName" },
    );
  }

  /**
   * The run's estimate (`planRun`): its steps and tokens from the plan its trainer will run (its examples written
   * and tokenized as the scheduler and the trainer do, in the run's directory, removed after), its rate from this
   * server's latest READY runs of the same trainer, model and method, or a prior. Throws when the plan cannot be
   * made (the caller creates the run without one: an estimate never stands in the way of a run).
   */
  private async plan(
    runId: string,
    userId: string,
    datasetId: string,
    config: RunConfig,
    model: ModelRef,
  ): Promise<RunPlan> {
    const trainer = trainerOf(config);
    const backend = trainers[trainer];
    const host = this.options.trainers.host;
    const cost = await readModelCost(model.path);
    const dir = this.blobs.pathOf(`runs/${runId}/plan`);
    try {
      const examples = await prepareSamples(
        this.datasets,
        { userId, datasetId, config },
        model,
        dir,
        DEFAULT_MIN_PAIRS_FOR_EVAL,
      );
      const summary = await planTrainingData(model.path, {
        ...planSettingsOf(config, null),
        samples: [],
        samplesFile: examples.train,
        evalSamples: [],
        evalSamplesFile: examples.validation,
        workDir: dir,
      });
      const plan = config.dpo === undefined ? summary : { ...summary, pairs: true as const };
      const threads = backend.threads(host.threads);
      return planRun({
        prior: backend.prior(host),
        method: config.method,
        model: cost,
        plan,
        threads,
        cpuShare: cpuShare(
          (this.options.cpu?.load ?? (() => os.loadavg()[0]!))(),
          (this.options.cpu?.cores ?? os.availableParallelism)(),
          threads,
        ),
        history: await this.runs.finishedRuns(
          { trainer, baseModelName: config.baseModelName, method: config.method },
          MEASURED_RUNS,
        ),
      });
    } finally {
      await fsp.rm(this.blobs.pathOf(`runs/${runId}`), { recursive: true, force: true });
    }
  }

  /** The base model's shape for auto settings; a file that cannot be read is the model's fault, a 400. */
  private async modelShape(name: string, modelPath: string): Promise<ModelShape> {
    try {
      return await readModelShape(modelPath);
    } catch (error) {
      throw new ConduitError(
        "invalid_request",
        `model "${name}" cannot be read to choose the "auto" settings (${(error as Error).message}); ` +
          "give epochs, lr and loraRank as numbers, or check the model file",
        { param: "baseModelName" },
      );
    }
  }

  async get(userId: string, id: string): Promise<Run> {
    const run = await this.runs.get(userId, id);
    if (!run) throw new ConduitError("not_found", `run ${id} not found`, { param: "runId" });
    return run;
  }

  /**
   * What a READY run produced, to download: as `adapter` (the default) its own file (a LoRA run's adapter, a full
   * run's model); as `merged`, one GGUF that needs no adapter: a LoRA run's adapter merged into its base
   * (`mergeLora`: float weights in their types, quantized adapted weights in F16), built on the first request and kept with the run (its size and time in the
   * run's log), or a full run's model as it is.
   */
  async artifact(userId: string, id: string, format: "adapter" | "merged" = "adapter"): Promise<RunArtifact> {
    const run = await this.get(userId, id);
    if (run.status !== "READY" || !run.modelPath)
      throw new ConduitError(
        "conflict",
        `run ${run.id} is ${run.status}, not READY; only a READY run has a file to download`,
      );
    const lora = methodOf(run.config) === "lora";
    const fileName = lora ? `${run.id}-lora.gguf` : `${run.id}.gguf`;
    const stat = await fsp.stat(run.modelPath).catch(() => undefined);
    if (!stat?.isFile())
      throw new ConduitError(
        "not_found",
        `run ${run.id} is READY but its file ${fileName} is not in this server's storage ` +
          "(removed from disk, or trained by a server that does not share this one's data directory)",
      );
    if (format === "adapter" || !lora) return { path: run.modelPath, fileName, sizeBytes: stat.size };
    return this.merged(run, run.modelPath);
  }

  /** Merges made now, by run id: a second request for the same run waits for the first's. */
  private readonly merging = new Map<string, Promise<RunArtifact>>();

  private async merged(run: Run, adapterPath: string): Promise<RunArtifact> {
    const path = this.blobs.pathOf(`runs/${run.id}/merged.gguf`);
    const fileName = `${run.id}-merged.gguf`;
    const baseName = String(run.config.baseModelName);
    const base = this.models.resolve(baseName);
    if (!base)
      throw new ConduitError(
        "conflict",
        `run ${run.id} is a LoRA adapter of base model "${baseName}", which is no longer in the models directory`,
      );
    // Kept until the base file changes (an operator replacing it): then merged again.
    const [kept, baseStat] = await Promise.all([
      fsp.stat(path).catch(() => undefined),
      fsp.stat(base.path).catch(() => undefined),
    ]);
    if (kept?.isFile() && baseStat !== undefined && kept.mtimeMs >= baseStat.mtimeMs)
      return { path, fileName, sizeBytes: kept.size };
    const pending = this.merging.get(run.id);
    if (pending) return pending;
    const merge = (async () => {
      const started = performance.now();
      let result;
      try {
        result = await mergeLora(base.path, adapterPath, path, undefined, ggmlQuants());
      } catch (error) {
        if (error instanceof MergeUnsupportedError)
          throw new ConduitError("invalid_request", `run ${run.id} cannot be merged: ${error.message}`, {
            param: "format",
          });
        throw error;
      }
      const seconds = (performance.now() - started) / 1000;
      await this.runs.appendLog(
        run.id,
        `merged the adapter into ${baseName}: ${result.weights} weights` +
          (result.widened > 0 ? ` (${result.widened} quantized ones written in F16)` : "") +
          `, ${(result.bytes / 2 ** 20).toFixed(2)} MiB in ${seconds.toFixed(1)} s (${fileName})`,
      );
      return { path, fileName, sizeBytes: result.bytes };
    })();
    this.merging.set(run.id, merge);
    try {
      return await merge;
    } finally {
      this.merging.delete(run.id);
    }
  }

  /**
   * A run's kept checkpoints, newest first: a READY run's (its last epochs' ends); none for a run of any other
   * status, or one whose trainer keeps none (a full run, the torch trainer).
   */
  async checkpoints(userId: string, id: string): Promise<{ run: Run; checkpoints: RunCheckpoint[] }> {
    const run = await this.get(userId, id);
    const checkpoints = run.status === "READY" ? [...(run.stats.checkpoints ?? [])].reverse() : [];
    return { run, checkpoints };
  }

  /** A READY run's kept checkpoint's adapter, to download; a step it did not keep is a 404. */
  async checkpointArtifact(userId: string, id: string, step: number): Promise<RunArtifact> {
    const { run, checkpoints } = await this.checkpoints(userId, id);
    if (run.status !== "READY")
      throw new ConduitError(
        "conflict",
        `run ${run.id} is ${run.status}, not READY; its checkpoints are kept once it is READY`,
      );
    const file = checkpoints.some((c) => c.step === step) ? keptCheckpointPath(run, step) : undefined;
    const stat = file === undefined ? undefined : await fsp.stat(file).catch(() => undefined);
    if (file === undefined || !stat?.isFile())
      throw new ConduitError("not_found", `run ${run.id} kept no checkpoint at step ${step}`, {
        param: "step",
      });
    return { path: file, fileName: `${run.id}-step-${step}-lora.gguf`, sizeBytes: stat.size };
  }

  /**
   * A READY run's examples with their loss (the scheduler writes `runs/{id}/examples.jsonl` when
   * the run ends), of one split or both, sorted and paged. The file is streamed; at most
   * `offset + limit` examples are held, the best candidates for the page so far. A run that is not
   * READY, or has no such file, is a 409.
   */
  async examples(userId: string, id: string, query: ExamplesQuery): Promise<ExamplesPage> {
    const run = await this.get(userId, id);
    if (run.status !== "READY")
      throw new ConduitError(
        "conflict",
        `run ${run.id} is ${run.status}, not READY; per-example losses are measured when a run ends READY`,
      );
    const file = this.blobs.pathOf(`runs/${run.id}/examples.jsonl`);
    const stream = fs.createReadStream(file, { encoding: "utf8" });
    const opened = new Promise<void>((resolve, reject) => {
      stream.once("open", () => resolve());
      stream.once("error", reject);
    });
    try {
      await opened;
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      throw new ConduitError(
        "conflict",
        `run ${run.id} is READY but has no per-example losses (it was trained before Conduit measured ` +
          "them, or by a server that does not share this one's data directory)",
      );
    }
    const compare = compareExamples(query.sort);
    const keep = query.offset + query.limit;
    const kept: RunExample[] = [];
    let total = 0;
    try {
      for await (const line of readline.createInterface({ input: stream, crlfDelay: Infinity })) {
        if (!line.trim()) continue;
        const example = JSON.parse(line) as RunExample;
        if (query.split && example.split !== query.split) continue;
        total++;
        // Binary insertion into the sorted candidates, dropping the one that falls off the end.
        let low = 0;
        let high = kept.length;
        while (low < high) {
          const middle = (low + high) >> 1;
          if (compare(kept[middle] as RunExample, example) <= 0) low = middle + 1;
          else high = middle;
        }
        if (low >= keep) continue;
        kept.splice(low, 0, example);
        if (kept.length > keep) kept.pop();
      }
    } finally {
      stream.destroy();
    }
    return { examples: kept.slice(query.offset), total };
  }

  list(userId: string, page: Page): Promise<Run[]> {
    return this.runs.list(userId, page);
  }

  /**
   * The user's runs newest first, older than the run `after`; with `metadata`, only those whose face's request
   * (`config.jobRequest`) kept every given key with that value, read a page at a time until `limit` match.
   */
  async listAfter(
    userId: string,
    page: { after: string | undefined; limit: number },
    metadata: readonly (readonly [string, string])[] = [],
  ): Promise<Run[]> {
    if (metadata.length === 0) return this.runs.listAfter(userId, page);
    const found: Run[] = [];
    for (let after = page.after; found.length < page.limit;) {
      const runs = await this.runs.listAfter(userId, { after, limit: 100 });
      for (const run of runs) {
        const kept = run.config.jobRequest?.metadata ?? {};
        if (metadata.every(([key, value]) => kept[key] === value)) found.push(run);
      }
      if (runs.length < 100) break;
      after = runs.at(-1)?.id;
    }
    return found.slice(0, page.limit);
  }

  /** Cancels a QUEUED, RUNNING or PAUSED run; a finished one is a 409. */
  async cancel(userId: string, id: string): Promise<void> {
    const previous = await this.runs.cancel(userId, id);
    if (previous === undefined)
      throw new ConduitError("not_found", `run ${id} not found`, { param: "runId" });
    if (!activeStatuses.includes(previous))
      throw new ConduitError("conflict", `run ${id} is ${previous} and cannot be cancelled`);
    this.events.emit("ended", id, "CANCELLED");
    this.events.emit("changed", id);
  }

  /**
   * Pauses a QUEUED or RUNNING run: a RUNNING run's trainer stops at a step boundary (its worker frees it for
   * the next run) and its checkpoint is kept for {@link resume}. Any other status is a 409. Returns the run.
   */
  async pause(userId: string, id: string): Promise<Run> {
    const previous = await this.runs.pause(userId, id);
    if (previous === undefined)
      throw new ConduitError("not_found", `run ${id} not found`, { param: "runId" });
    if (previous !== "QUEUED" && previous !== "RUNNING")
      throw new ConduitError(
        "conflict",
        `run ${id} is ${previous} and cannot be paused: only a QUEUED or RUNNING run can`,
      );
    this.events.emit("changed", id);
    return this.get(userId, id);
  }

  /**
   * Queues a PAUSED run again; it goes on from its checkpoint. A run whose trainer is still stopping, or that is
   * not PAUSED, is a 409. Returns the run.
   */
  async resume(userId: string, id: string): Promise<Run> {
    const previous = await this.runs.resume(userId, id);
    if (previous === undefined)
      throw new ConduitError("not_found", `run ${id} not found`, { param: "runId" });
    if (previous === "PAUSING")
      throw new ConduitError(
        "conflict",
        `run ${id} is still pausing (its trainer is stopping): resume it once it is PAUSED`,
      );
    if (previous !== "PAUSED")
      throw new ConduitError(
        "conflict",
        `run ${id} is ${previous} and cannot be resumed: only a PAUSED run can`,
      );
    this.events.emit("changed", id);
    return this.get(userId, id);
  }

  /**
   * Follows a user's run: its log lines (earlier ones first), its stats when they change (loss series
   * cut to the points not yet sent), its status when it changes, until the run has ended (or is
   * deleted: status `DELETED`). Each event has an `id`; pass the last one received as `after` to go on
   * exactly after it. A run that does not exist is a 404 (thrown here, before any event); a malformed
   * `after` a 400.
   *
   * The followers of a run share one {@link RunFeed}: it reads the database only when the run was written
   * (the repository wakes it: this server's writes, and other servers' through PostgreSQL `NOTIFY`), once
   * for all of them, so a quiet run costs nothing and a busy one the same for one follower as for many.
   */
  async follow(
    userId: string,
    id: string,
    options: {
      /** The `id` of the last event the client has. Defaults to none: everything from the start. */
      after?: string | undefined;
      /** Ends the iteration (the client went away). Defaults to none. */
      signal?: AbortSignal | undefined;
    } = {},
  ): Promise<AsyncGenerator<RunFollowEvent>> {
    const cursor = FollowCursor.parse(options.after);
    const key = `${userId}\u0000${id}`;
    let feed = this.feeds.get(key);
    if (!feed) {
      const runs = this.runs;
      const created: RunFeed = new RunFeed(
        {
          state: () => runs.followed(userId, id),
          logsSince: (afterSeq, limit, untilSeq) => runs.logsSince(id, afterSeq, limit, untilSeq),
          subscribe: (wake) => runs.changes.subscribe(id, wake),
        },
        () => {
          if (this.feeds.get(key) === created) this.feeds.delete(key);
        },
      );
      this.feeds.set(key, created);
      feed = created;
    }
    const signal = options.signal;
    if (!(await feed.join(signal)))
      throw new ConduitError("not_found", `run ${id} not found`, { param: "runId" });
    const joined = feed;
    return (async function* () {
      try {
        yield* joined.events(cursor, signal);
      } finally {
        joined.leave();
      }
    })();
  }

  /** Runs followed now, each by one or more followers (tests, metrics). */
  get followedRuns(): number {
    return this.feeds.size;
  }

  /** Deletes a run; a running one is cancelled first so its trainer stops. */
  async delete(userId: string, id: string): Promise<Run> {
    const run = await this.get(userId, id);
    if (activeStatuses.includes(run.status)) {
      const previous = await this.runs.cancel(userId, id);
      if (previous !== undefined && activeStatuses.includes(previous))
        this.events.emit("ended", id, "CANCELLED");
      this.events.emit("changed", id);
    }
    if (!(await this.runs.delete(userId, id)))
      throw new ConduitError("not_found", `run ${id} not found`, { param: "runId" });
    // A live run's files are removed by its worker once the trainer has stopped (a pausing run's too).
    this.events.emit("deleted", run);
    if (run.status !== "QUEUED" && run.status !== "RUNNING" && !run.pausing)
      await this.blobs.remove(`runs/${id}`);
    return run;
  }
}
