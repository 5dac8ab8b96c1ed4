import type { RunStats } from "./api.ts";

/**
 * The run's stats after a `stats` event: its fields replace the old ones, and its loss points (only the
 * new ones) are appended, unless `first` (a stream's first event replays them all) or `seriesReset`.
 */
export function mergeStats(previous: RunStats, event: RunStats, first: boolean): RunStats {
  const replace = first || event.seriesReset === true;
  const { seriesReset: _reset, ...fields } = event;
  return {
    ...previous,
    ...fields,
    lossSeries: replace
      ? (event.lossSeries ?? [])
      : [...(previous.lossSeries ?? []), ...(event.lossSeries ?? [])],
    evalLossSeries: replace
      ? (event.evalLossSeries ?? [])
      : [...(previous.evalLossSeries ?? []), ...(event.evalLossSeries ?? [])],
  };
}
