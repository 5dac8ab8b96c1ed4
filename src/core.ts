import path from "node:path";
import type { TrainerHost } from "./train/core/TrainerBackend.ts";
import { torchStatus, type TorchTrainerStatus } from "./train/torch/torchStatus.ts";
import { pino, type Logger } from "pino";
import { publicUrl, type Config } from "./config.ts";
import { DatasetService } from "./datasets/DatasetService.ts";
import type { Engine } from "./engine/Engine.ts";
import { createLlamaEngine } from "./engine/LlamaEngine.ts";
import { ModelRegistry } from "./model/ModelRegistry.ts";
import { InferenceService } from "./inference/InferenceService.ts";
import { BlobStore } from "./store/BlobStore.ts";
import { openDatabase, type Db } from "./store/database.ts";
import { DatasetRepository } from "./store/DatasetRepository.ts";
import { KeyRepository } from "./store/KeyRepository.ts";
import { RunRepository } from "./store/RunRepository.ts";
import { AdapterRepository } from "./store/AdapterRepository.ts";
import { AdapterService } from "./train/AdapterService.ts";
import { EvalRepository } from "./store/EvalRepository.ts";
import { EvalService } from "./evals/EvalService.ts";
import { Sweeper } from "./store/Sweeper.ts";
import { diskSpace, type DiskSpace } from "./store/diskSpace.ts";
import { RunService } from "./train/RunService.ts";
import { createRunEventBus, type RunEventBus } from "./train/runEvents.ts";
import { Scheduler, type SchedulerOptions } from "./train/Scheduler.ts";
import { MlflowClient } from "./train/tracking/MlflowClient.ts";
import { MlflowTracker, type MlflowTrackerOptions } from "./train/tracking/MlflowTracker.ts";
import { RecentLoad } from "./train/recentLoad.ts";

/**
 * Everything the API and the CLI work with, assembled once: database, blob store,
 * repositories, domain services, engine and scheduler. `close()` releases all of it.
 */
export interface Core {
  config: Config;
  log: Logger;
  db: Db;
  blobs: BlobStore;
  keys: KeyRepository;
  datasets: DatasetService;
  runRepository: RunRepository;
  runs: RunService;
  /** LoRA adapters imported for a base model (trained elsewhere). */
  adapters: AdapterService;
  /** What happens to runs in this process: the run service and the scheduler emit, the scheduler and trackers listen. */
  runEvents: RunEventBus;
  registry: ModelRegistry;
  engine: Engine;
  inference: InferenceService;
  scheduler: Scheduler;
  /** Evaluations: evals, eval runs (answered in this process), the automatic before/after of READY runs. */
  evals: EvalService;
  /** Removes leftover blobs; built here, started by the server only (the CLI opens the same data dir). */
  sweeper: Sweeper;
  /** What this server offers its trainers (settings, where it computes); the run service and scheduler share it. */
  trainerHost: TrainerHost;
  /** Whether the torch trainer can run here (checked in the background by the server, on demand otherwise). */
  torch: TorchTrainerStatus;
  /** The data directory's disk: the space the server may still write, and its size. */
  disk(): Promise<DiskSpace>;
  close(): Promise<void>;
}

export interface CoreOverrides {
  /** Replaces the llama.cpp engine (HTTP-shape tests). */
  engine?: Engine;
  /** Replaces the blob store (tests make its writes fail as on a full disk). */
  blobs?: BlobStore;
  /** Scheduler timings and seams (tests use short leases, a fake trainer, a held sample preparation). */
  scheduler?: Partial<SchedulerOptions>;
  /** MLflow tracker timings (tests retry fast). */
  tracking?: Partial<MlflowTrackerOptions>;
  /** The memory a run's trainer is checked against at creation (tests make it small). */
  memory?: { total?: () => number; inUse?: () => number };
  /** How busy the machine looks to a run's estimate (tests make it idle). */
  cpu?: { load?: () => number; cores?: () => number };
  log?: Logger;
}

/** What editing keys needs (`conduit keys`): the database and its keys, no engine, scheduler or tracker. */
export interface KeysCore {
  config: Config;
  keys: KeyRepository;
  close(): Promise<void>;
}

function openConfiguredDatabase(config: Config, log?: Logger): Promise<Db> {
  return openDatabase({
    databaseUrl: config.databaseUrl,
    sqlitePath: path.join(config.dataDir, "conduit.db"),
    onConnectionLost: (error) =>
      log?.warn(
        { code: (error as { code?: unknown }).code },
        `a pooled database connection was lost (${error.message}); the next query opens another`,
      ),
  });
}

function keyRepository(db: Db): KeyRepository {
  return new KeyRepository(db.kysely, db.dataVersion, db.readCommitted);
}

/** The light core of `conduit keys`: the configured database's keys. `close()` closes the database. */
export async function createKeysCore(config: Config): Promise<KeysCore> {
  const db = await openConfiguredDatabase(config);
  return { config, keys: keyRepository(db), close: () => db.close() };
}

export async function createCore(config: Config, overrides: CoreOverrides = {}): Promise<Core> {
  const log = overrides.log ?? pino({ level: config.logLevel });
  const db = await openConfiguredDatabase(config, log);
  const blobs = overrides.blobs ?? new BlobStore(path.join(config.dataDir, "blobs"));
  const keys = keyRepository(db);
  const datasetRepository = new DatasetRepository(db.kysely);
  const datasets = new DatasetService(datasetRepository, blobs, config.maxUploadBytes, config.maxPairBytes);
  const runRepository = new RunRepository(db.kysely, db.dialect, db.readCommitted);
  // Writes of other servers sharing a PostgreSQL database wake this one's run followers.
  const stopListening = await runRepository.listen(db);

  const registry = new ModelRegistry({ modelsDir: config.modelsDir });
  const base = publicUrl(config);
  const runEvents = createRunEventBus();
  // With an MLflow server set, every run is mirrored to it, following the run events.
  const tracker = config.mlflowTrackingUri
    ? new MlflowTracker(
        new MlflowClient({
          uri: config.mlflowTrackingUri,
          token: config.mlflowTrackingToken,
          username: config.mlflowTrackingUsername,
          password: config.mlflowTrackingPassword,
        }),
        runRepository,
        log,
        { defaultExperiment: config.mlflowExperiment, ...overrides.tracking },
      )
    : undefined;
  tracker?.follow(runEvents);
  const engine =
    overrides.engine ??
    createLlamaEngine({
      threads: config.threads,
      promptThreads: config.promptThreads,
      contextSize: config.contextSize,
      parallelSequences: config.parallelSequences,
      contextsPerModel: config.contextsPerModel,
      maxQueue: config.maxQueue,
      memoryBudgetBytes: config.modelMemoryBudget,
      gpu: config.gpu,
      gpuLayers: config.gpuLayers,
      adapterBatching: config.adapterBatching,
      ...(config.gpuMemoryBudget === undefined ? {} : { gpuMemoryBudgetBytes: config.gpuMemoryBudget }),
      logger: (level, message) => log[level]({ source: "llama.cpp" }, message),
    });
  const adapterRepository = new AdapterRepository(db.kysely);
  const sweeper = new Sweeper(blobs, runRepository, datasetRepository, log, {
    intervalMs: config.sweepInterval,
    adapters: adapterRepository,
  });
  const inference = new InferenceService(
    engine,
    registry,
    runRepository,
    config.defaultModel,
    adapterRepository,
  );
  // A deleted adapter leaves memory with its file.
  const adapters = new AdapterService(adapterRepository, registry, blobs, {
    maxBytes: config.maxAdapterBytes,
    adapterType: config.adapterType,
    onDeleted: (adapter) => engine.unload(adapter.path),
  });
  // A deleted run's model (its adapter, for a LoRA run) leaves memory with its files.
  runEvents.on("deleted", (run) => {
    if (run.modelPath) engine.unload(run.modelPath);
  });
  const trainerHost: TrainerHost = {
    threads: config.trainThreads,
    gpu: config.gpu,
    // Trainers compute where generation does: the GPU the engine found, with CONDUIT_GPU_LAYERS layers.
    accelerator: async () => {
      const { backend } = await engine.accelerator();
      return backend === "cuda" || backend === "vulkan"
        ? { device: backend, gpuLayers: config.gpuLayers }
        : { device: "cpu", gpuLayers: 0 };
    },
    python: config.python,
    ranks: config.trainRanks,
    nodes: config.trainNodes,
    rendezvous: config.trainRendezvous ?? null,
    blas: config.trainerBlas,
    cacheDir: blobs.pathOf("cache"),
  };
  // Sampled only where no load was given (tests give one).
  const recentLoad = overrides.cpu?.load ? undefined : new RecentLoad();
  const runs = new RunService(runRepository, datasets, registry, blobs, runEvents, {
    defaultModel: config.defaultModel,
    trackerUrl: (id) => `${base}/ui/runs/${id}`,
    limits: { maxPairs: config.maxRunPairs, maxBytes: config.maxRunBytes },
    trainers: { setting: config.trainer, host: trainerHost },
    adapterType: config.adapterType,
    checkModel: async (userId, model, param) => void (await inference.resolve(userId, model, param)),
    memory: {
      // The models the engine holds: each base once, and each adapter's own tensors.
      inUse: () => {
        const held = new Map<string, number>();
        for (const m of engine.loaded()) held.set(`${m.path}\0${m.lora ?? ""}`, m.sizeBytes);
        return [...held.values()].reduce((sum, bytes) => sum + bytes, 0);
      },
      ...overrides.memory,
    },
    // How busy the machine is now, not a minute ago (the estimate's CPU share).
    cpu: { ...(recentLoad && { load: () => recentLoad.current() }), ...overrides.cpu },
  });
  const scheduler = new Scheduler(runRepository, runEvents, datasets, registry, blobs, log, {
    concurrency: config.trainConcurrency,
    host: trainerHost,
    health: db.health,
    maxRunTokens: config.maxRunTokens,
    ...overrides.scheduler,
  });

  const evals = new EvalService(
    new EvalRepository(db.kysely, db.readCommitted),
    runRepository,
    datasets,
    inference,
    blobs,
    log,
    {
      parallel: config.evalParallel,
      afterRun: config.evalAfterRun,
      health: db.health,
    },
  );

  return {
    config,
    log,
    db,
    blobs,
    keys,
    datasets,
    runRepository,
    runs,
    adapters,
    runEvents,
    registry,
    engine,
    inference,
    scheduler,
    evals,
    sweeper,
    trainerHost,
    torch: torchStatus(config.python),
    disk: () => diskSpace(config.dataDir),
    async close() {
      recentLoad?.stop();
      await sweeper.stop();
      await scheduler.close();
      await evals.close();
      await tracker?.close();
      await engine.dispose();
      await stopListening();
      await db.close();
    },
  };
}

/**
 * Creates the keys named in `CONDUIT_API_KEYS`; on a first start with no key at all, creates
 * one for user `default` and returns it so the caller can print it once.
 */
export async function bootstrapKeys(core: Pick<Core, "config" | "keys">): Promise<string | undefined> {
  for (const seed of core.config.apiKeys) await core.keys.ensure(seed.key, seed.userId);
  if ((await core.keys.count()) > 0) return undefined;
  const { key } = await core.keys.create("default", "first start");
  return key;
}
