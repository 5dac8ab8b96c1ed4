/** Display helpers: numbers, sizes, durations and the API's UTC timestamps. */

export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KB", "MB", "GB", "TB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

export function formatDuration(seconds: number | undefined): string {
  if (seconds === undefined || !Number.isFinite(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  const m = Math.floor((s % 3600) / 60);
  const rest = s % 60;
  if (h > 0) return `${h}h ${m}m`;
  if (m > 0) return `${m}m ${rest}s`;
  return `${rest}s`;
}

export function formatNumber(value: number | undefined, digits = 4): string {
  if (value === undefined || !Number.isFinite(value)) return "—";
  return Number(value.toPrecision(digits)).toString();
}

/** A share in [0, 1] as a percentage (`87.5 %`); `—` when there is none. */
export function formatShare(value: number | undefined): string {
  if (value === undefined || !Number.isFinite(value)) return "—";
  return `${Number((value * 100).toPrecision(3))} %`;
}

/** `2026-11-22 18:30:00.000` (UTC) in the reader's local time. */
export function formatTime(timestamp: string): string {
  const date = new Date(`${timestamp.replace(" ", "T")}Z`);
  return Number.isNaN(date.getTime()) ? timestamp : date.toLocaleString();
}

/** A config value in words: lists joined by commas, an object as `key: value` pairs, nothing as a dash. */
export function formatConfigValue(value: unknown): string {
  const text = Array.isArray(value)
    ? value.map(formatConfigValue).join(", ")
    : value !== null && typeof value === "object"
      ? Object.entries(value)
          .map(([key, inner]) => `${key}: ${formatConfigValue(inner)}`)
          .join(", ")
      : value === null || value === undefined
        ? ""
        : String(value);
  return text === "" ? "—" : text;
}

/**
 * A run's configuration as label and text, one row per setting; a setting that is an object (`jobRequest`: the
 * OpenAI face's training file, suffix, metadata) gives a row per field, labelled `jobRequest.trainingFileID`.
 */
export function configRows(config: Record<string, unknown>): [string, string][] {
  return Object.entries(config).flatMap(([key, value]): [string, string][] =>
    value !== null && typeof value === "object" && !Array.isArray(value)
      ? Object.entries(value).map(([inner, v]): [string, string] => [`${key}.${inner}`, formatConfigValue(v)])
      : [[key, formatConfigValue(value)]],
  );
}

/** One grader's score of one answer, as the dashboard shows it (a label model's label rather than its 0 or 1). */
export interface ShownScore {
  name: string;
  score: number;
  label?: string;
  error?: string;
  judgeAnswer?: string;
}

/** Scores of one answer, e.g. `exact_match 1 · similarity 0.82 · tone polite`; a grader that could not score, `?`. */
export function formatScores(scores: readonly ShownScore[]): string {
  return scores
    .map((s) => {
      const value =
        s.error !== undefined
          ? "?"
          : (s.label ?? (Number.isInteger(s.score) ? String(s.score) : s.score.toFixed(2)));
      return `${s.name} ${value}`;
    })
    .join(" · ");
}

/** What the model graders' judges answered and why a grader could not score, one line each (a tooltip). */
export function judgeNotes(scores: readonly ShownScore[]): string {
  return scores
    .flatMap((s) => [
      ...(s.judgeAnswer !== undefined ? [`${s.name}: ${s.judgeAnswer}`] : []),
      ...(s.error !== undefined ? [`${s.name}: ${s.error}`] : []),
    ])
    .join("\n");
}
