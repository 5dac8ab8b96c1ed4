import { monotonicFactory } from "ulid";

const nextUlid = monotonicFactory();

/**
 * Ids: a type prefix and a ULID, e.g. `ft_01JD3KTF...`. A ULID starts with its creation time
 * and is strictly increasing within this process, so `ORDER BY created_at, id` is creation order
 * even for rows made in the same millisecond (the run queue is first in, first out): the next id
 * in a millisecond is the previous one plus one. Ids are not secrets; every access checks the owner.
 */
export function newId(prefix: "ds" | "file" | "ft" | "key" | "eval" | "evalrun" | "ad"): string {
  return `${prefix}_${nextUlid()}`;
}
