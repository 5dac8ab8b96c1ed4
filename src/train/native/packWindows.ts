/**
 * Turns tokenized samples into fixed-size training windows (llama.cpp trains on whole `n_ctx` windows,
 * one optimizer step each).
 *
 * Packing, not one sample per window: samples are laid end to end in the given order and a window is
 * closed when the next sample does not fit, so a sample is never split unless it alone is longer than
 * a window (then it fills whole windows and its tail starts the next one). The rest of a window is
 * padding. Labels are the next token; the last token of every sample is labelled with the end-of-
 * sequence token so the model learns where a sample stops, and padding predicts padding. There is no
 * loss masking in this API, so padding and prompt tokens count towards the loss, and samples in one
 * window attend to the ones before them (the caller reshuffles the order every epoch so that no sample
 * learns to depend on a fixed neighbour).
 */

export interface TrainingWindow {
  input: Int32Array;
  labels: Int32Array;
  /** Positions holding sample tokens rather than padding. */
  sampleTokens: number;
}

/** Splits each sample into pieces that fit a window, as [start, end) token ranges. */
function pieces(length: number, windowSize: number): Array<[number, number]> {
  const result: Array<[number, number]> = [];
  for (let start = 0; start < length; start += windowSize)
    result.push([start, Math.min(length, start + windowSize)]);
  return result;
}

/** How many windows {@link packWindows} would produce, without building them. */
export function countWindows(lengths: readonly number[], windowSize: number): number {
  let windows = 0;
  let used = windowSize; // no open window yet
  for (const length of lengths) {
    for (const [start, end] of pieces(length, windowSize)) {
      const size = end - start;
      if (used + size > windowSize) {
        windows += 1;
        used = 0;
      }
      used += size;
    }
  }
  return windows;
}

/**
 * Packs `samples` (token ids, BOS already added) into windows of `windowSize` positions.
 * @param endToken label after the last token of a sample, and the padding token.
 */
export function packWindows(
  samples: readonly Int32Array[],
  windowSize: number,
  endToken: number,
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
  for (const tokens of samples) {
    for (const [start, end] of pieces(tokens.length, windowSize)) {
      const size = end - start;
      if (current !== undefined && current.sampleTokens + size > windowSize) close();
      current ??= { input: new Int32Array(windowSize), labels: new Int32Array(windowSize), sampleTokens: 0 };
      const at = current.sampleTokens;
      current.input.set(tokens.subarray(start, end), at);
      current.labels.set(tokens.subarray(start + 1, end), at);
      // The label of a piece's last position is the next token of the sample, or the end token.
      current.labels[at + size - 1] = end < tokens.length ? (tokens[end] ?? endToken) : endToken;
      current.sampleTokens += size;
    }
  }
  close();
  return windows;
}

/** A small seeded PRNG (mulberry32): the same seed gives the same sample order on every machine. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** A Fisher-Yates permutation of `0..n-1`. */
export function shuffledOrder(n: number, random: () => number): number[] {
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [order[i], order[j]] = [order[j] as number, order[i] as number];
  }
  return order;
}
