import fs from "node:fs";

/**
 * Which version of a file is at `file` now, as a string that changes whenever its content may have: another
 * inode (a file renamed over it), another size, modification time or change time (written in place, even by
 * `cp -p` or `touch -r`, which set the modification time back but cannot set the change time). One `stat`,
 * a few microseconds: cheap enough before every use. `undefined` when there is no file.
 */
export function fileIdentity(file: string): string | undefined {
  let stat: fs.Stats | undefined;
  try {
    stat = fs.statSync(file, { throwIfNoEntry: false });
  } catch {
    return undefined;
  }
  return stat?.isFile() ? identityOf(stat) : undefined;
}

/** {@link fileIdentity} of a `stat` already made. */
export function identityOf(stat: fs.Stats): string {
  return `${stat.dev}:${stat.ino}:${stat.size}:${stat.mtimeMs}:${stat.ctimeMs}`;
}

/** What happened between two {@link fileIdentity} values of one path, in words. */
export function describeFileChange(before: string, after: string | undefined): string {
  if (after === undefined) return "was removed";
  const [dev, ino, size] = before.split(":");
  const [devNow, inoNow, sizeNow] = after.split(":");
  if (dev !== devNow || ino !== inoNow) return "was replaced by another file";
  if (size !== sizeNow) return `was rewritten in place (${size} bytes, now ${sizeNow})`;
  return "was rewritten in place";
}
