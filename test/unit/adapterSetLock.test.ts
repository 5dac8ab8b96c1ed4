import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { AdapterSetLock } from "../../src/engine/adapterSetLock.ts";

/** A call that records its start and end and ends when `finish` is called. */
function call(log: string[], name: string): { fn: () => Promise<string>; finish: () => void } {
  let finish!: () => void;
  const done = new Promise<void>((resolve) => (finish = resolve));
  return {
    fn: async () => {
      log.push(`${name}+`);
      await done;
      log.push(`${name}-`);
      return name;
    },
    finish,
  };
}

/** Lets every pending promise callback run. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

describe("a model's adapter-set lock", () => {
  test("reads run together; a write waits for them and runs alone; reads after it wait for it", async () => {
    const lock = new AdapterSetLock();
    const log: string[] = [];
    const [r1, r2, w, r3] = [call(log, "r1"), call(log, "r2"), call(log, "w"), call(log, "r3")];
    const results = [lock.read(r1.fn), lock.read(r2.fn), lock.write(w.fn), lock.read(r3.fn)];
    await settle();
    assert.deepEqual(log, ["r1+", "r2+"]);
    assert.deepEqual(lock.state, { reading: 2, writing: false, waiting: 2 });
    r1.finish();
    await settle();
    assert.deepEqual(log, ["r1+", "r2+", "r1-"], "the write waits for every read in flight");
    r2.finish();
    await settle();
    assert.deepEqual(log.slice(3), ["r2-", "w+"]);
    assert.deepEqual(lock.state, { reading: 0, writing: true, waiting: 1 });
    w.finish();
    await settle();
    assert.deepEqual(log.slice(5), ["w-", "r3+"]);
    r3.finish();
    assert.deepEqual(await Promise.all(results), ["r1", "r2", "w", "r3"]);
    assert.deepEqual(lock.state, { reading: 0, writing: false, waiting: 0 });
  });

  test("writes run one at a time in arrival order; a failed one gives its turn on", async () => {
    const lock = new AdapterSetLock();
    const log: string[] = [];
    const first = lock.write(async () => {
      log.push("first");
      await settle();
      throw new Error("no such adapter");
    });
    const second = lock.write(async () => {
      log.push("second");
      return 2;
    });
    await assert.rejects(first, /no such adapter/);
    assert.equal(await second, 2);
    assert.deepEqual(log, ["first", "second"]);
    assert.deepEqual(lock.state, { reading: 0, writing: false, waiting: 0 });
  });

  test("a read that throws synchronously releases its turn", async () => {
    const lock = new AdapterSetLock();
    await assert.rejects(
      lock.read(() => {
        throw new Error("decode refused");
      }),
      /decode refused/,
    );
    assert.equal(await lock.write(async () => "alone"), "alone");
  });
});
