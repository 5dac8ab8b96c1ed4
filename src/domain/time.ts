/** Timestamps on the wire and in the database: `YYYY-MM-DD HH:MM:SS.mmm`, UTC. Sorts as text. */
export function timestamp(date: Date = new Date()): string {
  return date.toISOString().replace("T", " ").slice(0, 23);
}

/**
 * Milliseconds since the epoch of a {@link timestamp}. The text names no zone and means UTC: `Date.parse` of it
 * as it is would read local time, hours off on a server not set to UTC. `NaN` when it is not a timestamp.
 */
export function parseTimestamp(text: string): number {
  return Date.parse(`${text.replace(" ", "T")}Z`);
}
