import { isUtf8 } from "node:buffer";
import fs from "node:fs";
import fsp from "node:fs/promises";
import { pipeline, Readable } from "node:stream";
import { parse as parseCsv } from "csv-parse";
import type { ChatRole } from "../model/types.ts";

/**
 * IO-pair files: JSONL (one object a line), a JSON array of objects, or CSV with a header.
 * Objects carry `input`/`output` (or `prompt`/`completion`), or a chat example as OpenAI's
 * fine-tuning takes it, `{"messages": [{role, content}, ...]}`; CSV has `input,output` (or
 * `prompt,completion`) columns. A preference example (what preference tuning, DPO, trains on) has a
 * prompt and two answers: OpenAI's `{"input": {"messages"}, "preferred_output": [message],
 * "non_preferred_output": [message]}`, or Conduit's `{"input" (or "prompt") or "messages", "preferred"
 * (or "chosen"), "non_preferred" (or "rejected")}`, with CSV columns `input,preferred,non_preferred`. Files are read as streams, so validation and training never
 * hold a whole file in memory (a JSON array's items are cut out and parsed one at a time).
 */
export type IoFormat = "jsonl" | "json" | "csv";
export const ioFormats: readonly IoFormat[] = ["jsonl", "json", "csv"];

/** One turn of a chat example. */
export interface ChatTurn {
  role: ChatRole;
  content: string;
  /** On an assistant turn, OpenAI's `weight`: `0` keeps it as context only (not trained). Defaults to `1`. */
  weight?: 0 | 1;
}

export interface IoPair {
  /** For a chat example: the last user turn before its last assistant turn (what previews and examples show). */
  input: string;
  /** For a chat example: its last assistant turn. */
  output: string;
  /** 1-based line of the pair in its file. */
  line: number;
  /** A chat example's whole conversation (every assistant turn of weight 1 is trained); absent for an IO pair. */
  messages?: ChatTurn[];
  /**
   * A preference example's non-preferred answer; `output` is its preferred one (and `messages`, when the prompt
   * is a conversation, ends with the preferred answer). Absent for an IO pair or a chat example.
   */
  rejected?: string;
}

/** Whether a pair is a preference example (has a non-preferred answer). */
export function isPreference(pair: IoPair): pair is IoPair & { rejected: string } {
  return pair.rejected !== undefined;
}

/** A bad pair or a syntax error, with the line it is on. */
export class IoPairError extends Error {
  constructor(
    readonly line: number,
    readonly reason: string,
  ) {
    super(`line ${line}: ${reason}`);
    this.name = "IoPairError";
  }
}

/** Picks the format from the file name's extension, else from the first non-blank byte. */
export async function detectFormat(filePath: string, name: string): Promise<IoFormat> {
  const ext = name.toLowerCase().match(/\.(jsonl|ndjson|json|csv)$/)?.[1];
  if (ext === "jsonl" || ext === "ndjson") return "jsonl";
  if (ext === "json" || ext === "csv") return ext;
  const handle = await fsp.open(filePath, "r");
  try {
    const { buffer, bytesRead } = await handle.read(Buffer.alloc(4096), 0, 4096, 0);
    const first = buffer
      .subarray(0, bytesRead)
      .toString("utf8")
      .replace(/^\uFEFF/, "")
      .trimStart()[0];
    return first === "[" ? "json" : first === "{" ? "jsonl" : "csv";
  } finally {
    await handle.close();
  }
}

function field(record: Record<string, unknown>, names: [string, string], line: number): string {
  const [name, alias] = names;
  const value = record[name] ?? record[alias];
  if (value === undefined || value === null) throw new IoPairError(line, `missing "${name}" (or "${alias}")`);
  if (typeof value !== "string")
    throw new IoPairError(line, `"${name}" must be a string, got ${typeof value}`);
  if (value.length === 0) throw new IoPairError(line, `"${name}" is empty`);
  // Never meaningful in text, and refused in every name and prompt too.
  if (value.includes("\u0000")) throw new IoPairError(line, `"${name}" contains a NUL character`);
  if (!value.isWellFormed()) throw loneSurrogate(line, `"${name}"`);
  return value;
}

function toPair(value: unknown, line: number): IoPair {
  if (typeof value !== "object" || value === null || Array.isArray(value))
    throw new IoPairError(line, 'expected an object with "input" and "output" (or "messages")');
  const record = value as Record<string, unknown>;
  if (record.preferred_output !== undefined || record.non_preferred_output !== undefined)
    return toOpenAiPreference(record, line);
  if (preferenceFields.some((name) => record[name] !== undefined)) return toPreference(record, line);
  if (record.messages !== undefined) return toChatExample(record, line);
  return {
    input: field(record, ["input", "prompt"], line),
    output: field(record, ["output", "completion"], line),
    line,
  };
}

const chatRoles: Record<string, ChatRole> = {
  system: "system",
  developer: "system",
  user: "user",
  assistant: "assistant",
};

/** A message's text: a string, or OpenAI's text parts (`[{type: "text", text}]`) joined. */
function turnContent(value: unknown, at: string, line: number): string {
  let text: string;
  if (typeof value === "string") text = value;
  else if (Array.isArray(value)) {
    text = "";
    for (const part of value as unknown[]) {
      const { type, text: partText } = (part ?? {}) as { type?: unknown; text?: unknown };
      if (type !== "text" || typeof partText !== "string")
        throw new IoPairError(
          line,
          `${at}.content: only text parts ({"type": "text", "text"}) can be trained on`,
        );
      text += partText;
    }
  } else
    throw new IoPairError(
      line,
      `${at}.content must be a string (or text parts), got ${value === null ? "null" : typeof value}`,
    );
  if (text.includes("\u0000")) throw new IoPairError(line, `${at}.content contains a NUL character`);
  if (!text.isWellFormed()) throw loneSurrogate(line, `${at}.content`);
  return text;
}

/**
 * A chat example, OpenAI's fine-tuning format: `messages` of roles `system` (or `developer`), `user` and
 * `assistant`, with text contents; an assistant turn may carry `weight` 0 (context, not trained) or 1.
 * Tool calls, function calls and tool definitions cannot be trained here and are refused, naming them.
 */
function toChatExample(record: Record<string, unknown>, line: number): IoPair {
  if (record.input !== undefined || record.output !== undefined)
    throw new IoPairError(line, 'an example has either "messages" or "input" and "output", not both');
  const turns = chatTurns(record, "", line);
  const last = turns.findLastIndex((turn) => turn.role === "assistant" && turn.weight !== 0);
  if (last < 0) throw new IoPairError(line, '"messages" has no assistant turn to train on (of weight 1)');
  const answer = turns[last] as ChatTurn;
  if (answer.content.length === 0) throw new IoPairError(line, `messages[${last}].content is empty`);
  const question = turns.slice(0, last).findLast((turn) => turn.role === "user");
  return { input: question?.content ?? "", output: answer.content, line, messages: turns };
}

/**
 * The `messages` of `record` (at `prefix`, as the file spells the path: `""` or `"input."`) as turns: roles
 * `system` (or `developer`), `user` and `assistant`, text contents, an assistant turn's `weight` 0 or 1. Tool
 * calls, function calls and tool definitions cannot be trained here and are refused, naming them.
 */
function chatTurns(record: Record<string, unknown>, prefix: string, line: number): ChatTurn[] {
  for (const key of ["tools", "functions"])
    if (record[key] !== undefined && !(Array.isArray(record[key]) && record[key].length === 0))
      throw new IoPairError(line, `"${prefix}${key}": tool and function calls cannot be trained on`);
  const messages = record.messages;
  if (!Array.isArray(messages) || messages.length === 0)
    throw new IoPairError(line, `"${prefix}messages" must be a non-empty array of {role, content}`);
  return (messages as unknown[]).map((message, index) =>
    chatTurn(message, `${prefix}messages[${index}]`, line),
  );
}

function chatTurn(message: unknown, at: string, line: number): ChatTurn {
  if (typeof message !== "object" || message === null || Array.isArray(message))
    throw new IoPairError(line, `${at} must be an object with "role" and "content"`);
  const m = message as Record<string, unknown>;
  const role = typeof m.role === "string" ? chatRoles[m.role] : undefined;
  if (role === undefined)
    throw new IoPairError(
      line,
      `${at}.role must be "system", "developer", "user" or "assistant"` +
        (m.role === "tool" || m.role === "function" ? " (tool and function calls cannot be trained on)" : ""),
    );
  for (const key of ["tool_calls", "function_call", "name"])
    if (m[key] !== undefined && !(key === "tool_calls" && Array.isArray(m[key]) && m[key].length === 0))
      throw new IoPairError(line, `${at}.${key} is not supported`);
  const turn: ChatTurn = { role, content: turnContent(m.content, at, line) };
  if (m.weight !== undefined) {
    if (role !== "assistant") throw new IoPairError(line, `${at}.weight is only for assistant turns`);
    if (m.weight !== 0 && m.weight !== 1) throw new IoPairError(line, `${at}.weight must be 0 or 1`);
    turn.weight = m.weight;
  }
  return turn;
}

/** Conduit's names of a preference example's answers, each with its alias. */
const preferenceNames: [[string, string], [string, string]] = [
  ["preferred", "chosen"],
  ["non_preferred", "rejected"],
];
const preferenceFields = preferenceNames.flat();

/**
 * A preference example from its prompt (the context turns, ending with the user's) and its two answers: the
 * preferred answer closes `messages` as the assistant's turn, so that a supervised run on the same file trains
 * the preferred answers. Two equal answers teach nothing and are refused.
 */
function preference(
  context: ChatTurn[] | undefined,
  input: string,
  preferred: string,
  rejected: string,
  names: [string, string],
  line: number,
): IoPair {
  if (preferred === rejected)
    throw new IoPairError(
      line,
      `"${names[0]}" and "${names[1]}" are the same answer; a preference needs two`,
    );
  if (context !== undefined && context.at(-1)?.role === "assistant")
    throw new IoPairError(
      line,
      `the prompt's messages end with an assistant turn; they end with the turn the answers reply to`,
    );
  const pair: IoPair = { input, output: preferred, rejected, line };
  if (context !== undefined) pair.messages = [...context, { role: "assistant", content: preferred }];
  return pair;
}

/** The last user turn of a prompt's turns (what previews show as the input). */
function lastUserTurn(turns: readonly ChatTurn[]): string {
  return turns.findLast((turn) => turn.role === "user")?.content ?? "";
}

/** Conduit's preference example: `input` (or `prompt`) or `messages`, `preferred` and `non_preferred`. */
function toPreference(record: Record<string, unknown>, line: number): IoPair {
  const [preferredNames, rejectedNames] = preferenceNames;
  const preferred = field(record, preferredNames, line);
  const rejected = field(record, rejectedNames, line);
  if (record.output !== undefined || record.completion !== undefined)
    throw new IoPairError(
      line,
      'a preference example has "preferred" and "non_preferred" answers, not "output" (or "completion")',
    );
  const names: [string, string] = [preferredNames[0], rejectedNames[0]];
  if (record.messages !== undefined) {
    if (record.input !== undefined || record.prompt !== undefined)
      throw new IoPairError(line, 'a preference example has either "messages" or "input", not both');
    const turns = chatTurns(record, "", line);
    return preference(turns, lastUserTurn(turns), preferred, rejected, names, line);
  }
  return preference(undefined, field(record, ["input", "prompt"], line), preferred, rejected, names, line);
}

/**
 * OpenAI's preference example (its DPO fine-tuning format): `input` holds `messages` (and optionally empty
 * `tools`, `parallel_tool_calls`), `preferred_output` and `non_preferred_output` each one assistant message.
 */
function toOpenAiPreference(record: Record<string, unknown>, line: number): IoPair {
  const input = record.input;
  if (input === undefined || input === null)
    throw new IoPairError(line, 'missing "input" (an object with "messages")');
  if (typeof input !== "object" || Array.isArray(input))
    throw new IoPairError(line, '"input" must be an object with "messages"');
  const turns = chatTurns(input as Record<string, unknown>, "input.", line);
  const answer = (name: string): string => {
    const value = record[name];
    if (value === undefined || value === null) throw new IoPairError(line, `missing "${name}"`);
    if (!Array.isArray(value) || value.length !== 1)
      throw new IoPairError(line, `"${name}" must be a list of one assistant message`);
    const turn = chatTurn(value[0], `${name}[0]`, line);
    if (turn.role !== "assistant") throw new IoPairError(line, `${name}[0].role must be "assistant"`);
    if (turn.content.length === 0) throw new IoPairError(line, `${name}[0].content is empty`);
    return turn.content;
  };
  const preferred = answer("preferred_output");
  const rejected = answer("non_preferred_output");
  return preference(
    turns,
    lastUserTurn(turns),
    preferred,
    rejected,
    ["preferred_output", "non_preferred_output"],
    line,
  );
}

/**
 * JSON's `\ud800` escapes can spell a lone UTF-16 surrogate, which is not text (nor valid UTF-8 once written
 * out): refused as a JSON request body refuses it.
 */
function loneSurrogate(line: number, field: string): IoPairError {
  return new IoPairError(
    line,
    `${field} holds a lone UTF-16 surrogate (an unpaired \\ud800–\\udfff escape), which is not text`,
  );
}

function notUtf8(line: number): IoPairError {
  return new IoPairError(line, "invalid UTF-8 (save the file as UTF-8 text)");
}

function countNewlineBytes(bytes: Buffer): number {
  let count = 0;
  for (let at = bytes.indexOf(10); at !== -1; at = bytes.indexOf(10, at + 1)) count++;
  return count;
}

/** The first line of `bytes` (numbered from `firstLine`) that is not valid UTF-8. */
function badUtf8Line(bytes: Buffer, firstLine: number): number {
  let line = firstLine;
  for (let start = 0; start < bytes.length; line++) {
    const newline = bytes.indexOf(10, start);
    const end = newline === -1 ? bytes.length : newline;
    if (!isUtf8(bytes.subarray(start, end))) return line;
    start = end + 1;
  }
  return line;
}

/** Options of {@link readIoPairs}. */
export interface ReadOptions {
  /**
   * Largest pair in bytes (`CONDUIT_MAX_PAIR_BYTES`): a longer JSONL line, CSV line or record, or JSON
   * array item is an `IoPairError`, found before more than this much of it is held in memory. Defaults to
   * no limit.
   */
  maxPairBytes?: number;
}

function tooLong(line: number, limit: number): IoPairError {
  return new IoPairError(
    line,
    `the pair is longer than ${limit} bytes, the largest a pair may be (CONDUIT_MAX_PAIR_BYTES)`,
  );
}

/**
 * A file's bytes in pieces that end at a line end (but the last), each checked to be UTF-8, with
 * the number of its first line. Decoding would quietly turn invalid bytes into U+FFFD; this throws
 * an `IoPairError` naming the first line that has some. A newline byte is never part of a
 * multi-byte character, so pieces cut there are whole text. A line longer than `maxLineBytes` is an
 * `IoPairError` as soon as that many of its bytes are read.
 */
async function* utf8Pieces(
  filePath: string,
  maxLineBytes = Number.POSITIVE_INFINITY,
): AsyncGenerator<{ bytes: Buffer; line: number }> {
  let line = 1;
  const checked = (bytes: Buffer) => {
    if (!isUtf8(bytes)) throw notUtf8(badUtf8Line(bytes, line));
    const piece = { bytes, line };
    line += countNewlineBytes(bytes);
    return piece;
  };
  // The bytes after the last line end seen, kept as read so a long line is copied only once.
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  for await (const chunk of fs.createReadStream(filePath) as AsyncIterable<Buffer>) {
    const end = chunk.lastIndexOf(10);
    if (end === -1) {
      pending.push(chunk);
      pendingBytes += chunk.length;
      if (pendingBytes > maxLineBytes) throw tooLong(line, maxLineBytes);
      continue;
    }
    if (Number.isFinite(maxLineBytes)) {
      // Every line this chunk ends: the first one began in the pending bytes.
      let from = -pendingBytes;
      let lineOfChunk = line;
      for (let at = chunk.indexOf(10); at !== -1 && at <= end; at = chunk.indexOf(10, at + 1)) {
        if (at - from > maxLineBytes) throw tooLong(lineOfChunk, maxLineBytes);
        from = at + 1;
        lineOfChunk += 1;
      }
      if (chunk.length - end - 1 > maxLineBytes) throw tooLong(lineOfChunk, maxLineBytes);
    }
    const head = chunk.subarray(0, end + 1);
    yield checked(pending.length > 0 ? Buffer.concat([...pending, head]) : head);
    pending = end + 1 < chunk.length ? [chunk.subarray(end + 1)] : [];
    pendingBytes = chunk.length - end - 1;
  }
  if (pending.length > 0) yield checked(Buffer.concat(pending));
}

async function* utf8Bytes(filePath: string, maxLineBytes?: number): AsyncGenerator<Buffer> {
  for await (const piece of utf8Pieces(filePath, maxLineBytes)) yield piece.bytes;
}

/** A file's lines (without the line end), checked to be UTF-8, each with its 1-based number. */
async function* utf8Lines(
  filePath: string,
  maxLineBytes?: number,
): AsyncGenerator<{ text: string; line: number }> {
  for await (const piece of utf8Pieces(filePath, maxLineBytes)) {
    const lines = piece.bytes.toString("utf8").split("\n");
    // A piece that ends with a line end has nothing after it.
    if (lines.at(-1) === "") lines.pop();
    for (const [index, text] of lines.entries())
      yield { text: text.endsWith("\r") ? text.slice(0, -1) : text, line: piece.line + index };
  }
}

async function* readJsonl(filePath: string, options: ReadOptions): AsyncGenerator<IoPair> {
  for await (const { text, line } of utf8Lines(filePath, options.maxPairBytes)) {
    const trimmed = (line === 1 ? text.replace(/^\uFEFF/, "") : text).trim();
    if (trimmed === "") continue;
    let value: unknown;
    try {
      value = JSON.parse(trimmed);
    } catch (error) {
      throw new IoPairError(line, `invalid JSON (${(error as Error).message})`);
    }
    yield toPair(value, line);
  }
}

type JsonArrayState = "start" | "between" | "item" | "end";

/**
 * The items of a JSON array file, streamed: each top-level item's text is cut out as the file is read and
 * parsed alone, so memory holds one item at a time (at most `maxPairBytes` of it), never the whole file.
 * Errors name the line where the item (or the stray text) starts.
 */
async function* readJsonArray(filePath: string, options: ReadOptions): AsyncGenerator<IoPair> {
  const limit = options.maxPairBytes ?? Number.POSITIVE_INFINITY;
  const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: false });
  const notAnArray = (at: number) =>
    new IoPairError(at, 'a .json file must hold an array of {"input","output"} objects');
  let line = 1;
  /** Where the array is: before its `[`, between items, inside one, or after its `]`. */
  let state = "start" as JsonArrayState;
  let expectItem = false;
  let depth = 0;
  let inString = false;
  let escaped = false;
  let item: string[] = [];
  let itemChars = 0;
  let itemLine = 1;
  const finish = (): IoPair => {
    const text = item.join("");
    item = [];
    itemChars = 0;
    if (Buffer.byteLength(text) > limit) throw tooLong(itemLine, limit);
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (error) {
      throw new IoPairError(itemLine, `invalid JSON (${(error as Error).message})`);
    }
    return toPair(value, itemLine);
  };
  for await (const chunk of fs.createReadStream(filePath) as AsyncIterable<Buffer>) {
    let text: string;
    try {
      text = decoder.decode(chunk, { stream: true });
    } catch {
      throw notUtf8(badUtf8Line(chunk, line));
    }
    let from = 0;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c === 10) line++;
      if (state === "item") {
        if (inString) {
          if (escaped) escaped = false;
          else if (c === 92 /* \ */) escaped = true;
          else if (c === 34 /* " */) inString = false;
          continue;
        }
        if (c === 34) inString = true;
        else if (c === 123 /* { */ || c === 91 /* [ */) depth++;
        else if ((c === 125 /* } */ || c === 93) /* ] */ && depth > 0) depth--;
        else if ((c === 44 /* , */ || c === 93) && depth === 0) {
          item.push(text.slice(from, i));
          yield finish();
          state = c === 44 ? "between" : "end";
          expectItem = c === 44;
        }
        continue;
      }
      if (c === 32 || c === 10 || c === 13 || c === 9 || (c === 0xfeff && state === "start" && i === 0))
        continue;
      if (state === "start") {
        if (c !== 91) throw notAnArray(line);
        state = "between";
      } else if (state === "between") {
        if (c === 93 && !expectItem) state = "end";
        else if (c === 44 || c === 93) throw new IoPairError(line, "invalid JSON (an array item is missing)");
        else {
          state = "item";
          itemLine = line;
          from = i;
          i--; // the item's first character is read again, as part of it
        }
        expectItem = false;
      } else throw new IoPairError(line, "invalid JSON (text after the array's closing bracket)");
    }
    if (state === "item") {
      item.push(text.slice(from));
      itemChars += text.length - from;
      // A character is at least one byte: more characters than the limit are more bytes than it.
      if (itemChars > limit) throw tooLong(itemLine, limit);
    }
  }
  try {
    decoder.decode();
  } catch {
    throw notUtf8(line);
  }
  // (A cast: tsc narrows `state` by the last assignment it saw in the loop.)
  const last = state as JsonArrayState;
  if (last === "start") throw notAnArray(1);
  if (last !== "end") throw new IoPairError(line, "invalid JSON (the array is not closed)");
}

async function* readCsv(filePath: string, options: ReadOptions): AsyncGenerator<IoPair> {
  const limit = options.maxPairBytes ?? Number.POSITIVE_INFINITY;
  const parser = parseCsv({
    bom: true,
    columns: true,
    skip_empty_lines: true,
    info: true,
    relax_quotes: false,
    // In characters: a record quoted across lines stops growing there too.
    ...(Number.isFinite(limit) ? { max_record_size: limit } : {}),
  });
  // pipeline, not pipe: a line that is not UTF-8 (or too long) fails the parser with its IoPairError.
  pipeline(Readable.from(utf8Bytes(filePath, limit)), parser, () => undefined);
  let checkedHeader = false;
  try {
    for await (const { record, info } of parser as AsyncIterable<{
      record: Record<string, string>;
      info: { lines: number };
    }>) {
      if (!checkedHeader) {
        checkedHeader = true;
        const columns = Object.keys(record);
        const has = (names: readonly string[]) => names.some((name) => columns.includes(name));
        const hasInput = has(["input", "prompt"]);
        const hasPairs = hasInput && has(["output", "completion"]);
        const hasPreferences = hasInput && preferenceNames.every(has);
        if (!hasPairs && !hasPreferences)
          throw new IoPairError(
            1,
            'the CSV header must have "input" and "output" columns (or "input", "preferred" and "non_preferred")',
          );
      }
      yield toPair(record, info.lines);
    }
  } catch (error) {
    if (error instanceof IoPairError) throw error;
    const csvError = error as Error & { lines?: number; code?: string };
    if (csvError.code === "CSV_MAX_RECORD_SIZE") throw tooLong(csvError.lines ?? 1, limit);
    throw new IoPairError(csvError.lines ?? 1, `invalid CSV (${csvError.message})`);
  }
}

/** Streams the pairs of a stored file, validating each; throws `IoPairError` at the first bad one. */
export function readIoPairs(
  filePath: string,
  format: IoFormat,
  options: ReadOptions = {},
): AsyncGenerator<IoPair> {
  switch (format) {
    case "jsonl":
      return readJsonl(filePath, options);
    case "json":
      return readJsonArray(filePath, options);
    case "csv":
      return readCsv(filePath, options);
  }
}

/** Validates a whole file and counts its pairs. */
export async function countIoPairs(
  filePath: string,
  format: IoFormat,
  options: ReadOptions = {},
): Promise<number> {
  let count = 0;
  for await (const _pair of readIoPairs(filePath, format, options)) count++;
  return count;
}
