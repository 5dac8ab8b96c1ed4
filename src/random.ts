/**
 * Seeded randomness: the same seed gives the same training split and order, and the same generated
 * tiny model, on every machine.
 */

/**
 * Uniform numbers in [0, 1) from mulberry32. Only integer arithmetic and one division: unlike
 * `Math.random`-style Box–Muller with `Math.log`/`Math.cos`, the result is bit-identical on every
 * platform and Node version, so a seed always names the same file.
 */
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

/** {@link shuffledOrder} as 4 bytes per index (the same permutation for the same random numbers). */
export function shuffledIndices(n: number, random: () => number): Uint32Array {
  const order = new Uint32Array(n);
  for (let i = 0; i < n; i++) order[i] = i;
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    const swap = order[i]!;
    order[i] = order[j]!;
    order[j] = swap;
  }
  return order;
}
