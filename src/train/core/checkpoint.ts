/**
 * A run's checkpoints on disk, so that a run re-queued after a restart resumes instead of retraining
 * from the base. `latest.gguf` (the adapter, or the whole F32 model) and `latest.json` are written at
 * every evaluation point and epoch end; the best weights by eval loss go to `best.f32` (LoRA: the
 * adapter's tensors, raw) or `best.gguf` (full). Files are written to a temp name and renamed, the JSON
 * last, so a crash mid-write leaves the previous checkpoint whole.
 */
import { createHash } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import type { TrainerJob } from "./trainerJob.ts";
import { jobSamples } from "./sampleStore.ts";

export interface CheckpointState {
  /** Identifies the job's settings and samples; a checkpoint of another job is ignored. */
  fingerprint: string;
  /** The epoch in progress (0-based) and how many of its windows are done. */
  epoch: number;
  window: number;
  step: number;
  best: { loss: number; epoch: number; step: number } | null;
  evalsSinceBest: number;
  /** The lowest eval loss so far (the best checkpoint's; early stopping measures drops from it). */
  lowestEvalLoss?: number;
  /** Names of the tensors in `best.f32`, in order (LoRA). */
  bestTensors: string[];
}

/** How many epoch-end checkpoints a run keeps (the newest), as OpenAI keeps its jobs' last three epochs. */
export const KEPT_CHECKPOINTS = 3;

/**
 * What a kept checkpoint's JSON says (its weights are `step-<step>.gguf` beside it: the LoRA adapter in the type the
 * run serves, so that it is served and downloaded as it is).
 */
export interface KeptCheckpoint {
  step: number;
  epoch: number;
  trainLoss: number;
  evalLoss?: number;
}

export class CheckpointDir {
  constructor(readonly dir: string) {}

  /** Where the kept epoch-end checkpoints are (`step-<n>.gguf` and `step-<n>.json`). */
  get keptDir(): string {
    return path.join(this.dir, "kept");
  }

  /**
   * Keeps the weights at an epoch's end (written with `save`, the JSON last) and removes the oldest past
   * {@link KEPT_CHECKPOINTS}. A resumed run that trains the same step again writes it again.
   */
  async writeKept(checkpoint: KeptCheckpoint, save: (file: string) => Promise<void> | void): Promise<void> {
    fs.mkdirSync(this.keptDir, { recursive: true });
    const base = path.join(this.keptDir, `step-${checkpoint.step}`);
    await atomically(`${base}.gguf`, save);
    await atomically(`${base}.json`, (file) => fs.writeFileSync(file, JSON.stringify(checkpoint)));
    for (const old of keptSteps(this.keptDir).slice(0, -KEPT_CHECKPOINTS)) {
      const name = path.join(this.keptDir, `step-${old}`);
      fs.rmSync(`${name}.json`, { force: true });
      fs.rmSync(`${name}.gguf`, { force: true });
    }
  }

  get latestWeights(): string {
    return path.join(this.dir, "latest.gguf");
  }
  get bestModel(): string {
    return path.join(this.dir, "best.gguf");
  }
  private get stateFile(): string {
    return path.join(this.dir, "latest.json");
  }
  private get bestValuesFile(): string {
    return path.join(this.dir, "best.f32");
  }

  /** The saved state when it belongs to this job and its weights are there. */
  read(fingerprint: string): CheckpointState | undefined {
    try {
      const state = JSON.parse(fs.readFileSync(this.stateFile, "utf8")) as CheckpointState;
      if (state.fingerprint !== fingerprint || !fs.existsSync(this.latestWeights)) return undefined;
      return state;
    } catch {
      return undefined;
    }
  }

  /** Writes the latest weights with `save(tempPath)`, then the state. */
  async writeLatest(state: CheckpointState, save: (file: string) => Promise<void> | void): Promise<void> {
    fs.mkdirSync(this.dir, { recursive: true });
    await atomically(this.latestWeights, save);
    await atomically(this.stateFile, (file) => fs.writeFileSync(file, JSON.stringify(state)));
  }

  async writeBestModel(save: (file: string) => Promise<void> | void): Promise<void> {
    fs.mkdirSync(this.dir, { recursive: true });
    await atomically(this.bestModel, save);
  }

  async writeBestValues(values: Map<string, Float32Array>): Promise<void> {
    fs.mkdirSync(this.dir, { recursive: true });
    await atomically(this.bestValuesFile, (file) => {
      const fd = fs.openSync(file, "w");
      try {
        for (const data of values.values())
          fs.writeSync(fd, new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
      } finally {
        fs.closeSync(fd);
      }
    });
  }

  /** The best LoRA values saved with `state` (sizes from `like`), or undefined. */
  readBestValues(
    state: CheckpointState,
    like: Map<string, Float32Array>,
  ): Map<string, Float32Array> | undefined {
    let bytes: Buffer;
    try {
      bytes = fs.readFileSync(this.bestValuesFile);
    } catch {
      return undefined;
    }
    const values = new Map<string, Float32Array>();
    let offset = 0;
    for (const name of state.bestTensors) {
      const size = like.get(name)?.length;
      if (size === undefined || offset + size * 4 > bytes.length) return undefined;
      values.set(
        name,
        new Float32Array(bytes.buffer.slice(bytes.byteOffset + offset, bytes.byteOffset + offset + size * 4)),
      );
      offset += size * 4;
    }
    return offset === bytes.length ? values : undefined;
  }
}

/** The steps of the kept checkpoints in `dir` (those whose JSON was written), oldest first. */
export function keptSteps(dir: string): number[] {
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return [];
  }
  return names
    .map((name) => /^step-(\d{1,9})\.json$/.exec(name)?.[1])
    .filter((step): step is string => step !== undefined)
    .map(Number)
    .sort((a, b) => a - b);
}

/**
 * What makes two jobs the same training: every setting that changes the weights, and the samples (read
 * as a stream when they are in files; a file gives the same fingerprint as the same samples in a list).
 */
export async function jobFingerprint(job: TrainerJob): Promise<string> {
  const hash = createHash("sha256");
  const {
    samples: _s,
    evalSamples: _e,
    samplesFile: _sf,
    evalSamplesFile: _ef,
    lossesFile: _l,
    maxTrainTokens: _m,
    outputPath: _o,
    workDir: _w,
    checkpointDir: _c,
    threads: _t,
    ...settings
  } = job;
  hash.update(JSON.stringify(settings));
  for await (const sample of jobSamples(job.samplesFile ?? job.samples)) hash.update(JSON.stringify(sample));
  hash.update("\u0000eval");
  for await (const sample of jobSamples(job.evalSamplesFile ?? job.evalSamples))
    hash.update(JSON.stringify(sample));
  if (job.preference !== null)
    for (const file of [job.samplesFile, job.evalSamplesFile]) {
      hash.update("\u0000rejected");
      if (file !== null)
        for await (const sample of jobSamples(file, "rejected")) hash.update(JSON.stringify(sample));
    }
  return hash.digest("hex");
}

async function atomically(file: string, write: (temp: string) => Promise<void> | void): Promise<void> {
  const temp = `${file}.tmp-${process.pid}`;
  try {
    await write(temp);
    fs.renameSync(temp, file);
  } finally {
    fs.rmSync(temp, { force: true });
  }
}
