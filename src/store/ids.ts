import { monotonicFactory } from "ulid";

const nextUlid = monotonicFactory();

/**
 * Ids: a type prefix and a ULID, e.g. `ft_01JD3KTF...`. A ULID starts with its creation time
 * and is strictly increasing within this process, so `ORDER BY created_at, id` is creation order
 * even for rows made in the same millisecond (the run queue is first in, first out). Its 80
 * random bits keep ids unguessable across processes; access still checks the owner.
 */
export function newId(prefix: "ds" | "file" | "ft" | "key"): string {
  return `${prefix}_${nextUlid()}`;
}
