import path from "node:path";
import { publicUrl, type Config } from "./config.ts";
import { DatasetService } from "./datasets/DatasetService.ts";
import { BlobStore } from "./store/BlobStore.ts";
import { openDatabase, type Db } from "./store/database.ts";
import { DatasetRepository } from "./store/DatasetRepository.ts";
import { KeyRepository } from "./store/KeyRepository.ts";
import { RunRepository } from "./store/RunRepository.ts";
import { RunService, type ModelCatalog } from "./train/RunService.ts";
// import { ModelRegistry } from "./engine/ModelRegistry.ts";

/**
 * Everything the API and the CLI work with, assembled once: database, blob store,
 * repositories, domain services, engine and scheduler. `close()` releases all of it.
 */
export interface Core {
  config: Config;
  db: Db;
  blobs: BlobStore;
  keys: KeyRepository;
  datasets: DatasetService;
  runRepository: RunRepository;
  runs: RunService;
  models: ModelCatalog;
  close(): Promise<void>;
}

export interface CoreOverrides {
  models?: ModelCatalog;
}

export async function createCore(config: Config, overrides: CoreOverrides = {}): Promise<Core> {
  const db = await openDatabase({
    databaseUrl: config.databaseUrl,
    sqlitePath: path.join(config.dataDir, "conduit.db"),
  });
  const blobs = new BlobStore(path.join(config.dataDir, "blobs"));
  await blobs.sweepTemp();
  const keys = new KeyRepository(db.kysely);
  const datasets = new DatasetService(new DatasetRepository(db.kysely), blobs, config.maxUploadBytes);
  const runRepository = new RunRepository(db.kysely, db.dialect);
  const models = overrides.models ?? { resolve: () => undefined }; // TODO registry
  const base = publicUrl(config);
  const runs = new RunService(runRepository, datasets, models, {
    defaultModel: config.defaultModel,
    trackerUrl: (id) => `${base}/ui/runs/${id}`,
  });

  return {
    config,
    db,
    blobs,
    keys,
    datasets,
    runRepository,
    runs,
    models,
    close: () => db.close(),
  };
}

/**
 * Creates the keys named in `CONDUIT_API_KEYS`; on a first start with no key at all, creates
 * one for user `default` and returns it so the caller can print it once.
 */
export async function bootstrapKeys(core: Core): Promise<string | undefined> {
  for (const seed of core.config.apiKeys) await core.keys.ensure(seed.key, seed.userId);
  if ((await core.keys.count()) > 0) return undefined;
  const { key } = await core.keys.create("default", "first start");
  return key;
}
