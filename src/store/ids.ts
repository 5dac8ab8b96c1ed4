import { randomBytes } from "node:crypto";

/** Opaque ids: a type prefix and 16 random bytes, e.g. `ds_3kTf...`. */
export function newId(prefix: "ds" | "file" | "ft" | "key"): string {
  return `${prefix}_${randomBytes(16).toString("base64url")}`;
}
