import type { LlamaGrammar } from "node-llama-cpp";
import type { BatchAdapter, SequenceBatcher } from "./SequenceBatcher.ts";
import type { GenerationRequest, GenerationResult } from "./types.ts";

/** A sequence taken from one batcher of a group: start the generation on that batcher. */
export interface SequenceTicket {
  batcher: SequenceBatcher;
  sequenceId: number;
}

/**
 * The contexts that serve one loaded base, each with its batcher: the base's sequences split among them (the
 * same KV cache in all as one context would hold). Generations are grouped by adapter onto contexts, so the
 * decodes of different adapters run side by side on libuv's thread pool instead of one after another on one
 * context (bench/README.md §Serving many adapters measures it).
 *
 * A generation goes to the context with a free sequence whose KV cache shares the longest prefix with its prompt
 * (SequenceBatcher's rule 1), else to one already running its adapter, else to the one with the fewest
 * adapters in use, the fewest generations, and the sequence freed longest ago; with none free it waits on the
 * context running its adapter, else the one with the shortest queue.
 */
export class BatcherGroup {
  readonly batchers: readonly SequenceBatcher[];

  constructor(batchers: SequenceBatcher[]) {
    if (batchers.length === 0) throw new Error("A batcher group needs at least one batcher.");
    this.batchers = batchers;
  }

  /** Tokens per sequence (alike on every context). */
  get contextSize(): number {
    return this.batchers[0]!.contextSize;
  }

  tokenize(request: GenerationRequest): Promise<number[]> {
    return this.batchers[0]!.tokenize(request);
  }

  /** A free sequence for a generation on `adapter` (none: the bare model), or `undefined` when none is free. */
  takeSequence(prompt: number[], adapter: BatchAdapter | undefined): SequenceTicket | undefined {
    const key = adapter?.key ?? "";
    const offers = this.batchers.flatMap((batcher) => {
      const offer = batcher.offer(prompt, adapter);
      return offer ? [{ batcher, ...offer }] : [];
    });
    offers.sort(
      (a, b) =>
        b.prefix - a.prefix ||
        Number(b.batcher.runningOn(key) > 0) - Number(a.batcher.runningOn(key) > 0) ||
        a.batcher.adaptersInUse - b.batcher.adaptersInUse ||
        a.batcher.activeCount - b.batcher.activeCount ||
        a.freedAt - b.freedAt,
    );
    const batcher = offers[0]?.batcher;
    const sequenceId = batcher?.takeSequence(prompt, adapter);
    return batcher && sequenceId !== undefined ? { batcher, sequenceId } : undefined;
  }

  /** Waits for a sequence freed on the context chosen for `adapter`; gives up when `signal` aborts. */
  async waitForSequence(
    adapter: BatchAdapter | undefined,
    signal: AbortSignal | undefined,
  ): Promise<SequenceTicket> {
    const key = adapter?.key ?? "";
    const batcher = [...this.batchers].sort(
      (a, b) => Number(b.runningOn(key) > 0) - Number(a.runningOn(key) > 0) || a.queuedCount - b.queuedCount,
    )[0]!;
    return { batcher, sequenceId: await batcher.waitForSequence(signal) };
  }

  start(
    ticket: SequenceTicket,
    prompt: number[],
    request: GenerationRequest,
    grammar: LlamaGrammar | undefined,
    adapter: BatchAdapter | undefined,
  ): Promise<GenerationResult> {
    return ticket.batcher.start(ticket.sequenceId, prompt, request, grammar, adapter);
  }

  /** Generations running now on `adapterKey` (`""`: on the bare model), on every context. */
  runningOn(adapterKey: string): number {
    return this.batchers.reduce((n, b) => n + b.runningOn(adapterKey), 0);
  }

  /** Resolves once no generation runs on `adapterKey` on any context. */
  async idleOn(adapterKey: string): Promise<void> {
    await Promise.all(this.batchers.map((b) => b.idleOn(adapterKey)));
  }

  /** Takes the adapter off every context and drops the KV caches computed under it. */
  async forgetAdapter(key: string): Promise<void> {
    await Promise.all(this.batchers.map((b) => b.forgetAdapter(key)));
  }

  get activeCount(): number {
    return this.batchers.reduce((n, b) => n + b.activeCount, 0);
  }

  idle(): Promise<void> {
    return Promise.all(this.batchers.map((b) => b.idle())).then(() => {});
  }

  close(error: () => unknown): void {
    for (const b of this.batchers) b.close(error);
  }
}
