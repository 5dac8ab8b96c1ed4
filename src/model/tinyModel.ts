import { gguf, writeGguf, type GgufMetadataValue, type GgufTensor } from "./gguf/GgufWriter.ts";
import { seededRandom } from "../random.ts";

export interface TinyModelOptions {
  /** Width of the residual stream (`llama.embedding_length`). Defaults to `64`. */
  embeddingLength?: number;
  /** Number of transformer blocks. Defaults to `2`. */
  blockCount?: number;
  /** Attention heads; must divide `embeddingLength`. Defaults to `4`. */
  headCount?: number;
  /** Key/value heads (grouped-query attention); must divide `headCount`. Defaults to `headCount`. */
  headCountKv?: number;
  /** Hidden size of the SwiGLU feed-forward layer. Defaults to `3 * embeddingLength`. */
  feedForwardLength?: number;
  /** Training context length written to the file; at least 512 so chat history fits. Defaults to `1024`. */
  contextLength?: number;
  /** Seed of the weight initialisation: the same seed and options give a byte-identical file. Defaults to `1`. */
  seed?: number;
  /** `general.name` in the file. Defaults to `"conduit-tiny"`. */
  name?: string;
  /** `general.basename` in the file; none when absent. Defaults to none. */
  basename?: string;
  /** `tokenizer.chat_template` (Jinja); `null`: the file has none. Defaults to {@link TINY_CHAT_TEMPLATE}. */
  chatTemplate?: string | null;
  /**
   * The control tokens that open and end a turn, added to the vocabulary (the second is the end-of-turn
   * token); `null`: none, as a base model without chat tokens. Defaults to `["<|im_start|>", "<|im_end|>"]`.
   */
  turnTokens?: readonly [string, string] | null;
  /** Type of the weight matrices (norms stay F32): `F16` halves a big model's file. Defaults to `"F32"`. */
  weightType?: "F32" | "F16";
}

/** What `createTinyModel` wrote; plain JSON. */
export interface TinyModelInfo {
  path: string;
  bytes: number;
  sha256: string;
  name: string;
  seed: number;
  parameters: number;
  vocabSize: number;
  embeddingLength: number;
  blockCount: number;
  headCount: number;
  headCountKv: number;
  feedForwardLength: number;
  contextLength: number;
  /** Id of the end-of-turn token a chat answer stops at (`<|im_end|>`); `-1` without turn tokens. */
  endOfTurnTokenId: number;
}

/**
 * ChatML, as Qwen and SmolLM ship it. Written with whitespace control so the source differs from the
 * engine's fallback template (`CHATML_TEMPLATE`) while rendering the same text: a model that carries
 * its own template is told apart from one that does not.
 */
export const TINY_CHAT_TEMPLATE =
  "{%- for message in messages -%}\n" +
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' -}}\n" +
  "{%- endfor -%}\n" +
  "{%- if add_generation_prompt -%}\n" +
  "{{- '<|im_start|>assistant\\n' -}}\n" +
  "{%- endif -%}";

// llama.cpp `enum llama_token_type`.
const TokenType = { normal: 1, unknown: 2, control: 3, byte: 6 } as const;

/** SentencePiece's visible space: pieces that start a word carry it. */
const SPACE = "\u2581";

// Multi-character pieces, most frequent first. llama.cpp's SPM tokenizer merges adjacent symbols into the
// highest-scoring piece, so each entry must be reachable by merging two earlier-or-shorter pieces
// (e.g. "▁the" = "▁t" + "he"); the vocab test checks that each one tokenizes to itself.
const words = (list: string) => list.trim().split(/\s+/);
const BIGRAMS = words(`
  th he in er an re on at en nd ti es or te of ed is it al ar st to nt ng se ha as ou io le ve co me
  de hi ri ro ic ne ea ra ce li ch ll be ma si om ur
`);
const WORDS = words(`
  the and to of in is it that was for on are with as he be at by this you not or have from
  what can one all we an they do if will there so my no yes hello world
`);

/** The tokenizer as GGUF arrays, indexed by token id. */
export interface TinyVocab {
  tokens: string[];
  scores: Float32Array;
  types: Int32Array;
  /** Ids of the turn tokens (`<|im_start|>`, `<|im_end|>` by default); `-1` without them. */
  imStart: number;
  imEnd: number;
}

/**
 * The tokenizer: SentencePiece-style ("llama" model) with byte fallback, so any UTF-8 text round-trips
 * exactly: text that no piece covers becomes `<0xNN>` byte tokens. Kept around 500 tokens so the output
 * layer, and with it training, stays cheap.
 */
export function buildTinyVocab(
  turnTokens: readonly [string, string] | null = ["<|im_start|>", "<|im_end|>"],
): TinyVocab {
  const tokens: string[] = [];
  const scores: number[] = [];
  const types: number[] = [];
  const add = (text: string, type: number, score: number) => {
    tokens.push(text);
    types.push(type);
    scores.push(score);
  };
  // Ids 0–2 are what llama.cpp assumes for an SPM vocab (unk, bos, eos).
  add("<unk>", TokenType.unknown, 0);
  add("<s>", TokenType.control, 0);
  add("</s>", TokenType.control, 0);
  for (let b = 0; b < 256; b++)
    add(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`, TokenType.byte, 0);

  // Single characters never come out of a merge, so their score is never compared.
  add(SPACE, TokenType.normal, 0);
  for (let c = 0x21; c <= 0x7e; c++) add(String.fromCharCode(c), TokenType.normal, 0);
  const pieces: string[] = [];
  for (const letter of "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ") pieces.push(SPACE + letter);
  pieces.push(...BIGRAMS);
  // Stepping stones for the words below that no bigram path reaches.
  pieces.push(SPACE + "th", SPACE + "wh", SPACE + "ye", SPACE + "wi", SPACE + "ha", SPACE + "wor");
  pieces.push("ing", "ion", "rom", "llo", "ld");
  for (const word of WORDS) if (!pieces.includes(SPACE + word)) pieces.push(SPACE + word);
  const seen = new Set(tokens);
  let rank = 0;
  for (const piece of pieces) {
    if (seen.has(piece)) continue;
    seen.add(piece);
    add(piece, TokenType.normal, -++rank);
  }

  const imStart = turnTokens ? tokens.length : -1;
  if (turnTokens) add(turnTokens[0], TokenType.control, 0);
  const imEnd = turnTokens ? tokens.length : -1;
  if (turnTokens) add(turnTokens[1], TokenType.control, 0);
  return { tokens, scores: Float32Array.from(scores), types: Int32Array.from(types), imStart, imEnd };
}

/**
 * Writes a tiny randomly initialised Llama-architecture model (all F32) with a byte-fallback tokenizer and
 * a ChatML chat template to `outPath`, atomically. It loads in node-llama-cpp, generates (gibberish) and
 * can be fine-tuned with llama.cpp's training API; the test suite and offline installs use it.
 *
 * Stopping: `<|im_end|>` is the end-of-turn token (`tokenizer.ggml.eot_token_id`), which llama.cpp counts
 * as end-of-generation alongside `</s>` (the EOS); a model trained on ChatML conversations stops there.
 */
export async function createTinyModel(
  outPath: string,
  options: TinyModelOptions = {},
): Promise<TinyModelInfo> {
  const embeddingLength = options.embeddingLength ?? 64;
  const blockCount = options.blockCount ?? 2;
  const headCount = options.headCount ?? 4;
  const headCountKv = options.headCountKv ?? headCount;
  const feedForwardLength = options.feedForwardLength ?? 3 * embeddingLength;
  const contextLength = options.contextLength ?? 1024;
  const seed = options.seed ?? 1;
  const name = options.name ?? "conduit-tiny";

  for (const [key, value] of Object.entries({
    embeddingLength,
    blockCount,
    headCount,
    headCountKv,
    feedForwardLength,
  })) {
    if (!Number.isSafeInteger(value) || value <= 0) throw new RangeError(`${key} must be a positive integer`);
  }
  if (!Number.isSafeInteger(contextLength) || contextLength < 512) {
    throw new RangeError("contextLength must be an integer of at least 512");
  }
  if (!Number.isSafeInteger(seed)) throw new RangeError("seed must be an integer");
  if (embeddingLength % headCount !== 0) throw new RangeError("headCount must divide embeddingLength");
  if (headCount % headCountKv !== 0) throw new RangeError("headCountKv must divide headCount");
  const headDim = embeddingLength / headCount;
  // RoPE rotates pairs of dimensions.
  if (headDim % 2 !== 0) throw new RangeError("embeddingLength / headCount must be even");

  const vocab = buildTinyVocab(options.turnTokens === undefined ? undefined : options.turnTokens);
  const vocabSize = vocab.tokens.length;
  const kvLength = headCountKv * headDim;

  const metadata: Record<string, GgufMetadataValue> = {
    "general.architecture": gguf.str("llama"),
    "general.name": gguf.str(name),
    ...(options.basename !== undefined ? { "general.basename": gguf.str(options.basename) } : {}),
    // LLAMA_FTYPE_ALL_F32: only F32 tensors are trained by llama.cpp's optimizer.
    // llama_ftype: ALL_F32 (0) or MOSTLY_F16 (1).
    "general.file_type": gguf.u32(options.weightType === "F16" ? 1 : 0),
    "llama.vocab_size": gguf.u32(vocabSize),
    "llama.context_length": gguf.u32(contextLength),
    "llama.embedding_length": gguf.u32(embeddingLength),
    "llama.block_count": gguf.u32(blockCount),
    "llama.feed_forward_length": gguf.u32(feedForwardLength),
    "llama.attention.head_count": gguf.u32(headCount),
    "llama.attention.head_count_kv": gguf.u32(headCountKv),
    "llama.attention.layer_norm_rms_epsilon": gguf.f32(1e-5),
    "llama.rope.dimension_count": gguf.u32(headDim),
    "llama.rope.freq_base": gguf.f32(10000),
    "tokenizer.ggml.model": gguf.str("llama"),
    "tokenizer.ggml.tokens": gguf.strings(vocab.tokens),
    "tokenizer.ggml.scores": gguf.f32s(vocab.scores),
    "tokenizer.ggml.token_type": gguf.i32s(vocab.types),
    "tokenizer.ggml.unknown_token_id": gguf.u32(0),
    "tokenizer.ggml.bos_token_id": gguf.u32(1),
    "tokenizer.ggml.eos_token_id": gguf.u32(2),
    ...(vocab.imEnd >= 0 ? { "tokenizer.ggml.eot_token_id": gguf.u32(vocab.imEnd) } : {}),
    "tokenizer.ggml.padding_token_id": gguf.u32(2),
    // A BOS start gives attention a fixed first position to rest on; the engine and trainer both honour it.
    "tokenizer.ggml.add_bos_token": gguf.bool(true),
    "tokenizer.ggml.add_eos_token": gguf.bool(false),
    // SPM's default prepends "▁" to the text and strips it again when detokenizing, which breaks exact
    // round trips of text that is tokenized or streamed in pieces.
    "tokenizer.ggml.add_space_prefix": gguf.bool(false),
    ...(options.chatTemplate === null
      ? {}
      : { "tokenizer.chat_template": gguf.str(options.chatTemplate ?? TINY_CHAT_TEMPLATE) }),
  };

  const random = seededRandom(seed);
  // Weights uniform in ±0.02·√3 (standard deviation 0.02, as GPT-2 and Llama initialise); norms at 1.
  const weight = (name: string, inputs: number, outputs: number): GgufTensor => ({
    name,
    dims: [inputs, outputs],
    type: options.weightType ?? "F32",
    data: () => randomRows(random, inputs, outputs, 0.02 * Math.sqrt(3)),
  });
  const norm = (name: string): GgufTensor => ({
    name,
    dims: [embeddingLength],
    type: "F32",
    data: new Float32Array(embeddingLength).fill(1),
  });

  const tensors: GgufTensor[] = [
    weight("token_embd.weight", embeddingLength, vocabSize),
    norm("output_norm.weight"),
    weight("output.weight", embeddingLength, vocabSize),
  ];
  for (let i = 0; i < blockCount; i++) {
    const blk = `blk.${i}`;
    tensors.push(
      norm(`${blk}.attn_norm.weight`),
      weight(`${blk}.attn_q.weight`, embeddingLength, embeddingLength),
      weight(`${blk}.attn_k.weight`, embeddingLength, kvLength),
      weight(`${blk}.attn_v.weight`, embeddingLength, kvLength),
      weight(`${blk}.attn_output.weight`, embeddingLength, embeddingLength),
      norm(`${blk}.ffn_norm.weight`),
      weight(`${blk}.ffn_gate.weight`, embeddingLength, feedForwardLength),
      weight(`${blk}.ffn_up.weight`, embeddingLength, feedForwardLength),
      weight(`${blk}.ffn_down.weight`, feedForwardLength, embeddingLength),
    );
  }
  const parameters = tensors.reduce((sum, t) => sum + t.dims.reduce((a, b) => a * b, 1), 0);

  const written = await writeGguf(outPath, metadata, tensors);
  return {
    path: outPath,
    bytes: written.bytes,
    sha256: written.sha256,
    name,
    seed,
    parameters,
    vocabSize,
    embeddingLength,
    blockCount,
    headCount,
    headCountKv,
    feedForwardLength,
    contextLength,
    endOfTurnTokenId: vocab.imEnd,
  };
}

/** Rows of a weight matrix, uniform in ±`limit`, one row per chunk so no tensor is held whole. */
function* randomRows(
  random: () => number,
  rowLength: number,
  rows: number,
  limit: number,
): Iterable<Float32Array> {
  const row = new Float32Array(rowLength);
  for (let r = 0; r < rows; r++) {
    for (let i = 0; i < rowLength; i++) row[i] = (random() * 2 - 1) * limit;
    yield row;
  }
}
