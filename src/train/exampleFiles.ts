/**
 * A run's examples on disk. The scheduler streams the dataset's pairs through `prepareExample` into
 * `train.jsonl` and `validation.jsonl` in the run's work directory, one `{"input","output","sample"}`
 * line per example; the trainer reads the samples from there (`samplesFile`), and the run's
 * `examples.jsonl` is written from them once it ends. Nothing holds the dataset in memory: the
 * held-out split keeps a few bytes per pair.
 */
import fs from "node:fs";
import fsp from "node:fs/promises";
import path from "node:path";
import readline from "node:readline";
import type { DatasetService } from "../datasets/DatasetService.ts";
import type { IoPair } from "../datasets/ioPairs.ts";
import type { ModelRef } from "../model/types.ts";
import { seededRandom, shuffledOrder } from "../random.ts";
import { prepareExample, type PreparedExample, type SampleOptions } from "./samples.ts";

export interface ExampleFiles {
  /** The training examples, in upload order. */
  train: string;
  trainCount: number;
  /** The validation examples; `null` when there are none. */
  validation: string | null;
  validationCount: number;
  /** Where the validation examples came from, for the run's log. */
  validationSource: "file" | "held out" | "none";
  /** Examples whose answer could not be told apart from the prompt in the template's text (trained in full). */
  unsplit: number;
}

/** Appends lines to a file, waiting when the stream's buffer is full. */
export class LineWriter {
  private readonly out: fs.WriteStream;
  private failed: Error | undefined;

  constructor(readonly file: string) {
    this.out = fs.createWriteStream(file);
    this.out.on("error", (error) => (this.failed ??= error));
  }

  async write(line: string): Promise<void> {
    if (this.failed) throw this.failed;
    if (!this.out.write(`${line}\n`))
      await new Promise<void>((resolve) => {
        const done = () => {
          this.out.off("drain", done);
          this.out.off("error", done);
          resolve();
        };
        this.out.once("drain", done);
        this.out.once("error", done);
      });
    if (this.failed) throw this.failed;
  }

  /** Flushes and closes; throws the first write error. */
  close(): Promise<void> {
    return new Promise<void>((resolve, reject) =>
      this.out.end((error?: Error | null) => {
        const failed = this.failed ?? error ?? undefined;
        if (failed) reject(failed);
        else resolve();
      }),
    );
  }

  destroy(): void {
    this.out.destroy();
  }
}

/** The lines of a text file, one at a time (blank lines skipped). */
export async function* fileLines(file: string): AsyncGenerator<string> {
  const stream = fs.createReadStream(file, { encoding: "utf8" });
  try {
    for await (const line of readline.createInterface({ input: stream, crlfDelay: Infinity }))
      if (line !== "") yield line;
  } finally {
    stream.destroy();
  }
}

/** The examples of a file written by {@link writeExampleFiles}, in order. */
export async function* readExampleFile(file: string): AsyncGenerator<PreparedExample> {
  for await (const line of fileLines(file)) yield JSON.parse(line) as PreparedExample;
}

/**
 * Formats a run's pairs into `dir/train.jsonl` and, when there is a validation set, `dir/validation.jsonl`:
 * the pairs of the validation file, or (without one, and with at least `minPairsForEval` pairs) a seeded
 * `evalFraction` of the dataset's pairs, the same ones on every attempt. Training examples keep their
 * upload order.
 */
export async function writeExampleFiles(
  datasets: DatasetService,
  base: ModelRef,
  options: SampleOptions,
  dir: string,
): Promise<ExampleFiles> {
  await fsp.mkdir(dir, { recursive: true });
  const train = path.join(dir, "train.jsonl");
  const validation = path.join(dir, "validation.jsonl");
  let unsplit = 0;
  const writeTo = async (file: string, pairs: AsyncIterable<IoPair>): Promise<number> => {
    const out = new LineWriter(file);
    let count = 0;
    try {
      for await (const pair of pairs) {
        const { example, split } = await prepareExample(base, options, pair);
        if (!split) unsplit += 1;
        await out.write(JSON.stringify(example));
        count += 1;
      }
      await out.close();
    } finally {
      out.destroy();
    }
    return count;
  };

  if (options.validationFileId !== null) {
    const trainCount = await writeTo(
      train,
      datasets.pairs(options.userId, options.datasetId, options.validationFileId),
    );
    const validationCount = await writeTo(
      validation,
      datasets.filePairs(options.userId, options.validationFileId, "validationFileID"),
    );
    return { train, trainCount, validation, validationCount, validationSource: "file", unsplit };
  }
  const all = path.join(dir, "all.jsonl");
  const count = await writeTo(all, datasets.pairs(options.userId, options.datasetId));
  if (count < options.minPairsForEval || options.evalFraction <= 0) {
    await fsp.rename(all, train);
    return {
      train,
      trainCount: count,
      validation: null,
      validationCount: 0,
      validationSource: "none",
      unsplit,
    };
  }
  // The same seed holds out the same pairs on every attempt.
  const held = new Uint8Array(count);
  const heldCount = Math.max(1, Math.floor(count * options.evalFraction));
  for (const index of shuffledOrder(count, seededRandom(options.seed)).slice(0, heldCount)) held[index] = 1;
  const trainOut = new LineWriter(train);
  const validationOut = new LineWriter(validation);
  try {
    let index = 0;
    for await (const line of fileLines(all)) await (held[index++] ? validationOut : trainOut).write(line);
    await trainOut.close();
    await validationOut.close();
  } finally {
    trainOut.destroy();
    validationOut.destroy();
    await fsp.rm(all, { force: true });
  }
  return {
    train,
    trainCount: count - heldCount,
    validation,
    validationCount: heldCount,
    validationSource: "held out",
    unsplit,
  };
}
