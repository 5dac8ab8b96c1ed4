/**
 * A job's samples, read as a stream, and their tokens kept on disk: the trainer's memory does not grow
 * with the dataset. A {@link TokenStore} holds two files in the job's work directory (the token ids, and
 * whether each is trained on) and in memory only where each sample starts (8 bytes per sample); a
 * window's samples are read back when it is trained.
 */
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import type { TrainingSample } from "./trainerJob.ts";
import type { TokenizedSample } from "./packWindows.ts";

/**
 * The samples of a list, or of a JSONL file of `{"sample": …}` objects (read line by line); `field` reads
 * another field of the lines instead (a preference example's `rejected`). Defaults to `"sample"`.
 */
export async function* jobSamples(
  source: readonly TrainingSample[] | string,
  field: "sample" | "rejected" = "sample",
): AsyncGenerator<TrainingSample> {
  if (typeof source !== "string") {
    yield* source;
    return;
  }
  const stream = fs.createReadStream(source, { encoding: "utf8" });
  try {
    let line = 0;
    for await (const text of readline.createInterface({ input: stream, crlfDelay: Infinity })) {
      line += 1;
      if (text === "") continue;
      const sample = (JSON.parse(text) as Partial<Record<typeof field, TrainingSample>>)[field];
      if (typeof sample !== "string" && !Array.isArray(sample))
        throw new Error(`trainer: line ${line} of ${source} has no "${field}"`);
      yield sample;
    }
  } finally {
    stream.destroy();
  }
}

/** Tokens buffered before a write. */
const BUFFER_TOKENS = 1 << 16;

/** Tokenized samples on disk, appended once and then read back by index. */
export class TokenStore {
  private starts = new Float64Array(1024);
  private count = 0;
  private total = 0;
  private readonly tokensFd: number;
  private readonly trainedFd: number;
  private readonly tokenBuffer = new Int32Array(BUFFER_TOKENS);
  private readonly trainedBuffer = new Uint8Array(BUFFER_TOKENS);
  private buffered = 0;
  /** Tokens on disk. */
  private written = 0;
  private readonly files: string[];

  /** Creates (or empties) `dir/name.tokens` and `dir/name.trained`. */
  constructor(dir: string, name: string) {
    this.files = [path.join(dir, `${name}.tokens`), path.join(dir, `${name}.trained`)];
    this.tokensFd = fs.openSync(this.files[0]!, "w+");
    this.trainedFd = fs.openSync(this.files[1]!, "w+");
  }

  /** Samples stored. */
  get size(): number {
    return this.count;
  }

  /** Tokens stored. */
  get tokens(): number {
    return this.total;
  }

  append(sample: TokenizedSample): void {
    if (this.count + 1 >= this.starts.length) {
      const grown = new Float64Array(this.starts.length * 2);
      grown.set(this.starts);
      this.starts = grown;
    }
    const n = sample.tokens.length;
    if (this.buffered + n > BUFFER_TOKENS) this.flush();
    if (n > BUFFER_TOKENS) this.write(sample.tokens, sample.trained);
    else {
      this.tokenBuffer.set(sample.tokens, this.buffered);
      this.trainedBuffer.set(sample.trained, this.buffered);
      this.buffered += n;
    }
    this.total += n;
    this.count += 1;
    this.starts[this.count] = this.total;
  }

  /** Writes what is buffered; call once every sample is appended. */
  flush(): void {
    if (this.buffered === 0) return;
    this.write(this.tokenBuffer.subarray(0, this.buffered), this.trainedBuffer.subarray(0, this.buffered));
    this.buffered = 0;
  }

  /** Tokens of sample `index`. */
  length(index: number): number {
    return this.starts[index + 1]! - this.starts[index]!;
  }

  /** Sample `index`, read from disk. */
  read(index: number): TokenizedSample {
    if (index < 0 || index >= this.count) throw new RangeError(`TokenStore: no sample ${index}`);
    this.flush();
    const start = this.starts[index]!;
    const n = this.length(index);
    const tokens = new Int32Array(n);
    const trained = new Uint8Array(n);
    readFully(this.tokensFd, new Uint8Array(tokens.buffer), start * 4);
    readFully(this.trainedFd, trained, start);
    return { tokens, trained };
  }

  /** Closes and removes the files. */
  dispose(): void {
    for (const fd of [this.tokensFd, this.trainedFd])
      try {
        fs.closeSync(fd);
      } catch {
        // already closed
      }
    for (const file of this.files) fs.rmSync(file, { force: true });
  }

  /** Writes at the end of what is on disk. */
  private write(tokens: Int32Array, trained: Uint8Array): void {
    const at = this.written;
    writeFully(this.tokensFd, new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength), at * 4);
    writeFully(this.trainedFd, trained, at);
    this.written += tokens.length;
  }
}

function writeFully(fd: number, bytes: Uint8Array, position: number): void {
  for (let done = 0; done < bytes.length;)
    done += fs.writeSync(fd, bytes, done, bytes.length - done, position + done);
}

function readFully(fd: number, into: Uint8Array, position: number): void {
  for (let done = 0; done < into.length;) {
    const read = fs.readSync(fd, into, done, into.length - done, position + done);
    if (read === 0) throw new Error("TokenStore: the token file ended early");
    done += read;
  }
}
