/** Timestamps on the wire and in the database: `YYYY-MM-DD HH:MM:SS.mmm`, UTC. Sorts as text. */
export function timestamp(date: Date = new Date()): string {
  return date.toISOString().replace("T", " ").slice(0, 23);
}
