import type { LlamaEmbeddingContext, LlamaModel, Token } from "node-llama-cpp";
import { abortable } from "./Admission.ts";
import { longestTokenBytes } from "./promptTokens.ts";
import { adapterSetLock, type AdapterSetLock } from "./adapterSetLock.ts";
import { embeddingNative, type NativeAdapter } from "./nativeBatch.ts";

/** What an embedding context costs: host and GPU memory, as node-llama-cpp estimates it. */
export interface EmbeddingMemory {
  host: number;
  gpu: number;
}

/**
 * The embedding context of one loaded base (node-llama-cpp's `LlamaEmbeddingContext`: a context created with
 * llama.cpp's `embeddings` on), shared by the base and its LoRA adapters, one request at a time: llama.cpp applies
 * adapters per context. With the mixed-adapter build the context has `lanes` sequences, and a request's inputs are
 * packed into decodes of up to `lanes` inputs and `contextSize` tokens, each input in a sequence of its own (its
 * pooled vector, or its last token's hidden state for a model without pooling, such as a chat model). Without it
 * (node-llama-cpp's prebuilt binaries read the embedding of one sequence only) the inputs are evaluated one after
 * another, each in one decode. Requests take turns in arrival order.
 */
export class Embedder {
  /** The context's tokens: an input may have one fewer, with its BOS and end tokens. */
  readonly contextSize: number;
  /** Length of the vectors. */
  readonly dimensions: number;
  /** Tokens in the vocabulary, from the GGUF header; `Infinity` when it does not list them (llama.cpp checks then). */
  readonly vocabularySize: number;
  /** Most bytes of text one token stands for ({@link longestTokenBytes}). */
  readonly maxTokenBytes: number;
  private readonly native: ReturnType<typeof embeddingNative>;
  /** Decodes read the model's adapter set: not while an adapter of the model loads or is freed. */
  private readonly adapterLock: AdapterSetLock;
  /** The end of the last request's turn: the next one starts after it. */
  private tail: Promise<void> = Promise.resolve();
  private holders = 0;
  /** Set by {@link close}: the error every input after it fails with. */
  private closedBy: (() => Error) | undefined;

  constructor(
    private readonly context: LlamaEmbeddingContext,
    model: LlamaModel,
    contextSize: number,
    /** Bytes it holds, counted with its base against the memory budgets. */
    readonly memory: EmbeddingMemory,
    /** Sequences of the context: inputs embedded in one decode (1 where the addon cannot read several). */
    readonly lanes = 1,
  ) {
    this.contextSize = contextSize;
    this.dimensions = model.embeddingVectorSize;
    const tokens: unknown = model.fileInfo.metadata.tokenizer?.ggml?.tokens;
    this.vocabularySize = Array.isArray(tokens) && tokens.length > 0 ? tokens.length : Infinity;
    this.maxTokenBytes = longestTokenBytes(model);
    this.native = embeddingNative(context);
    this.adapterLock = adapterSetLock(model);
  }

  /** Tokens the context evaluates for `tokens`: with the BOS and the end token the vocabulary wants added. */
  inputLength(tokens: number[]): number {
    return this.context.calculateInputLength(tokens as Token[]);
  }

  /** Whether a request evaluates or waits for its turn: a new one would wait. */
  get busy(): boolean {
    return this.holders > 0;
  }

  /**
   * Waits for this request's turn (the requests before it are done) and returns what ends it; given up with the
   * signal's reason when `signal` aborts (the turns after it then wait for the ones before it only).
   */
  async turn(signal: AbortSignal | undefined): Promise<() => void> {
    const previous = this.tail;
    let release!: () => void;
    this.tail = new Promise<void>((resolve) => (release = resolve));
    this.holders++;
    let ended = false;
    const end = () => {
      if (ended) return;
      ended = true;
      this.holders--;
      release();
    };
    try {
      await abortable(previous, signal);
    } catch (error) {
      void previous.then(end);
      throw error;
    }
    return end;
  }

  /**
   * Embeds `inputs` (token ids; the context adds the BOS and end tokens) in order under `adapter` (absent: the bare
   * base). Call it in the request's {@link turn}. Checks `signal` between decodes.
   */
  async embed(
    /** Each with a token at least (the engine refuses empty inputs). */
    inputs: number[][],
    adapter: { native: NativeAdapter; scale: number } | undefined,
    signal: AbortSignal | undefined,
  ): Promise<number[][]> {
    this.native.setLoras(adapter ? [adapter.native] : [], adapter ? [adapter.scale] : []);
    const decodeAll = this.lanes > 1 ? this.native.decodeAll : undefined;
    const vectors: number[][] = [];
    if (decodeAll === undefined) {
      for (const tokens of inputs) {
        this.checkOpen(signal);
        const embedding = await this.adapterLock.read(() => this.context.getEmbeddingFor(tokens as Token[]));
        vectors.push(embedding.vector as number[]);
      }
      return vectors;
    }
    for (const group of packed(
      inputs.map((tokens) => this.native.prepare(tokens)),
      this.lanes,
      this.contextSize,
    )) {
      this.checkOpen(signal);
      vectors.push(...(await this.adapterLock.read(() => decodeAll(group))));
    }
    return vectors;
  }

  private checkOpen(signal: AbortSignal | undefined): void {
    signal?.throwIfAborted();
    if (this.closedBy) throw this.closedBy();
  }

  /** Fails the requests under way at their next input, and every later one, with `reason()` (shutting down). */
  close(reason: () => Error): void {
    this.closedBy = reason;
  }

  /** Waits for the requests under way, then frees the context. */
  async dispose(): Promise<void> {
    await this.tail;
    await this.context.dispose();
  }
}

/**
 * `inputs` in order, in groups of at most `lanes` inputs and `tokens` tokens in all (an input has fewer than the
 * context's tokens, so each fits a group of its own).
 */
export function packed(inputs: readonly number[][], lanes: number, tokens: number): number[][][] {
  const groups: number[][][] = [];
  let group: number[][] = [];
  let used = 0;
  for (const input of inputs) {
    if (group.length > 0 && (group.length === lanes || used + input.length > tokens)) {
      groups.push(group);
      group = [];
      used = 0;
    }
    group.push(input);
    used += input.length;
  }
  if (group.length > 0) groups.push(group);
  return groups;
}
