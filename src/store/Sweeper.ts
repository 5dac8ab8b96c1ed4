import fsp from "node:fs/promises";
import type { Logger } from "pino";
import type { BlobStore } from "./BlobStore.ts";
import type { RunRepository } from "./RunRepository.ts";

/** What one sweep removed. */
export interface SweepReport {
  /** Temp files (uploads cut off by a crash). */
  tempFiles: string[];
  /** Run directories removed whole: of FAILED and CANCELLED runs, and of runs that no longer exist. */
  runDirs: string[];
  /** `work` and `checkpoint` directories of runs that do not need them. */
  workDirs: string[];
}

export interface SweeperOptions {
  /** Time between sweeps. */
  intervalMs: number;
  /** Temp files untouched for this long are leftovers. Defaults to an hour. */
  tempMaxAgeMs?: number;
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
    const removed = report.tempFiles.length + report.runDirs.length + report.workDirs.length;
    if (removed > 0)
      this.log.info(
        { tempFiles: report.tempFiles.length, runDirs: report.runDirs, workDirs: report.workDirs },
        `swept ${removed} leftovers: ${report.tempFiles.length} temp files, ${report.runDirs.length} run directories, ` +
          `${report.workDirs.length} work directories`,
      );
    return report;
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
