import type { LlamaModel } from "node-llama-cpp";

/**
 * llama.cpp keeps a model's LoRA adapters in a plain `std::unordered_set` (`llama_model::loras`): loading an
 * adapter (`llama_adapter_lora_init`) inserts into it, freeing one erases from it, and a context reads it whenever
 * it reserves its compute graph (at its creation, and at the first decode after its adapters change).
 * node-llama-cpp runs each of these on a thread of libuv's pool with no lock, so two adapters of one model loaded
 * or freed at once corrupt the heap (8 adapters loaded together then freed together crashed the process within 26–162
 * such rounds; test/model/adapters.test.ts). Every such call on a model goes through the model's lock: changes to its
 * adapters one at a time with nothing else in flight; decodes and context creations together.
 *
 * A change waiting for its turn holds off the decodes that come after it (they would otherwise keep it waiting as
 * long as generations run); it waits for the decodes in flight.
 */
export class AdapterSetLock {
  private readers = 0;
  private writing = false;
  private readonly queue: { write: boolean; start: () => void }[] = [];

  /** Runs `fn` (a decode, a context's creation) beside the others, but not during a change of the adapters. */
  read<T>(fn: () => Promise<T>): Promise<T> {
    if (this.writing || this.queue.length > 0) return this.wait(false).then(() => this.held(false, fn));
    this.readers++;
    return this.held(false, fn);
  }

  /** Runs `fn` (an adapter's load or free) alone. */
  write<T>(fn: () => Promise<T>): Promise<T> {
    if (this.writing || this.readers > 0 || this.queue.length > 0)
      return this.wait(true).then(() => this.held(true, fn));
    this.writing = true;
    return this.held(true, fn);
  }

  /** Calls in flight and waiting, for tests. */
  get state(): { reading: number; writing: boolean; waiting: number } {
    return { reading: this.readers, writing: this.writing, waiting: this.queue.length };
  }

  private wait(write: boolean): Promise<void> {
    return new Promise((start) => this.queue.push({ write, start }));
  }

  /** Runs `fn` under the turn already taken for it, then gives the turn on. */
  private async held<T>(write: boolean, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } finally {
      if (write) this.writing = false;
      else this.readers--;
      this.next();
    }
  }

  /** Gives turns in arrival order: every reader up to the next writer, or that writer once no reader is left. */
  private next(): void {
    while (this.queue.length > 0 && !this.writing) {
      const first = this.queue[0]!;
      if (first.write) {
        if (this.readers > 0) return;
        this.writing = true;
      } else this.readers++;
      this.queue.shift();
      first.start();
    }
  }
}

const locks = new WeakMap<LlamaModel, AdapterSetLock>();

/** The lock of `model`'s adapter set: one per loaded model, shared by every context and adapter of it. */
export function adapterSetLock(model: LlamaModel): AdapterSetLock {
  let lock = locks.get(model);
  if (lock === undefined) locks.set(model, (lock = new AdapterSetLock()));
  return lock;
}
