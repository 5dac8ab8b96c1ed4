/**
 * Turns tokenized samples into fixed-size training windows (llama.cpp trains on whole `n_ctx` windows,
 * one optimizer step each).
 *
 * Packing, not one sample per window: samples are laid end to end in the given order and a window is
 * closed when the next sample does not fit. A sample is never split: one longer than a window is an
 * error before training starts (the window is sized to fit the longest sample, up to the model's
 * context). Labels are the next token; the last token of every sample is labelled with the end token.
 *
 * Loss mask: a position counts in the loss (and its gradient) only when its label is a trained token
 * of the same sample: the answer tokens by default, every token with `trainOnInputs`, never padding.
 * llama.cpp's training batch puts every position in one sequence, so a sample still attends to the
 * samples before it in its window; the caller reshuffles the order every epoch so that no sample
 * learns to depend on a fixed neighbour (docs/fine-tuning.md, "What training optimises", has the measurement).
 */

export interface TokenizedSample {
  tokens: Int32Array;
  /** 1 where the token is trained on (an answer token), 0 where it is only context. */
  trained: Uint8Array;
}

/** Where a sample sits in a window. */
export interface WindowSpan {
  /** Index of the sample in the list given to {@link packWindows}. */
  sample: number;
  start: number;
  length: number;
}

export interface TrainingWindow {
  input: Int32Array;
  labels: Int32Array;
  /** 1 where the position's loss counts. */
  lossMask: Uint8Array;
  /** Positions whose loss counts. */
  lossTokens: number;
  /** Positions holding sample tokens rather than padding. */
  sampleTokens: number;
  spans: WindowSpan[];
}

/** How many windows {@link packWindows} would produce, without building them. */
export function countWindows(lengths: readonly number[], windowSize: number, pack = true): number {
  let windows = 0;
  let used = windowSize; // no open window yet
  for (const length of lengths) {
    if (length === 0) continue;
    if (!pack || used + length > windowSize) {
      windows += 1;
      used = 0;
    }
    used += length;
  }
  return windows;
}

/** The positions of a sample whose loss counts: those whose label (the next token, or the end) is trained. */
export function lossPositions(sample: TokenizedSample): Uint8Array {
  const n = sample.tokens.length;
  const mask = new Uint8Array(n);
  for (let i = 0; i < n - 1; i++) mask[i] = sample.trained[i + 1] ?? 0;
  // The end label after the last token counts when the sample ends in trained text (the answer's end).
  if (n > 0) mask[n - 1] = sample.trained[n - 1] ?? 0;
  return mask;
}

/**
 * Packs `order` (indices into `samples`) into windows of `windowSize` positions.
 * @param endToken label after the last token of a sample, and the padding token.
 * @param pack false puts every sample in a window of its own (for measuring what packing costs).
 * @param capacity positions of a window that hold samples (the rest is padding): a model trained on a
 *   context shorter than llama.cpp's smallest window (256) is never trained past its context.
 */
export function packWindows(
  samples: readonly TokenizedSample[],
  order: readonly number[],
  windowSize: number,
  endToken: number,
  pack = true,
  capacity = windowSize,
): TrainingWindow[] {
  const windows: TrainingWindow[] = [];
  let current: TrainingWindow | undefined;
  const close = () => {
    if (current === undefined) return;
    current.input.fill(endToken, current.sampleTokens);
    current.labels.fill(endToken, current.sampleTokens);
    windows.push(current);
    current = undefined;
  };
  for (const index of order) {
    const sample = samples[index];
    if (sample === undefined) throw new RangeError(`packWindows: no sample ${index}`);
    const { tokens } = sample;
    const size = tokens.length;
    const room = Math.min(capacity, windowSize);
    if (size > room)
      throw new RangeError(
        `packWindows: sample ${index} has ${size} tokens, more than the window of ${room}`,
      );
    if (size === 0) continue;
    if (current !== undefined && (!pack || current.sampleTokens + size > room)) close();
    current ??= {
      input: new Int32Array(windowSize),
      labels: new Int32Array(windowSize),
      lossMask: new Uint8Array(windowSize),
      lossTokens: 0,
      sampleTokens: 0,
      spans: [],
    };
    const at = current.sampleTokens;
    current.input.set(tokens, at);
    current.labels.set(tokens.subarray(1), at);
    current.labels[at + size - 1] = endToken;
    const mask = lossPositions(sample);
    current.lossMask.set(mask, at);
    for (const m of mask) current.lossTokens += m;
    current.spans.push({ sample: index, start: at, length: size });
    current.sampleTokens += size;
  }
  close();
  return windows;
}

/**
 * The windows {@link packWindows} would make of `count` samples taken in order, without building them:
 * the position where each window starts. Window `k` holds the non-empty samples at positions
 * `starts[k]` up to `starts[k + 1]` (the last one: up to `count`). `lengthAt(p)` is the length of the
 * sample at position `p`; `room` the positions of a window that hold samples.
 */
export function planWindows(
  count: number,
  lengthAt: (position: number) => number,
  room: number,
  pack = true,
): number[] {
  const starts: number[] = [];
  let used = room; // no open window yet
  for (let position = 0; position < count; position++) {
    const length = lengthAt(position);
    if (length === 0) continue;
    if (length > room)
      throw new RangeError(
        `planWindows: the sample at ${position} has ${length} tokens, more than the window of ${room}`,
      );
    if (!pack || used + length > room) {
      starts.push(position);
      used = 0;
    }
    used += length;
  }
  return starts;
}
