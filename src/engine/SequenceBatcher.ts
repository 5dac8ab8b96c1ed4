import crypto from "node:crypto";
import type { Llama, LlamaContext, LlamaGrammar, LlamaModel, Token } from "node-llama-cpp";
import type { ChatTemplate } from "../model/chatTemplate.ts";
import { adapterSetLock, type AdapterSetLock } from "./adapterSetLock.ts";
import { bindNative, greedySamplerConfig } from "./nativeBatch.ts";
import type {
  NativeAdapter,
  NativeBinding,
  NativeGrammarState,
  NativeSampler,
  NativeSamplerConfig,
} from "./nativeBatch.ts";
import { longestTokenBytes, promptTokens, type PromptModel } from "./promptTokens.ts";
import type { TokenizerThread } from "./TokenizerThread.ts";
import { TextOutput } from "./TextOutput.ts";
import type { FinishReason, GenerationRequest, GenerationResult, TokenLogprob } from "./types.ts";

/** Decode steps with at least this many tokens run on `promptThreads`. */
export const PROMPT_BATCH_TOKENS = 32;

export interface SequenceBatcherOptions {
  llama: Llama;
  model: LlamaModel;
  /** Created with `sequences` = the sequences to serve; the batcher drives it through its native handle. */
  context: LlamaContext;
  /** The model's chat template, read at load. */
  template: ChatTemplate;
  /** The model file and its identity when it was read, for {@link tokenizer}. Defaults to none. */
  file?: { path: string; identity: string };
  /** Where long prompts are tokenized, off the event loop (with `file`). Defaults to none: all on the loop. */
  tokenizer?: TokenizerThread;
  /** Threads for generation steps (see `LlamaEngineOptions.threads`). */
  threads: number;
  /** Threads for steps of at least {@link PROMPT_BATCH_TOKENS} tokens (see `LlamaEngineOptions.promptThreads`). */
  promptThreads: number;
  /** Most tokens evaluated in one decode step (also capped by the context's batch size). */
  batchSize: number;
  logger: (level: "error" | "warn", message: string) => void;
  /**
   * Called as each generation finishes with its answer (not when it fails or is aborted), with the key of
   * the adapter it ran on (`undefined`: the bare model).
   */
  onFinish: (result: GenerationResult, elapsedMs: number, adapterKey: string | undefined) => void;
}

/** An adapter key no adapter has: a sequence's adapter is unknown after a failed native call. */
const UNKNOWN_ADAPTER = "\0unknown";

/** A LoRA adapter that generations on this batcher's context may apply (loaded by the pool on the same model). */
export interface BatchAdapter {
  /** Tells adapters apart (file and scale); KV caches computed under one are reused only under the same. */
  key: string;
  native: NativeAdapter;
  scale: number;
}

interface Waiter {
  resolve(sequenceId: number): void;
  reject(error: unknown): void;
}

/** One running generation on one sequence of a loaded model. */
interface Generation {
  sequenceId: number;
  /** The LoRA adapter its decodes apply; absent: the bare model. */
  adapter: BatchAdapter | undefined;
  /**
   * Made by the step loop while the generation's first decode runs (`prepareSamplers`): a native sampler
   * allocates a candidate array of the whole vocabulary, ~0.37 ms on SmolLM2's 49,152 tokens, which would
   * otherwise add to the time to the first token.
   */
  sampler: NativeSampler | undefined;
  samplerConfig: NativeSamplerConfig;
  prompt: number[];
  /**
   * Set once the step loop has matched the prompt against the sequence's KV cache (`reusePrefix`, between two
   * decodes, never while one runs) and set `pending`, `position`, `fed` and `cachedTokens`.
   */
  placed: boolean;
  /** Tokens still to be evaluated: the prompt (in chunks), then each sampled token (in `next`). */
  pending: Uint32Array;
  /** The one-token buffer `pending` points at while generating, reused every step. */
  next: Uint32Array;
  /** Position of the next token in the sequence. */
  position: number;
  /** The tokens in the sequence's KV cache (`position` of them), kept for the next request on it. */
  fed: number[];
  /** Prompt tokens found in the KV cache already (a common prefix with the sequence's last request). */
  cachedTokens: number;
  /** Set when a decode failed: the KV cache is in an unknown state and must be cleared. */
  cacheInvalid: boolean;
  output: TextOutput;
  completionTokens: number;
  promptTokens: number;
  maxTokens: number;
  onText: ((text: string, logprobs?: TokenLogprob[]) => void) | undefined;
  /** Set when the request asked for log probabilities. */
  logprobs: LogprobState | undefined;
  /** Set once the caller has its answer (finished, failed or aborted); the slot is released by the step loop. */
  settled: boolean;
  resolve(result: GenerationResult): void;
  reject(error: unknown): void;
  startedAt: number;
}

/** A generation's log probabilities: a greedy sampler without penalties reads the raw distribution. */
interface LogprobEntry {
  entry: TokenLogprob;
  start: number;
  end: number | undefined;
}

interface LogprobState {
  top: number;
  /** Made with the generation's sampler (see `Generation.sampler`). */
  sampler: NativeSampler | undefined;
  /**
   * One entry per generated token, with where its text starts and ends in the output
   * (`TextOutput.decodedLength` before and after it; no end while its bytes end inside a character).
   */
  entries: LogprobEntry[];
  /** Entries already streamed. */
  sent: number;
  /** The entry of the token just sampled, until `accept` takes it. */
  next: TokenLogprob | undefined;
}

/**
 * The sequences of one context of a loaded base model (BatcherGroup.ts holds a base's contexts) and the loop
 * that batches them: hands out sequences (reusing a KV-cache prefix when a prompt shares one), queues requests
 * when all are busy, and runs every active generation in each token step, then samples and streams each.
 *
 * Generations of the bare model and of its LoRA adapters share the context and its sequences. With the
 * mixed-adapter build (`npm run setup:adapters`) each sequence carries its own adapter and a step is one decode
 * whatever the mix: the base weights' products once for every token, each token's low-rank products with its
 * own sequence's adapter. With node-llama-cpp's prebuilt binaries llama.cpp applies adapters per context, to
 * every token of a decode, so a step decodes one group per adapter in use (the bare model is a group too),
 * switching the context's adapter before each: one decode per step when every generation uses the same
 * adapter, as many as there are adapters otherwise (bench/README.md §Serving many adapters measures both).
 */
export class SequenceBatcher {
  readonly model: LlamaModel;
  /** Tokens each sequence holds (prompt + completion). */
  readonly contextSize: number;
  private readonly context: LlamaContext;
  private readonly native: NativeBinding;
  /** Decodes read the model's adapter set: not while an adapter of the model loads or is freed. */
  private readonly adapterLock: AdapterSetLock;
  private readonly template: ChatTemplate;
  private readonly prompt: PromptModel;
  private readonly threads: number;
  private readonly promptThreads: number;
  private readonly batchSize: number;
  private readonly logger: SequenceBatcherOptions["logger"];
  private readonly onFinish: SequenceBatcherOptions["onFinish"];

  private readonly freeSequences: number[];
  /** When each sequence was last freed (`performance.now()`; absent: never used). */
  private readonly freedAt = new Map<number, number>();
  /** The tokens still in the KV cache of each free sequence (absent: empty), for prefix reuse. */
  private readonly cached = new Map<number, number[]>();
  /** The adapter key each cached sequence was evaluated under (absent: the bare model). */
  private readonly cachedAdapter = new Map<number, string>();
  /** Running generations by adapter key ("" for the bare model). */
  private readonly running = new Map<string, number>();
  /** Callers waiting for an adapter's last generation to end, by adapter key. */
  private readonly adapterIdle = new Map<string, (() => void)[]>();
  /** The adapter the context applies now (set before each decode; undefined: none; null: unknown). */
  private applied: BatchAdapter | undefined | null = undefined;
  /**
   * Per-sequence adapters (the mixed-adapter build): the adapter key each sequence applies now (absent: none;
   * {@link UNKNOWN_ADAPTER}: unknown, after a failed call).
   */
  private readonly sequenceAdapter = new Map<number, string>();
  /** Adapters to take off the context between two decodes before they are freed, with who waits. */
  private readonly forgetting: { key: string; done: () => void }[] = [];
  private readonly active = new Set<Generation>();
  /** Whether a token ends generation, by token (`isEogToken` is a native call; the vocabulary does not change). */
  private readonly eog = new Map<number, boolean>();
  private readonly waiters: Waiter[] = [];
  private stepping = false;
  /** Resolves when the step loop has stopped (used by unload and dispose). */
  private idlePromise: Promise<void> = Promise.resolve();
  private markIdle: () => void = () => {};
  /** Set by `close`: freed sequences are no longer handed to waiters, and the step loop is not restarted. */
  private closed = false;

  /** Binds the context's native handle; throws when node-llama-cpp's native API is not the expected one. */
  constructor(options: SequenceBatcherOptions) {
    this.model = options.model;
    this.context = options.context;
    this.template = options.template;
    this.contextSize = options.context.contextSize;
    this.threads = options.threads;
    this.promptThreads = options.promptThreads;
    this.batchSize = options.batchSize;
    this.logger = options.logger;
    this.onFinish = options.onFinish;
    this.native = bindNative(options.llama, options.model, options.context);
    this.adapterLock = adapterSetLock(options.model);
    this.native.context.setThreads(this.threads);
    this.prompt = {
      model: options.model,
      template: options.template,
      contextSize: this.contextSize,
      bos: options.model.tokens.shouldPrependBosToken ? (options.model.tokens.bos ?? undefined) : undefined,
      maxTokenBytes: longestTokenBytes(options.model),
      offLoop: options.tokenizer && options.file ? { thread: options.tokenizer, ...options.file } : undefined,
    };
    this.freeSequences = Array.from({ length: options.context.totalSequences }, (_, i) => i);
  }

  /** Generations running now. */
  get activeCount(): number {
    return this.active.size;
  }

  /**
   * The decodes of one step: adapters (the bare model counts as one) with generations running now, or 1 when
   * the context takes adapters per sequence.
   */
  get adaptersInUse(): number {
    return this.native.perSequenceAdapters ? Math.min(1, this.running.size) : this.running.size;
  }

  /** Requests waiting for a sequence. */
  get queuedCount(): number {
    return this.waiters.length;
  }

  /** Something runs or waits: the model must stay loaded. */
  get busy(): boolean {
    return this.active.size > 0 || this.waiters.length > 0;
  }

  /** Generations running now on `adapterKey` (`""`: on the bare model). */
  runningOn(adapterKey: string): number {
    return this.running.get(adapterKey) ?? 0;
  }

  /** Resolves once no generation runs on `adapterKey`. */
  idleOn(adapterKey: string): Promise<void> {
    if (this.runningOn(adapterKey) === 0) return Promise.resolve();
    return new Promise((resolve) => {
      const list = this.adapterIdle.get(adapterKey) ?? [];
      list.push(resolve);
      this.adapterIdle.set(adapterKey, list);
    });
  }

  /**
   * Takes the adapter `key` off the context (between two decodes) and drops the KV caches computed under it,
   * so that it can be freed. Call once no generation runs on it ({@link idleOn}).
   */
  forgetAdapter(key: string): Promise<void> {
    return new Promise((resolve) => {
      this.forgetting.push({ key, done: resolve });
      if (!this.stepping) this.applyForgets();
    });
  }

  /** Runs the pending {@link forgetAdapter}s; only between decodes. */
  private applyForgets(): void {
    for (const { key, done } of this.forgetting.splice(0)) {
      if (this.applied === null || this.applied?.key === key) {
        this.native.context.setLoras([], []);
        this.applied = undefined;
      }
      for (const [id, adapterKey] of this.sequenceAdapter)
        if (adapterKey === key || adapterKey === UNKNOWN_ADAPTER) {
          this.sequenceAdapter.delete(id);
          this.native.context.setSequenceLoras!(id, [], []);
        }
      for (const [id, adapterKey] of this.cachedAdapter)
        if (adapterKey === key) {
          this.cachedAdapter.delete(id);
          this.cached.delete(id);
          this.native.context.disposeSequence(id);
        }
      done();
    }
  }

  /** Resolves when the step loop has stopped. */
  idle(): Promise<void> {
    return this.idlePromise;
  }

  /** A request's prompt tokens (see {@link promptTokens}). */
  tokenize(request: GenerationRequest): Promise<number[]> {
    return promptTokens(this.prompt, request);
  }

  /**
   * A free sequence for `prompt` when one is free and nobody waits for one, by three rules in turn:
   * 1. the one whose KV cache shares the longest prefix with it, when that prefix is worth keeping (at least
   *    {@link MIN_REUSED_PREFIX} tokens): a next chat turn or a shared system prompt evaluates only what is new;
   * 2. then the one that keeps the sequences in use in the fewest runs of consecutive ids: one filling a gap
   *    between two sequences in use, else one next to a sequence in use. node-llama-cpp creates contexts with
   *    llama.cpp's `kv_unified = false` (one KV stream per sequence; no option reaches it), and llama.cpp then
   *    splits a decode into one pass over the weights per run of consecutive ids (`split_equal(…, sequential)`):
   *    one token on each of ids 0,2,4,6 decodes in 60 ms, on 0,1,2,3 in 48–52 (SmolLM2-135M, 1 thread);
   * 3. then the one freed longest ago, so that a prompt sharing only a BOS or a turn marker does not overwrite a
   *    recent conversation's cache.
   * Rule 2 trades cache retention for speed only while other sequences run: a sequence freed beside running
   * ones is taken again before colder ones elsewhere, so its cache lives shorter than under rule 3 alone. A
   * cache lost costs one evaluation of its prompt once; a gap costs one more pass over the weights on every step
   * while it lasts. With nothing running every free sequence scores alike, and rule 3 alone decides.
   */
  takeSequence(prompt: number[], adapter?: BatchAdapter): number | undefined {
    if (this.waiters.length > 0 || this.freeSequences.length === 0) return undefined;
    return this.freeSequences.splice(this.pickFree(prompt, adapter?.key).index, 1)[0];
  }

  /**
   * What {@link takeSequence} would hand out for `prompt` now: the KV-cache prefix that sequence reuses and when
   * it was freed (`0`: never used); `undefined` when it would hand out none. BatcherGroup.ts compares a base's
   * contexts by it.
   */
  offer(prompt: number[], adapter?: BatchAdapter): { prefix: number; freedAt: number } | undefined {
    if (this.waiters.length > 0 || this.freeSequences.length === 0) return undefined;
    const { index, prefix } = this.pickFree(prompt, adapter?.key);
    return { prefix, freedAt: this.freedAt.get(this.freeSequences[index]!) ?? 0 };
  }

  /**
   * The index in `freeSequences` of the sequence {@link takeSequence} hands out (see its rules), and the
   * KV-cache prefix it reuses (`0`: none).
   */
  private pickFree(prompt: number[], adapterKey: string | undefined): { index: number; prefix: number } {
    const free = this.freeSequences;
    const total = this.context.totalSequences;
    const isFree = new Uint8Array(total);
    for (const id of free) isFree[id] = 1;
    // In use: taken by a generation (running, or about to start).
    const inUse = (id: number) => id >= 0 && id < total && isFree[id] === 0;
    let best = 0;
    let bestPrefix = -1;
    let bestNeighbours = -1;
    // `free` runs from the one freed longest ago: on a tie the earlier one stays (rule 3).
    for (const [i, id] of free.entries()) {
      // A KV cache computed under another adapter (or none) is of no use.
      const shared =
        this.cachedAdapter.get(id) === adapterKey ? commonPrefix(this.cached.get(id) ?? [], prompt) : 0;
      const prefix = shared >= MIN_REUSED_PREFIX ? shared : 0;
      const neighbours = (inUse(id - 1) ? 1 : 0) + (inUse(id + 1) ? 1 : 0);
      if (prefix > bestPrefix || (prefix === bestPrefix && neighbours > bestNeighbours))
        [best, bestPrefix, bestNeighbours] = [i, prefix, neighbours];
    }
    return { index: best, prefix: bestPrefix };
  }

  /** Waits for the next freed sequence, in order of arrival; gives up with the signal's reason when it aborts. */
  waitForSequence(signal: AbortSignal | undefined): Promise<number> {
    return new Promise<number>((resolve, reject) => {
      const onAbort = () => {
        const index = this.waiters.indexOf(waiter);
        if (index !== -1) this.waiters.splice(index, 1);
        reject(signal?.reason);
      };
      const waiter: Waiter = {
        resolve: (id) => {
          signal?.removeEventListener("abort", onAbort);
          resolve(id);
        },
        reject: (error) => {
          signal?.removeEventListener("abort", onAbort);
          reject(error);
        },
      };
      this.waiters.push(waiter);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** Fails every waiting and running generation with `error`; the step loop then frees their sequences. */
  close(error: () => unknown): void {
    this.closed = true;
    for (const waiter of this.waiters.splice(0)) waiter.reject(error());
    for (const gen of this.active) settle(gen, () => gen.reject(error()));
  }

  /** Runs a generation on `sequenceId` (taken from this batcher) and answers when it ends. */
  start(
    sequenceId: number,
    prompt: number[],
    request: GenerationRequest,
    grammar: LlamaGrammar | undefined,
    adapter?: BatchAdapter,
  ): Promise<GenerationResult> {
    const { sampling, signal } = request;
    const model = this.model;
    // max_tokens is a cap: the generation also ends when the context is full (absent: only then).
    const maxTokens = Math.min(sampling.maxTokens ?? Infinity, this.contextSize - prompt.length);
    let grammarState: NativeGrammarState | undefined;
    try {
      // One grammar state per generation: the sampler advances it with every token it samples.
      grammarState = grammar ? this.native.createGrammarState(grammar) : undefined;
    } catch (error) {
      this.returnSequence(sequenceId);
      throw error;
    }
    const samplerConfig: NativeSamplerConfig = {
      temperature: sampling.temperature,
      topK: sampling.topK,
      topP: sampling.topP,
      seed: sampling.seed ?? crypto.randomInt(0, 2 ** 31),
      // OpenAI's presence/frequency penalties are llama.cpp's additive penalties (logit -= count * frequency +
      // (count > 0) * presence), applied to the tokens generated so far; the multiplicative repeat penalty stays
      // off (1). The history covers the whole completion; the sampler adds each sampled token itself.
      repeatPenalty: 1,
      // Capped like max_tokens: the native sampler allocates a history of this many tokens.
      repeatPenaltyMaxTokens: Math.max(1, maxTokens),
      repeatPenaltyTokens: new Uint32Array(0),
      repeatPenaltyPresencePenalty: sampling.presencePenalty,
      repeatPenaltyFrequencyPenalty: sampling.frequencyPenalty,
      ...(grammarState ? { grammarEvaluationState: grammarState } : {}),
    };
    const logprobs: LogprobState | undefined =
      request.logprobs !== undefined
        ? { top: request.logprobs, sampler: undefined, entries: [], sent: 0, next: undefined }
        : undefined;
    // A chat answer on the fallback ChatML template also ends at its turn markers: a model without ChatML
    // control tokens writes them as text (see CHATML_STOP_STRINGS). Raw prompts are left alone.
    const turnStops = request.messages !== undefined ? this.template.stopStrings : [];
    // A JSON grammar ends its value with whitespace and a run of newlines (node-llama-cpp's stop trigger),
    // which is not part of the answer.
    const grammarStops = (grammar?.stopGenerationTriggers ?? []).flatMap((t) =>
      typeof t === "string" ? [t] : Array.isArray(t) ? [] : [t.toString()],
    );
    const output = new TextOutput(
      (tokens, previous) => model.detokenize(tokens as Token[], false, previous as Token[]),
      [...(sampling.stop ?? []), ...turnStops, ...grammarStops],
      grammar?.trimWhitespaceSuffix === true,
    );
    return new Promise<GenerationResult>((resolve, reject) => {
      const gen: Generation = {
        sequenceId,
        adapter,
        sampler: undefined,
        samplerConfig,
        prompt,
        placed: false,
        pending: EMPTY,
        next: new Uint32Array(1),
        position: 0,
        fed: [],
        cachedTokens: 0,
        cacheInvalid: false,
        output,
        completionTokens: 0,
        promptTokens: prompt.length,
        maxTokens,
        onText: request.onText,
        logprobs,
        settled: false,
        resolve,
        reject,
        startedAt: performance.now(),
      };
      if (signal) {
        // Answer at once; the step loop frees the sequence before its next decode.
        const onAbort = () => settle(gen, () => reject(signal.reason));
        signal.addEventListener("abort", onAbort, { once: true });
        const cleanup = () => signal.removeEventListener("abort", onAbort);
        gen.resolve = (result) => (cleanup(), resolve(result));
        gen.reject = (error) => (cleanup(), reject(error));
      }
      this.active.add(gen);
      const key = adapter?.key ?? "";
      this.running.set(key, this.runningOn(key) + 1);
      this.ensureStepping();
    });
  }

  /**
   * Frees a generation's sequence. Only called between decode steps (the KV cache is not in use). What the
   * sequence evaluated stays in its KV cache, so that a next request sharing a prefix with it (the next turn
   * of a chat, the same system prompt) evaluates only what is new.
   */
  private releaseSequence(gen: Generation): void {
    if (!this.active.delete(gen)) return;
    const key = gen.adapter?.key ?? "";
    const left = this.runningOn(key) - 1;
    if (left > 0) this.running.set(key, left);
    else {
      this.running.delete(key);
      for (const resolve of this.adapterIdle.get(key) ?? []) resolve();
      this.adapterIdle.delete(key);
    }
    gen.sampler?.dispose();
    gen.logprobs?.sampler?.dispose();
    // Never placed (aborted before its first step): the sequence's cache is as the last request left it.
    if (!gen.placed) return this.returnSequence(gen.sequenceId);
    if (gen.cacheInvalid || gen.fed.length === 0) {
      this.native.context.disposeSequence(gen.sequenceId);
      this.cached.delete(gen.sequenceId);
      this.cachedAdapter.delete(gen.sequenceId);
    } else {
      this.cached.set(gen.sequenceId, gen.fed);
      if (gen.adapter) this.cachedAdapter.set(gen.sequenceId, gen.adapter.key);
      else this.cachedAdapter.delete(gen.sequenceId);
    }
    this.returnSequence(gen.sequenceId);
  }

  /**
   * Matches a new generation's prompt against its sequence's KV cache; fails the generation if that throws.
   * Runs in the step loop between two decodes: a request can arrive while a decode runs on libuv's pool, and
   * llama.cpp's KV cache must not change under it.
   */
  private place(gen: Generation): void {
    gen.placed = true;
    let reused: number;
    try {
      reused = this.reusePrefix(gen.sequenceId, gen.prompt, gen.adapter?.key);
    } catch (error) {
      gen.cacheInvalid = true;
      settle(gen, () => gen.reject(error));
      return;
    }
    gen.pending = Uint32Array.from(gen.prompt.slice(reused));
    gen.position = reused;
    gen.fed = gen.prompt.slice(0, reused);
    gen.cachedTokens = reused;
  }

  /**
   * Keeps the longest prefix of the sequence's KV cache that `prompt` starts with (at most all but the
   * prompt's last token, which is evaluated again for its logits) and drops the rest. Returns its length.
   */
  private reusePrefix(sequenceId: number, prompt: number[], adapterKey: string | undefined): number {
    const sameAdapter = this.cachedAdapter.get(sequenceId) === adapterKey;
    const cached = sameAdapter ? (this.cached.get(sequenceId) ?? []) : [];
    if (!sameAdapter && this.cached.has(sequenceId)) {
      this.native.context.disposeSequence(sequenceId);
      this.cached.delete(sequenceId);
      this.cachedAdapter.delete(sequenceId);
      return 0;
    }
    this.cached.delete(sequenceId);
    this.cachedAdapter.delete(sequenceId);
    const keep = Math.min(commonPrefix(cached, prompt), prompt.length - 1);
    if (keep === cached.length) return keep;
    // Models whose cache cannot drop a tail (recurrent ones) start again from an empty sequence.
    if (keep > 0 && this.native.context.removeTokenCellsFromSequence(sequenceId, keep, -1)) return keep;
    this.native.context.disposeSequence(sequenceId);
    return 0;
  }

  /** Hands a free sequence to the next waiter, or back to the pool. */
  private returnSequence(sequenceId: number): void {
    const next = this.waiters.shift();
    if (next && !this.closed) next.resolve(sequenceId);
    else {
      this.freeSequences.push(sequenceId);
      this.freedAt.set(sequenceId, performance.now());
    }
  }

  // ---- generation ----

  private ensureStepping(): void {
    if (this.stepping) return;
    this.stepping = true;
    this.idlePromise = new Promise<void>((resolve) => (this.markIdle = resolve));
    void this.stepLoop()
      .catch((error: unknown) => {
        // Not a decode error (those fail only their batch): something is badly wrong; fail everything running.
        this.logger("error", `step loop failed: ${error instanceof Error ? error.message : error}`);
        for (const gen of this.active) {
          settle(gen, () => gen.reject(error));
          try {
            this.releaseSequence(gen);
          } catch {
            this.active.delete(gen);
          }
        }
      })
      .finally(() => {
        this.stepping = false;
        this.applyForgets();
        this.markIdle();
        // A generation may have joined after the loop's last check.
        if (this.active.size > 0 && !this.closed) this.ensureStepping();
      });
  }

  /**
   * Continuous batching: each step evaluates the next token of every generating sequence plus chunks of new
   * prompts (up to `batchSize` tokens), in one decode per adapter in use, then samples every sequence that
   * produced logits.
   */
  private async stepLoop(): Promise<void> {
    const maxBatch = Math.min(this.batchSize, this.context.batchSize);
    // Reused every step (the native calls copy what they read): no batch objects, token arrays or sort per step
    // while every sequence is generating.
    const batch: Generation[] = [];
    const takes: number[] = [];
    const groupBatch: Generation[] = [];
    const groupTakes: number[] = [];
    while (this.active.size > 0) {
      this.applyForgets();
      for (const gen of this.active) if (gen.settled) this.releaseSequence(gen);
      for (const gen of this.active) if (!gen.placed) this.place(gen);
      for (const gen of this.active) if (gen.settled) this.releaseSequence(gen);
      if (this.active.size === 0) break;

      // Generating sequences (one pending token) first, so a long new prompt cannot stall running streams.
      batch.length = 0;
      takes.length = 0;
      let budget = maxBatch;
      let prompts = false;
      for (const gen of this.active) {
        if (gen.pending.length > 1) prompts = true;
        else if (budget > 0 && gen.pending.length === 1) {
          batch.push(gen);
          takes.push(1);
          budget--;
        }
      }
      if (prompts) {
        // Then the prompts, shortest first (a stable sort, as before: equal lengths keep their arrival order).
        const waiting = [...this.active].filter((g) => g.pending.length > 1);
        waiting.sort((a, b) => a.pending.length - b.pending.length);
        for (const gen of waiting) {
          if (budget === 0) break;
          const take = Math.min(gen.pending.length, budget);
          batch.push(gen);
          takes.push(take);
          budget -= take;
        }
      }
      // One decode per adapter in use unless the context takes adapters per sequence: llama.cpp's prebuilt
      // binaries apply a context's adapters to every token of a decode.
      const first = batch[0]?.adapter?.key;
      if (this.native.perSequenceAdapters || batch.every((gen) => gen.adapter?.key === first))
        await this.decode(batch, takes);
      else {
        const keys = [...new Set(batch.map((gen) => gen.adapter?.key ?? ""))];
        for (const key of keys) {
          groupBatch.length = 0;
          groupTakes.length = 0;
          for (let i = 0; i < batch.length; i++)
            if ((batch[i]!.adapter?.key ?? "") === key) {
              groupBatch.push(batch[i]!);
              groupTakes.push(takes[i]!);
            }
          await this.decode(groupBatch, groupTakes);
        }
      }
    }
  }

  // Reused by every decode (see stepLoop).
  private readonly logitAt: number[] = [];
  private readonly byId: number[] = [];
  private readonly sampleAt: Generation[] = [];
  private readonly sampleIndex: number[] = [];
  private readonly pendingSamples: Promise<number>[] = [];

  /** Gives each sequence of `batch` its generation's adapter (the mixed-adapter build), where it has another. */
  private applySequenceAdapters(batch: Generation[]): void {
    const ctx = this.native.context;
    for (const gen of batch) {
      const key = gen.adapter?.key;
      if (this.sequenceAdapter.get(gen.sequenceId) === key) continue;
      // Unknown until it succeeds: a failure must not leave the old adapter taken as applied.
      this.sequenceAdapter.set(gen.sequenceId, UNKNOWN_ADAPTER);
      const adapters = gen.adapter ? [gen.adapter.native] : [];
      ctx.setSequenceLoras!(gen.sequenceId, adapters, gen.adapter ? [gen.adapter.scale] : []);
      if (key === undefined) this.sequenceAdapter.delete(gen.sequenceId);
      else this.sequenceAdapter.set(gen.sequenceId, key);
    }
  }

  /**
   * One decode of `takes[i]` pending tokens of each of `batch` (generations of one adapter, or of any adapters
   * when the context takes them per sequence), then samples every
   * generation that produced logits. A failed decode fails its generations, never throws.
   */
  private async decode(batch: Generation[], takes: number[]): Promise<void> {
    const ctx = this.native.context;
    const { logitAt, byId, sampleAt, sampleIndex } = this;
    const pending = this.pendingSamples;
    let total = 0;
    for (const take of takes) total += take;
    // Only changes a field of the llama.cpp context when the count differs; no threads are kept between steps.
    if (this.promptThreads !== this.threads)
      ctx.setThreads(total >= PROMPT_BATCH_TOKENS ? this.promptThreads : this.threads);
    sampleAt.length = 0;
    sampleIndex.length = 0;
    try {
      const adapter = batch[0]?.adapter;
      if (this.native.perSequenceAdapters) this.applySequenceAdapters(batch);
      else if (this.applied === null || adapter?.key !== this.applied?.key) {
        // Unknown until it succeeds: a failure must not leave the old adapter taken as applied.
        this.applied = null;
        ctx.setLoras(adapter ? [adapter.native] : [], adapter ? [adapter.scale] : []);
        this.applied = adapter;
      }
      ctx.initBatch(total);
      // Tokens go into the batch by sequence id: llama.cpp's per-sequence KV streams make a decode of the same
      // tokens in another sequence order much slower (SmolLM2-135M, 8 sequences of one token: 57 ms in id
      // order, 81 ms shuffled). Sampling and streaming keep the order of `batch`.
      byId.length = 0;
      for (let i = 0; i < batch.length; i++) byId.push(i);
      byId.sort((a, b) => batch[a]!.sequenceId - batch[b]!.sequenceId);
      logitAt.length = batch.length;
      for (const i of byId) {
        const gen = batch[i]!;
        const take = takes[i]!;
        const logits = take === gen.pending.length;
        // addToBatch copies the tokens into llama.cpp's batch: views and shared arrays are safe.
        const tokens = logits ? gen.pending : gen.pending.subarray(0, take);
        const logitIndexes = !logits ? NONE : take === 1 ? FIRST : Uint32Array.of(take - 1);
        const indexes = ctx.addToBatch(gen.sequenceId, gen.position, tokens, logitIndexes);
        gen.position += take;
        if (take === 1) gen.fed.push(gen.pending[0]!);
        else for (let t = 0; t < take; t++) gen.fed.push(gen.pending[t]!);
        gen.pending = take === gen.pending.length ? EMPTY : gen.pending.subarray(take);
        logitAt[i] = logits ? (indexes[0] ?? -1) : -1;
      }
      for (let i = 0; i < batch.length; i++) {
        if (logitAt[i]! < 0) continue;
        sampleAt.push(batch[i]!);
        sampleIndex.push(logitAt[i]!);
      }
      const decoding = this.adapterLock.read(() => ctx.decodeBatch());
      // The samplers of generations sampling for the first time are made while the decode runs.
      this.prepareSamplers(sampleAt, sampleIndex);
      await decoding;
      if (sampleAt.length === 0) return;
      if (sampleAt.length === 1) {
        // One sequence (a single stream): no Promise.all round.
        const gen = sampleAt[0]!;
        const index = sampleIndex[0]!;
        this.accept(
          gen,
          await (gen.logprobs ? this.sampleWithLogprobs(gen, index) : ctx.sampleToken(index, gen.sampler!)),
        );
      } else {
        // Sampling runs on libuv's pool, one job per sequence, concurrently.
        pending.length = 0;
        for (let i = 0; i < sampleAt.length; i++) {
          const gen = sampleAt[i]!;
          pending.push(
            gen.logprobs
              ? this.sampleWithLogprobs(gen, sampleIndex[i]!)
              : ctx.sampleToken(sampleIndex[i]!, gen.sampler!),
          );
        }
        const tokens = await Promise.all(pending);
        for (let i = 0; i < sampleAt.length; i++) this.accept(sampleAt[i]!, tokens[i]!);
      }
    } catch (error) {
      // A failed decode leaves these sequences in an unknown state: fail them (and free their slots).
      for (const gen of batch) {
        gen.cacheInvalid = true;
        settle(gen, () => gen.reject(error));
      }
      this.logger("error", `decode failed: ${error instanceof Error ? error.message : error}`);
    }
  }

  /**
   * Makes the native samplers of the generations in `sampleAt` that have none yet. One that fails is failed and
   * taken out of `sampleAt` and `sampleIndex` (its sequence is released by the next step); never throws, so
   * that the decode running meanwhile is always awaited.
   */
  private prepareSamplers(sampleAt: Generation[], sampleIndex: number[]): void {
    let kept = 0;
    for (let i = 0; i < sampleAt.length; i++) {
      const gen = sampleAt[i]!;
      if (!gen.sampler) {
        try {
          const sampler = this.native.createSampler();
          gen.sampler = sampler;
          sampler.applyConfig(gen.samplerConfig);
          if (gen.logprobs) {
            // Greedy, no penalties, no grammar: its candidates are the raw logits of the whole vocabulary.
            const raw = this.native.createSampler();
            gen.logprobs.sampler = raw;
            raw.applyConfig(greedySamplerConfig());
          }
        } catch (error) {
          settle(gen, () => gen.reject(error));
          continue;
        }
      }
      sampleAt[kept] = gen;
      sampleIndex[kept++] = sampleIndex[i]!;
    }
    sampleAt.length = kept;
    sampleIndex.length = kept;
  }

  /**
   * Samples `gen`'s next token, then reads its log probability and the top alternatives from the same logits
   * with the generation's raw sampler (a second native call, only for requests that ask).
   */
  private async sampleWithLogprobs(gen: Generation, index: number): Promise<number> {
    const state = gen.logprobs!;
    const ctx = this.native.context;
    const token = await ctx.sampleToken(index, gen.sampler!);
    state.next = undefined;
    if (this.isEog(token)) return token;
    const [, , , pairs, weight] = await ctx.sampleToken(
      index,
      state.sampler!,
      false,
      false,
      [[token], false, false, false, Math.max(1, state.top)],
      true,
    );
    if (!pairs || pairs.length < 4 || weight === undefined)
      throw new Error("the native sampler returned no logits");
    // Pairs: the top logits, highest first, then the sampled token's. log p = logit − max − log Σ exp(l − max).
    const logZ = pairs[1]! + Math.log(weight);
    const topCount = Math.min(state.top, pairs.length / 2 - 1);
    // Token text in context, so a SentencePiece word start keeps its space.
    const previous = gen.fed.slice(-4) as Token[];
    const text = (t: number) => this.model.detokenize([t as Token], true, previous);
    const top: TokenLogprob["top"] = [];
    for (let i = 0; i < topCount; i++)
      top.push({ token: text(pairs[2 * i]!), logprob: pairs[2 * i + 1]! - logZ });
    state.next = { token: text(token), logprob: pairs[2 * topCount + 1]! - logZ, top };
    return token;
  }

  private accept(gen: Generation, token: number): void {
    if (gen.settled) return;
    if (this.isEog(token)) return this.finish(gen, "stop");
    gen.completionTokens++;
    if (gen.logprobs?.next)
      gen.logprobs.entries.push({
        entry: gen.logprobs.next,
        start: gen.output.decodedLength,
        end: undefined,
      });
    const piece = gen.output.push(token);
    if (gen.logprobs) endEntries(gen.logprobs.entries, gen.output.decodedLength);
    if (piece !== "" || gen.logprobs) this.stream(gen, piece);
    if (gen.settled) return;
    if (gen.output.stopped) return this.finish(gen, "stop");
    if (gen.completionTokens >= gen.maxTokens) return this.finish(gen, "length");
    gen.next[0] = token;
    gen.pending = gen.next;
  }

  /** A sampled token that ends the generation (-1: the sampler found none). */
  private isEog(token: number): boolean {
    if (token < 0) return true;
    let eog = this.eog.get(token);
    if (eog === undefined) this.eog.set(token, (eog = this.model.isEogToken(token as Token)));
    return eog;
  }

  /**
   * Streams `piece` with the log probabilities of the tokens whose text is now all in the streamed text (`last`:
   * the output is complete, and a token whose text runs past it is sent with the part in it; see
   * `answerLogprobs`).
   */
  private stream(gen: Generation, piece: string, last = false): void {
    if (!gen.onText) return;
    const logprobs = gen.logprobs ? takeLogprobs(gen.logprobs, gen.output.text, last) : undefined;
    if (piece === "" && (logprobs === undefined || logprobs.length === 0)) return;
    try {
      gen.onText(piece, logprobs);
    } catch (error) {
      // A throwing consumer ends its own generation, not the step loop.
      settle(gen, () => gen.reject(error));
    }
  }

  private finish(gen: Generation, finishReason: FinishReason): void {
    const rest = gen.output.finish();
    if (rest !== "" || gen.logprobs) this.stream(gen, rest, true);
    if (gen.settled) return;
    const result: GenerationResult = {
      text: gen.output.text,
      finishReason,
      promptTokens: gen.promptTokens,
      cachedTokens: gen.cachedTokens,
      completionTokens: gen.completionTokens,
      ...(gen.logprobs ? { logprobs: answerLogprobs(gen.logprobs.entries, gen.output.text) } : {}),
    };
    this.onFinish(result, performance.now() - gen.startedAt, gen.adapter?.key);
    settle(gen, () => gen.resolve(result));
    this.releaseSequence(gen);
  }
}

const EMPTY = new Uint32Array(0);
/** No logits wanted (`addToBatch`'s logit indexes). */
const NONE = new Uint32Array(0);
/** The logits of the first (only) token. */
const FIRST = Uint32Array.of(0);

/** Shorter shared prefixes are not worth taking a sequence that holds another conversation's cache. */
const MIN_REUSED_PREFIX = 16;

function commonPrefix(a: readonly number[], b: readonly number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

/** Ends the entries still open (their bytes ended inside a character) once the decoded text has passed them. */
function endEntries(entries: LogprobEntry[], decoded: number): void {
  for (let i = entries.length - 1; i >= 0 && entries[i]!.end === undefined; i--)
    if (decoded > entries[i]!.start) entries[i]!.end = decoded;
}

/**
 * The log probabilities of the tokens in the answer `text`, so that their texts join to it: a token whose
 * text is all past its end (a stop sequence, trimmed whitespace) is left out, and a token whose text runs past
 * its end (the start of a stop sequence) keeps its log probability but shows only the part in the answer (of
 * tokens decoded together as one character, the first shows that part, and the others are left out).
 */
function answerLogprobs(entries: readonly LogprobEntry[], text: string): TokenLogprob[] {
  const taken: TokenLogprob[] = [];
  for (let i = 0; i < entries.length && entries[i]!.start < text.length; i++) {
    const entry = answerPart(entries, i, text);
    if (entry) taken.push(entry);
  }
  return taken;
}

/**
 * Entry `i` as `answerLogprobs` shows it: whole, cut to its part in `text`, or `undefined` (no part in it).
 * Tokens decoded together (one character split across them) share a start: their part of `text` goes to them in
 * order, each taking its own text while that is what comes next, and the first that does not fit taking the rest.
 */
function answerPart(entries: readonly LogprobEntry[], i: number, text: string): TokenLogprob | undefined {
  const e = entries[i]!;
  if (e.end !== undefined && e.end <= text.length) return e.entry;
  let first = i;
  while (first > 0 && entries[first - 1]!.start === e.start) first--;
  let rest = text.slice(e.start, e.end ?? text.length);
  for (let j = first; j <= i; j++) {
    const own = entries[j]!.entry.token;
    if (rest === "") return undefined;
    if (own !== "" && rest.startsWith(own) && j < i) rest = rest.slice(own.length);
    else if (j < i) rest = "";
    else return rest.startsWith(own) ? e.entry : { ...e.entry, token: rest };
  }
  return undefined;
}

/**
 * The entries not streamed yet whose text is all in the streamed `text`; `last`: the text is the whole
 * answer, and the rest of those in it are taken too (see `answerLogprobs`).
 */
function takeLogprobs(state: LogprobState, text: string, last: boolean): TokenLogprob[] {
  const taken: TokenLogprob[] = [];
  for (; state.sent < state.entries.length; state.sent++) {
    const e = state.entries[state.sent]!;
    if (e.end !== undefined && e.end <= text.length) taken.push(e.entry);
    else if (last && e.start < text.length) {
      const entry = answerPart(state.entries, state.sent, text);
      if (entry) taken.push(entry);
    } else break;
  }
  return taken;
}

function settle(gen: Generation, answer: () => void): void {
  if (gen.settled) return;
  gen.settled = true;
  answer();
}
