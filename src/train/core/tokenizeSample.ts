/**
 * Tokenization of training samples with the model's own llama.cpp tokenizer, exactly as inference
 * tokenizes a prompt and then generates (both trainer backends train on these tokens).
 */
import type { SampleSegment, TrainingSample } from "./trainerJob.ts";
import type { LlamaLib, Pointer } from "../libllama/llamaLib.ts";
import type { TokenizedSample } from "./packWindows.ts";
import { jobSamples, TokenStore } from "./sampleStore.ts";

/**
 * Tokenizes a job's samples (a list, or a JSONL file read as a stream) into a {@link TokenStore} named
 * `name` in `dir`. Returns the store and its trained tokens, or `undefined` when cancelled meanwhile
 * (checked every 1,024 samples, after letting the event loop run).
 */
export async function tokenizeSamples(
  lib: LlamaLib,
  vocab: Pointer,
  source: readonly TrainingSample[] | string,
  dir: string,
  name: string,
  hooks: { isCancelled(): boolean; yieldToEventLoop(): Promise<void> },
  stores: TokenStore[],
  /** The lines' field to read, when `source` is a file (see `jobSamples`). Defaults to `"sample"`. */
  field: "sample" | "rejected" = "sample",
): Promise<{ store: TokenStore; trained: number } | undefined> {
  const store = new TokenStore(dir, name);
  stores.push(store);
  let trained = 0;
  for await (const sample of jobSamples(source, field)) {
    const tokenized = tokenizeSample(lib, vocab, sample);
    store.append(tokenized);
    for (const flag of tokenized.trained) trained += flag;
    if (store.size % 1024 === 0) {
      await hooks.yieldToEventLoop();
      if (hooks.isCancelled()) return undefined;
    }
  }
  store.flush();
  return { store, trained };
}

/**
 * A sample's tokens and which are trained on. Segments are tokenized one by one (BOS, as the vocab
 * asks, before the first), the way inference tokenizes a prompt and then generates the answer.
 */
export function tokenizeSample(lib: LlamaLib, vocab: Pointer, sample: TrainingSample): TokenizedSample {
  const segments = typeof sample === "string" ? [{ text: sample, train: true }] : sample;
  const parts = segments.map((segment, i) => ({
    tokens: segmentTokens(lib, vocab, segment, i === 0),
    train: segment.train,
  }));
  const length = parts.reduce((sum, part) => sum + part.tokens.length, 0);
  const tokens = new Int32Array(length);
  const trained = new Uint8Array(length);
  let at = 0;
  for (const part of parts) {
    tokens.set(part.tokens, at);
    if (part.train) trained.fill(1, at, at + part.tokens.length);
    at += part.tokens.length;
  }
  return { tokens, trained };
}

/**
 * A segment's tokens: the whole text with control-token text parsed, unless one of its content pieces holds
 * control-token text (`<|im_end|>` in a pair); then piece by piece, contents as plain text, so that a pair
 * cannot forge a turn boundary (as inference does with a request's messages).
 */
function segmentTokens(lib: LlamaLib, vocab: Pointer, segment: SampleSegment, first: boolean): Int32Array {
  const forging = (text: string) => {
    const plain = tokenize(lib, vocab, text, false, false);
    const special = tokenize(lib, vocab, text, false, true);
    return plain.length !== special.length || plain.some((token, i) => token !== special[i]);
  };
  const pieces = segment.pieces ?? [];
  if (!pieces.some((piece) => !piece.special && forging(piece.text)))
    return tokenize(lib, vocab, segment.text, first);
  const parts = pieces.map((piece, i) => tokenize(lib, vocab, piece.text, first && i === 0, piece.special));
  const tokens = new Int32Array(parts.reduce((sum, part) => sum + part.length, 0));
  let at = 0;
  for (const part of parts) {
    tokens.set(part, at);
    at += part.length;
  }
  return tokens;
}

/** Tokenizes with special-token text parsed as control tokens, and BOS first when `addSpecial` and the vocab asks. */
function tokenize(
  lib: LlamaLib,
  vocab: Pointer,
  text: string,
  addSpecial: boolean,
  parseSpecial = true,
): Int32Array {
  if (text.length === 0) return new Int32Array(0);
  const bytes = Buffer.byteLength(text);
  let tokens = new Int32Array(bytes + 8);
  let count = lib.llama_tokenize(vocab, text, bytes, tokens, tokens.length, addSpecial, parseSpecial);
  if (count < 0) {
    tokens = new Int32Array(-count);
    count = lib.llama_tokenize(vocab, text, bytes, tokens, tokens.length, addSpecial, parseSpecial);
  }
  if (count < 0) throw new Error("trainer: tokenization failed");
  return tokens.slice(0, count);
}
