import fsp from "node:fs/promises";

export interface DiskSpace {
  /** Bytes the server may still write (what `df` shows as available). */
  freeBytes: number;
  totalBytes: number;
}

/** The space on the disk that holds `dir`. */
export async function diskSpace(dir: string): Promise<DiskSpace> {
  const stats = await fsp.statfs(dir);
  return { freeBytes: stats.bavail * stats.bsize, totalBytes: stats.blocks * stats.bsize };
}
