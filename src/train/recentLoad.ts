import fs from "node:fs";
import os from "node:os";

/**
 * How many threads want a core now, averaged over the last ~20 seconds: the kernel's count of threads running or
 * ready to run (`procs_running` in /proc/stat, less the one reading it), sampled every `everyMs` and averaged
 * exponentially. The 1-minute load average weighs a load that began 30 seconds ago at 40 % (and one that ended
 * as long ago at 60 %), so an estimate made right after a chat load began expected cores that were not there.
 * Where /proc/stat cannot be read, or before the first samples, it is the 1-minute load average.
 */
export class RecentLoad {
  private average: number | undefined;
  private samples = 0;
  private readonly timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly read: () => number | undefined = runnableThreads,
    everyMs = 2000,
    private readonly windowMs = 20_000,
  ) {
    this.sample(everyMs);
    if (this.average === undefined) return;
    this.timer = setInterval(() => this.sample(everyMs), everyMs);
    this.timer.unref();
  }

  /** Runnable threads besides the reader: the recent average once it has 3 samples, else the 1-minute average. */
  current(): number {
    return this.average !== undefined && this.samples >= 3 ? this.average : os.loadavg()[0]!;
  }

  stop(): void {
    clearInterval(this.timer);
  }

  /** Adds a sample: its weight is the share of the window one interval is. */
  sample(everyMs: number): void {
    const now = this.read();
    if (now === undefined) return;
    const weight = Math.min(1, everyMs / this.windowMs);
    this.average = this.average === undefined ? now : this.average + weight * (now - this.average);
    this.samples++;
  }
}

/** Threads running or runnable now, less the one reading (Linux's /proc/stat); undefined where it cannot be read. */
function runnableThreads(): number | undefined {
  try {
    const match = /^procs_running (\d+)$/m.exec(fs.readFileSync("/proc/stat", "latin1"));
    return match ? Math.max(0, Number(match[1]) - 1) : undefined;
  } catch {
    return undefined;
  }
}
