/**
 * Turns generated tokens into streamed text pieces: never splits a multi-byte character across pieces and
 * never streams text that may turn out to be the start of a stop string. Pure apart from the `detokenize`
 * function it is given, so it is testable without a model.
 */

/** Detokenizes `tokens` as the continuation of `previous` (the last tokens already turned into text). */
export type Detokenize = (tokens: readonly number[], previous: readonly number[]) => string;

/** A token whose bytes end in the middle of a character decodes with a trailing U+FFFD. */
const REPLACEMENT = "\uFFFD";
/** UTF-8 characters are at most 4 bytes, so after 4 held tokens a U+FFFD is real, not a partial character. */
const MAX_HELD_TOKENS = 4;
/** Context given to the detokenizer so SentencePiece-style leading spaces come out right. */
const PREVIOUS_TOKENS = 4;

export class TextOutput {
  /** The text streamed so far; at the end, the whole output (stop string excluded). */
  text = "";
  /** True once a stop string has been seen; `text` ends right before it. */
  stopped = false;

  private readonly stops: string[];
  private readonly detokenize: Detokenize;
  private heldTokens: number[] = [];
  private previousTokens: number[] = [];
  // Text decoded but not yet streamed because it might be the beginning of a stop string.
  private heldText = "";
  private readonly trimEnd: boolean;

  /** `trimEnd`: trailing whitespace is held back, and dropped at the end (grammar output). */
  constructor(detokenize: Detokenize, stops: readonly string[] = [], trimEnd = false) {
    this.detokenize = detokenize;
    this.stops = stops.filter((s) => s.length > 0);
    this.trimEnd = trimEnd;
  }

  /**
   * Characters decoded so far, streamed, held back or cut at a stop string: where the text of the next token
   * pushed starts (a token ending inside a character is decoded with the next one, and starts where that one
   * does). Before a stop string, `text` and the held-back text; the text up to a stop string is `text`.
   */
  decodedLength = 0;

  /** Adds a generated token; returns the text that can be streamed now (may be empty). */
  push(token: number): string {
    if (this.stopped) return "";
    this.heldTokens.push(token);
    const decoded = this.detokenize(this.heldTokens, this.previousTokens);
    if (decoded.endsWith(REPLACEMENT) && this.heldTokens.length < MAX_HELD_TOKENS) return "";
    this.previousTokens = [...this.previousTokens, ...this.heldTokens].slice(-PREVIOUS_TOKENS);
    this.heldTokens = [];
    this.decodedLength += decoded.length;
    return this.pushText(decoded);
  }

  /** Ends the output (no stop string seen): returns whatever was held back. */
  finish(): string {
    if (this.stopped) return "";
    let rest = this.heldText;
    if (this.heldTokens.length > 0) {
      const decoded = this.detokenize(this.heldTokens, this.previousTokens);
      this.decodedLength += decoded.length;
      rest += decoded;
    }
    if (this.trimEnd) rest = rest.trimEnd();
    this.heldTokens = [];
    this.heldText = "";
    this.text += rest;
    return rest;
  }

  private pushText(decoded: string): string {
    const pending = this.heldText + decoded;
    let stopAt = -1;
    for (const stop of this.stops) {
      const at = pending.indexOf(stop);
      if (at !== -1 && (stopAt === -1 || at < stopAt)) stopAt = at;
    }
    if (stopAt !== -1) {
      this.stopped = true;
      this.heldText = "";
      const before = pending.slice(0, stopAt);
      return this.emit(this.trimEnd ? before.trimEnd() : before);
    }
    let keep = longestStopPrefixSuffix(pending, this.stops);
    if (this.trimEnd) keep = Math.max(keep, pending.length - pending.trimEnd().length);
    this.heldText = pending.slice(pending.length - keep);
    return this.emit(pending.slice(0, pending.length - keep));
  }

  private emit(piece: string): string {
    this.text += piece;
    return piece;
  }
}

/** Length of the longest suffix of `text` that is a proper prefix of one of `stops`. */
function longestStopPrefixSuffix(text: string, stops: readonly string[]): number {
  let best = 0;
  for (const stop of stops) {
    for (let n = Math.min(stop.length - 1, text.length); n > best; n--) {
      if (text.endsWith(stop.slice(0, n))) {
        best = n;
        break;
      }
    }
  }
  return best;
}
