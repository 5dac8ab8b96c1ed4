import fsp from "node:fs/promises";
import type { Logger } from "pino";
import path from "node:path";
import type { BlobStore } from "./BlobStore.ts";
import type { DatasetRepository } from "./DatasetRepository.ts";
import type { RunRepository } from "./RunRepository.ts";
import type { AdapterRepository } from "./AdapterRepository.ts";

/** What one sweep removed. */
export interface SweepReport {
  /** Temp files (uploads cut off by a crash). */
  tempFiles: string[];
  /** Run directories removed whole: of FAILED and CANCELLED runs, and of runs that no longer exist. */
  runDirs: string[];
  /** `work` and `checkpoint` directories of runs that do not need them. */
  workDirs: string[];
  /**
   * Dataset file blobs no file record holds, and imported adapters' files no adapter record holds: a crash
   * between storing an upload and recording it, or between deleting a record and its blob.
   */
  orphanBlobs: string[];
}

export interface SweeperOptions {
  /** Time between sweeps. */
  intervalMs: number;
  /**
   * Temp files, and file blobs without a record, untouched for this long are leftovers (younger ones
   * may be another server's upload in progress). Defaults to an hour.
   */
  tempMaxAgeMs?: number;
  /** Imported adapters' records, whose files (`adapters/{id}.gguf`) are kept. Defaults to sweeping no adapter files. */
  adapters?: Pick<AdapterRepository, "recordedIds">;
}

/**
 * Removes what crashes and ended runs leave on disk, at start and then every `intervalMs` while
 * the server runs: stale temp files, the directories of FAILED and CANCELLED runs and of deleted
 * ones, and work directories of runs that are not training. Only the server sweeps (the CLI
 * opens the same data dir), and never a RUNNING run's files, which may belong to another worker.
 */
export class Sweeper {
  private timer: NodeJS.Timeout | undefined;
  private sweeping: Promise<unknown> | undefined;

  constructor(
    private readonly blobs: BlobStore,
    private readonly runs: RunRepository,
    private readonly files: Pick<DatasetRepository, "recordedBlobs">,
    private readonly log: Logger,
    private readonly options: SweeperOptions,
  ) {}

  /**
   * One pass. `atStart` (before this server's scheduler runs) also removes the work directories of
   * QUEUED runs, left by a trainer that died; their checkpoints stay, to resume from.
   */
  async sweep({ atStart = false } = {}): Promise<SweepReport> {
    const report: SweepReport = {
      tempFiles: await this.blobs.sweepTemp(this.options.tempMaxAgeMs),
      runDirs: [],
      workDirs: [],
      orphanBlobs: [...(await this.sweepOrphanBlobs()), ...(await this.sweepOrphanAdapters())],
    };
    const runsDir = this.blobs.pathOf("runs");
    const ids = (await fsp.readdir(runsDir, { withFileTypes: true }).catch(() => []))
      .filter((entry) => entry.isDirectory() && /^[A-Za-z0-9_-]+$/.test(entry.name))
      .map((entry) => entry.name);
    const statuses = await this.runs.statuses(ids);
    for (const id of ids) {
      const status = statuses.get(id);
      if (status === undefined || status === "FAILED" || status === "CANCELLED") {
        await this.blobs.remove(`runs/${id}`);
        report.runDirs.push(id);
        continue;
      }
      const leftovers =
        status === "READY" ? ["work", "checkpoint"] : status === "QUEUED" && atStart ? ["work"] : [];
      for (const name of leftovers) {
        const key = `runs/${id}/${name}`;
        if (!(await exists(this.blobs.pathOf(key)))) continue;
        await this.blobs.remove(key);
        report.workDirs.push(key);
      }
    }
    const removed =
      report.tempFiles.length + report.runDirs.length + report.workDirs.length + report.orphanBlobs.length;
    if (removed > 0)
      this.log.info(
        {
          tempFiles: report.tempFiles.length,
          runDirs: report.runDirs,
          workDirs: report.workDirs,
          orphanBlobs: report.orphanBlobs,
        },
        `swept ${removed} leftovers: ${report.tempFiles.length} temp files, ${report.runDirs.length} run directories, ` +
          `${report.workDirs.length} work directories, ${report.orphanBlobs.length} file blobs without a record`,
      );
    return report;
  }

  /**
   * Removes `files/{dataset}/{file}` blobs that no file record holds and that are older than the temp
   * files' limit, then dataset directories left empty. A blob is stored before its record is written
   * (and its record deleted before it), so a younger one may be an upload being recorded right now.
   */
  private async sweepOrphanBlobs(): Promise<string[]> {
    const cutoff = Date.now() - (this.options.tempMaxAgeMs ?? 60 * 60 * 1000);
    const filesDir = this.blobs.pathOf("files");
    const candidates: string[] = [];
    const datasetDirs = (await fsp.readdir(filesDir, { withFileTypes: true }).catch(() => []))
      .filter((entry) => entry.isDirectory() && /^[A-Za-z0-9_-]+$/.test(entry.name))
      .map((entry) => entry.name);
    for (const dir of datasetDirs)
      for (const name of await fsp.readdir(path.join(filesDir, dir)).catch(() => [] as string[])) {
        if (!/^[A-Za-z0-9_-]+$/.test(name)) continue;
        const stat = await fsp.stat(path.join(filesDir, dir, name)).catch(() => undefined);
        if (stat?.isFile() && stat.mtimeMs < cutoff) candidates.push(`files/${dir}/${name}`);
      }
    const recorded = await this.files.recordedBlobs(candidates);
    const removed = candidates.filter((key) => !recorded.has(key));
    for (const key of removed) await this.blobs.remove(key);
    // A dataset directory left empty an hour ago (its dataset deleted, or its last file); rmdir fails
    // if it is not empty. (`BlobStore.commit` makes it again if an upload comes just then.)
    for (const dir of datasetDirs) {
      const full = path.join(filesDir, dir);
      const stat = await fsp.stat(full).catch(() => undefined);
      if (stat && stat.mtimeMs < cutoff) await fsp.rmdir(full).catch(() => undefined);
    }
    return removed;
  }

  /**
   * Removes `adapters/{id}.gguf` files that no adapter record holds and that are older than the temp files'
   * limit (an import stores the file, then writes its record; a delete removes the record first).
   */
  private async sweepOrphanAdapters(): Promise<string[]> {
    const adapters = this.options.adapters;
    if (!adapters) return [];
    const cutoff = Date.now() - (this.options.tempMaxAgeMs ?? 60 * 60 * 1000);
    const dir = this.blobs.pathOf("adapters");
    const old: string[] = [];
    for (const name of await fsp.readdir(dir).catch(() => [] as string[])) {
      const id = /^(ad_[A-Za-z0-9]+)\.gguf$/.exec(name)?.[1];
      if (id === undefined) continue;
      const stat = await fsp.stat(path.join(dir, name)).catch(() => undefined);
      if (stat?.isFile() && stat.mtimeMs < cutoff) old.push(id);
    }
    const recorded = await adapters.recordedIds(old);
    const removed = old.filter((id) => !recorded.has(id)).map((id) => `adapters/${id}.gguf`);
    for (const key of removed) await this.blobs.remove(key);
    return removed;
  }

  /** Sweeps every `intervalMs` until `stop`. */
  start(): void {
    this.timer = setInterval(() => {
      this.sweeping ??= this.sweep()
        .catch((error: unknown) => this.log.warn({ err: error }, "sweep failed"))
        .finally(() => (this.sweeping = undefined));
    }, this.options.intervalMs);
    this.timer.unref();
  }

  /** Stops sweeping, once a sweep under way is done (it uses the database). */
  async stop(): Promise<void> {
    clearInterval(this.timer);
    await this.sweeping;
  }
}

async function exists(file: string): Promise<boolean> {
  return fsp.stat(file).then(
    () => true,
    () => false,
  );
}
