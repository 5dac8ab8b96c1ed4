import type { Command } from "commander";
import { loadConfig, type Config } from "../config.ts";
import { ConduitClient } from "../client/ConduitClient.ts";

/** Exit codes: 0 ok, 1 failure, 2 usage or invalid input, 3 not found, 4 bad or missing key, 5 conflict. */
export const exitCodes = { failure: 1, usage: 2, notFound: 3, unauthorized: 4, conflict: 5 } as const;

/** A failure the CLI reports with a specific exit code. */
export class CliError extends Error {
  constructor(
    message: string,
    readonly exitCode: number = exitCodes.failure,
    /** The string code of `--json` errors (like the API's); defaults to one for the exit code. */
    readonly code?: string,
  ) {
    super(message);
    this.name = "CliError";
  }
}

export interface GlobalOptions {
  url?: string;
  key?: string;
  json?: boolean;
}

/** What every command gets: the config, an HTTP client, and output helpers honouring `--json`. */
export class CliContext {
  readonly config: Config;

  constructor(private readonly program: Command) {
    this.config = loadConfig();
  }

  get options(): GlobalOptions {
    return this.program.opts<GlobalOptions>();
  }

  get json(): boolean {
    return this.options.json === true;
  }

  client(): ConduitClient {
    const key = this.options.key ?? this.config.apiKey;
    if (!key) throw new CliError("no API key: pass --key or set CONDUIT_API_KEY", exitCodes.unauthorized);
    return new ConduitClient({
      baseUrl: this.options.url ?? this.config.serverUrl,
      key,
      // A busy server (a full queue, a model loading) says when to come back: the command waits and says so.
      onRetry: (error, seconds) => console.error(`${error.message}; retrying in ${seconds} s`),
    });
  }

  /** JSON for scripts (one document per line, so streams of them stay parseable), else the human form. */
  print(data: unknown, human: () => void): void {
    if (this.json) console.log(JSON.stringify(data));
    else human();
  }
}

/** Aligned columns for listings. */
export function table(rows: string[][]): string {
  const widths: number[] = [];
  for (const row of rows) row.forEach((cell, i) => (widths[i] = Math.max(widths[i] ?? 0, cell.length)));
  return rows
    .map((row) =>
      row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i] ?? 0))).join("  "),
    )
    .join("\n");
}

/** A scalar as `fields` prints it: text on one line (line breaks as `⏎`), anything else as JSON. */
function scalar(value: unknown): string {
  return typeof value === "string" ? value.replace(/\r?\n/g, "⏎") : JSON.stringify(value);
}

/** Whether a list prints on one line: short scalars only. */
function inline(list: unknown[]): boolean {
  return (
    list.every((item) => item === null || typeof item !== "object") && scalar(list.join(", ")).length <= 80
  );
}

/**
 * An object as aligned `key: value` lines: nested objects indented under their key, lists of short scalars on
 * one line (comma-separated), other lists one item a line.
 */
export function fields(object: object, indent = ""): string[] {
  const entries: [string, unknown][] = Object.entries(object);
  const keys = entries.map(([key]) => key);
  const width = Math.max(0, ...keys.map((key) => key.length)) + 1;
  const lines: string[] = [];
  for (const [key, value] of entries) {
    const label = `${indent}${`${key}:`.padEnd(width)}`;
    if (Array.isArray(value) && value.length > 0 && !inline(value)) {
      lines.push(`${indent}${key}:`);
      for (const item of value)
        if (item !== null && typeof item === "object" && !Array.isArray(item)) {
          const [first = "", ...rest] = fields(item, `${indent}    `);
          lines.push(`${indent}  - ${first.trimStart()}`, ...rest);
        } else lines.push(`${indent}  - ${scalar(item)}`);
    } else if (Array.isArray(value))
      lines.push(`${label} ${value.length === 0 ? "[]" : value.map(scalar).join(", ")}`);
    else if (value !== null && typeof value === "object" && Object.keys(value).length > 0)
      lines.push(`${indent}${key}:`, ...fields(value, `${indent}  `));
    else lines.push(`${label} ${value !== null && typeof value === "object" ? "{}" : scalar(value)}`);
  }
  return lines;
}

/** `--limit` and `--offset` as the API's page query (the server checks their range). */
export function page(opts: { limit: string; offset: string }): { limit: number; offset: number } {
  const limit = Number(opts.limit);
  const offset = Number(opts.offset);
  if (!Number.isInteger(limit) || !Number.isInteger(offset))
    throw new CliError("--limit and --offset must be integers", exitCodes.usage);
  return { limit, offset };
}
