import { LlamaEmbeddingContext } from "node-llama-cpp";
import type { Llama, LlamaContext, LlamaGrammar, LlamaModel } from "node-llama-cpp";
import { adapterSetLock } from "./adapterSetLock.ts";

/**
 * The one place that reaches under node-llama-cpp's public API (pinned to exactly 3.22.1 in package.json).
 *
 * Why: `LlamaContextSequence.evaluate` adds per-token JavaScript work on top of the two native calls a token
 * needs (decode, sample): an evaluation lock, a `setImmediate` batch-dispatch cycle, a sampler lock, a
 * thread-splitter reservation with a `setTimeout` release, re-resolving and re-applying the sampler config
 * (a fresh `Uint32Array` of penalty tokens each token), token meters and array copies. Measured on stories260K
 * with 1 thread that costs ~40% of single-stream speed (≈1,150–1,400 tok/s through `evaluate` against
 * ≈1,900–2,400 tok/s driving the same native context directly; see bench/engine.ts). So the engine creates the
 * context with the public API (memory checks, sequences, threads) and then batches all of a model's sequences
 * itself, through the context's native handle: one `decodeBatch` per step for every active sequence, then one
 * `sampleToken` per sequence (run concurrently on libuv's pool). `response_format` grammars go the same way: an
 * `AddonGrammarEvaluationState` (what `LlamaGrammarEvaluationState` wraps) passed in the sampler's config.
 * Log probabilities come from a second `sampleToken` on the same logits with a greedy sampler (no penalties,
 * no truncation), asking for the top logits, the sampled token's logit and the softmax's normalizer.
 *
 * `bindNative` checks every member it uses and fails loudly, so a node-llama-cpp upgrade that changes them
 * breaks at model load with a clear message (and in test/model/engine.test.ts), not mid-generation.
 */

export interface NativeContext {
  initBatch(size: number): void;
  /** Returns the batch indexes of the logits requested by `logitIndexes` (indexes into `tokens`). */
  addToBatch(
    sequenceId: number,
    firstTokenPosition: number,
    tokens: Uint32Array,
    logitIndexes: Uint32Array,
  ): Uint32Array;
  decodeBatch(): Promise<void>;
  /** Samples from the logits at `batchLogitIndex` and feeds the token to the sampler's penalty history; -1: none. */
  sampleToken(batchLogitIndex: number, sampler: NativeSampler): Promise<number>;
  /**
   * The same, also returning logits of the candidates after `sampler`'s chain (the whole vocabulary for a
   * greedy sampler without penalties): `[tokens, includeHighest, includeLowest, includeSelected, top]` returns
   * the `top` highest (sorted, when `top` > 0) and then those of `tokens`, as flat `[token, logit, …]` pairs;
   * `totalLogitWeight` returns Σ exp(logit − highest logit) over the candidates.
   */
  sampleToken(
    batchLogitIndex: number,
    sampler: NativeSampler,
    probabilities: false,
    confidence: false,
    logits: [
      tokens: number[],
      includeHighest: false,
      includeLowest: false,
      includeSelected: false,
      top: number,
    ],
    totalLogitWeight: true,
  ): Promise<[number, undefined, undefined, number[] | undefined, number | undefined]>;
  /** Removes every KV cell of the sequence (`llama_memory_seq_rm(seq, -1, -1)`). */
  disposeSequence(sequenceId: number): void;
  /** Removes the sequence's KV cells at positions [start, end) (`end` -1: to the end); false if it cannot. */
  removeTokenCellsFromSequence(sequenceId: number, start: number, end: number): boolean;
  setThreads(threads: number): void;
  /**
   * The adapters the next decodes apply, with their scales (`llama_set_adapters_lora`; empty: none). llama.cpp
   * applies adapters per context, to every token of a decode.
   */
  setLoras(adapters: NativeAdapter[], scales: number[]): void;
  /**
   * The adapters of one sequence's tokens, on top of the context's (`llama_set_adapters_lora_seq`; empty: none),
   * so that sequences of different adapters share one decode. Only in the mixed-adapter build
   * (`npm run setup:adapters`, mixedAdapterBuild.ts); absent from node-llama-cpp's prebuilt binaries.
   */
  setSequenceLoras?(sequenceId: number, adapters: NativeAdapter[], scales: number[]): void;
  /**
   * In an embedding context, the embedding of a sequence of the last decode: its pooled vector, or the hidden state
   * of the token at `batchIndex` for a model without pooling. Only in the mixed-adapter build.
   */
  getSequenceEmbedding?(sequenceId: number, batchIndex: number): Float64Array;
}

/** A LoRA adapter loaded on a model (`AddonModelLora`: `llama_adapter_lora_init`). */
export interface NativeAdapter {
  readonly filePath: string;
  /** Frees the adapter's tensors (`llama_adapter_lora_free`); no context may apply it afterwards. */
  dispose(): Promise<void>;
}

/** Options of the native sampler chain (token bias → penalties → top-k → top-p → temperature → dist, or greedy). */
export interface NativeSamplerConfig {
  /** 0 or less: greedy (top-k, top-p and seed are then unused). */
  temperature: number;
  /** 0 or less: the whole vocabulary. */
  topK: number;
  topP: number;
  seed: number;
  /** Multiplicative repeat penalty; 1 disables it. */
  repeatPenalty: number;
  /** How many of the most recent sampled tokens the penalties look at. */
  repeatPenaltyMaxTokens: number;
  /** Tokens already in the penalty history before the first sample. */
  repeatPenaltyTokens: Uint32Array;
  repeatPenaltyPresencePenalty: number;
  repeatPenaltyFrequencyPenalty: number;
  /**
   * Constrains sampling to a grammar: `sampleToken` applies it and accepts each sampled token into it. One
   * state per generation. Defaults to none.
   */
  grammarEvaluationState?: NativeGrammarState;
}

/**
 * Greedy with nothing else: no penalties, no truncation, no grammar. Its candidates are the raw logits of the
 * whole vocabulary (what log probabilities are read from); the benches use it as the plainest sampler.
 */
export function greedySamplerConfig(): NativeSamplerConfig {
  return {
    temperature: 0,
    topK: 0,
    topP: 1,
    seed: 0,
    repeatPenalty: 1,
    repeatPenaltyMaxTokens: 0,
    repeatPenaltyTokens: new Uint32Array(0),
    repeatPenaltyPresencePenalty: 0,
    repeatPenaltyFrequencyPenalty: 0,
  };
}

/** Where a generation stands in its grammar (`AddonGrammarEvaluationState`); opaque, freed by the GC. */
export interface NativeGrammarState {
  readonly __nativeGrammarState: never;
}

export interface NativeSampler {
  applyConfig(config: NativeSamplerConfig): void;
  dispose(): void;
}

export interface NativeBinding {
  context: NativeContext;
  /** Whether the context takes adapters per sequence ({@link NativeContext.setSequenceLoras}). */
  perSequenceAdapters: boolean;
  createSampler(): NativeSampler;
  /** A fresh evaluation state of `grammar` (from the same `Llama`) for one generation. */
  createGrammarState(grammar: LlamaGrammar): NativeGrammarState;
}

type SamplerConstructor = new (model: unknown) => NativeSampler;
type GrammarStateConstructor = new (model: unknown, grammar: unknown) => NativeGrammarState;

export function bindNative(llama: Llama, model: LlamaModel, context: LlamaContext): NativeBinding {
  const ctx = (context as unknown as { _ctx?: NativeContext })._ctx;
  const nativeModel = (model as unknown as { _model?: unknown })._model;
  const bindings = (
    llama as unknown as {
      _bindings?: {
        AddonSampler?: SamplerConstructor;
        AddonGrammarEvaluationState?: GrammarStateConstructor;
      };
    }
  )._bindings;
  const Sampler = bindings?.AddonSampler;
  const GrammarState = bindings?.AddonGrammarEvaluationState;
  const contextMethods = [
    "initBatch",
    "addToBatch",
    "decodeBatch",
    "sampleToken",
    "disposeSequence",
    "removeTokenCellsFromSequence",
    "setThreads",
    "setLoras",
  ];
  const missing = [
    ...contextMethods.filter((m) => typeof (ctx as Record<string, unknown> | undefined)?.[m] !== "function"),
    ...(nativeModel == null ? ["model._model"] : []),
    ...(typeof Sampler !== "function" || typeof Sampler.prototype?.applyConfig !== "function"
      ? ["AddonSampler.applyConfig"]
      : []),
    ...(typeof GrammarState !== "function" ? ["AddonGrammarEvaluationState"] : []),
  ];
  if (missing.length > 0 || !ctx || !Sampler || !GrammarState)
    throw new Error(nativeApiChanged(missing.join(", ")));
  return {
    context: ctx,
    perSequenceAdapters: typeof ctx.setSequenceLoras === "function",
    createSampler: () => new Sampler(nativeModel),
    createGrammarState: (grammar) => {
      const nativeGrammar = (grammar as unknown as { _grammar?: unknown; _llama?: unknown })._grammar;
      if (nativeGrammar == null) throw new Error(nativeApiChanged("grammar._grammar"));
      if ((grammar as unknown as { _llama?: unknown })._llama !== llama)
        throw new Error("the grammar was made by another Llama instance than the model");
      return new GrammarState(nativeModel, nativeGrammar);
    },
  };
}

/**
 * The native context under an embedding context (node-llama-cpp creates it with llama.cpp's `embeddings` on), for
 * what its public API lacks: applying a LoRA adapter loaded by {@link loadAdapter} (its `lora` option loads
 * adapters for the model's lifetime), and, in the mixed-adapter build, embedding several inputs in one decode.
 */
export interface EmbeddingNative {
  setLoras: NativeContext["setLoras"];
  /**
   * The input as `getEmbeddingFor` evaluates it: a copy of `tokens` with the BOS and end tokens the vocabulary
   * wants added.
   */
  prepare(tokens: readonly number[]): number[];
  /**
   * One decode of several inputs, each in a sequence of its own (0, 1, …; their KV cells are removed after): each
   * one's embedding, its pooled vector or, for a model without pooling, its last token's hidden state. Only where
   * the addon has `getSequenceEmbedding` ({@link hasBatchedEmbeddings}); the context must have a sequence per input.
   */
  decodeAll?(inputs: readonly number[][]): Promise<number[][]>;
}

/** Whether `llama`'s addon embeds several sequences of one decode (the mixed-adapter build's `getSequenceEmbedding`). */
export function hasBatchedEmbeddings(llama: Llama): boolean {
  const bindings = (
    llama as unknown as { _bindings?: { AddonContext?: { prototype?: Record<string, unknown> } } }
  )._bindings;
  return typeof bindings?.AddonContext?.prototype?.getSequenceEmbedding === "function";
}

/**
 * An embedding context over `context` (created by `model.createContext` with `_embeddings`, possibly with several
 * sequences), as `model.createEmbeddingContext` makes one over a context of one sequence.
 */
export function embeddingContextOver(context: LlamaContext): LlamaEmbeddingContext {
  const Constructor = LlamaEmbeddingContext as unknown as new (options: {
    _llamaContext: LlamaContext;
  }) => LlamaEmbeddingContext;
  return new Constructor({ _llamaContext: context });
}

export function embeddingNative(context: LlamaEmbeddingContext): EmbeddingNative {
  const ctx = (context as unknown as { _llamaContext?: { _ctx?: Partial<NativeContext> } })._llamaContext
    ?._ctx;
  const prepareInput = (context as unknown as { _prepareInput?: (tokens: number[]) => void })._prepareInput;
  const setLoras = ctx?.setLoras;
  if (typeof setLoras !== "function" || typeof prepareInput !== "function")
    throw new Error(
      nativeApiChanged("embeddingContext._llamaContext._ctx.setLoras, embeddingContext._prepareInput"),
    );
  const native: EmbeddingNative = {
    setLoras: (adapters, scales) => setLoras.call(ctx, adapters, scales),
    prepare(tokens) {
      const copy = [...tokens];
      prepareInput.call(context, copy);
      return copy;
    },
  };
  const { initBatch, addToBatch, decodeBatch, disposeSequence, getSequenceEmbedding } = ctx ?? {};
  if (
    typeof getSequenceEmbedding === "function" &&
    typeof initBatch === "function" &&
    typeof addToBatch === "function" &&
    typeof decodeBatch === "function" &&
    typeof disposeSequence === "function"
  )
    native.decodeAll = async (inputs) => {
      try {
        initBatch.call(
          ctx,
          inputs.reduce((sum, tokens) => sum + tokens.length, 0),
        );
        // Every token an output, as llama.cpp makes them with embeddings on (it warns of any that is not).
        const last = inputs.map((tokens, sequence) => {
          const at = addToBatch.call(
            ctx,
            sequence,
            0,
            Uint32Array.from(tokens),
            Uint32Array.from(tokens, (_, i) => i),
          );
          return at[tokens.length - 1]!;
        });
        await decodeBatch.call(ctx);
        return last.map((index, sequence) => Array.from(getSequenceEmbedding.call(ctx, sequence, index)));
      } finally {
        for (let sequence = 0; sequence < inputs.length; sequence++) disposeSequence.call(ctx, sequence);
      }
    };
  return native;
}

type AdapterConstructor = new (model: unknown, filePath: string) => NativeAdapter;

/**
 * Loads the LoRA adapter at `filePath` on `model`, owned by the caller (node-llama-cpp's own `lora` context
 * option keeps every adapter it loads until the model is disposed; this one is freed by its `dispose`). Its load
 * and its `dispose` take the model's {@link adapterSetLock}: llama.cpp's adapter set of a model is not thread-safe.
 */
export async function loadAdapter(llama: Llama, model: LlamaModel, filePath: string): Promise<NativeAdapter> {
  const Adapter = (llama as unknown as { _bindings?: { AddonModelLora?: AdapterConstructor } })._bindings
    ?.AddonModelLora;
  const nativeModel = (model as unknown as { _model?: { loadLora?: (lora: NativeAdapter) => Promise<void> } })
    ._model;
  if (typeof Adapter !== "function" || typeof nativeModel?.loadLora !== "function")
    throw new Error(nativeApiChanged("AddonModelLora, model._model.loadLora"));
  const lock = adapterSetLock(model);
  const adapter = new Adapter(nativeModel, filePath);
  // The native object itself is what contexts take (`setLoras`): its own `dispose` is shadowed, not wrapped.
  const free = adapter.dispose.bind(adapter);
  Object.defineProperty(adapter, "dispose", { value: () => lock.write(free) });
  try {
    await lock.write(() => nativeModel.loadLora!(adapter));
  } catch (error) {
    await adapter.dispose().catch(() => {});
    throw error;
  }
  return adapter;
}

function nativeApiChanged(missing: string): string {
  return (
    `node-llama-cpp's native context API changed (missing: ${missing}); ` +
    "src/engine/nativeBatch.ts is written for node-llama-cpp 3.22.1"
  );
}
