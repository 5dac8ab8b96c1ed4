import koffi from "koffi";

/** glibc's `mallopt` parameter for the size from which an allocation gets pages of its own (`M_MMAP_THRESHOLD`). */
const M_MMAP_THRESHOLD = -3;

let applied = false;

/**
 * Keeps freed native memory from staying resident: glibc serves an allocation of 128 KiB or more with pages of
 * its own, returned to the system when it is freed, until such a block is freed — then it raises that threshold
 * (up to 32 MiB) and serves later ones from the heap, whose freed pages stay with the process. Loading and
 * serving LoRA adapters allocate and free such blocks: 10 rank-16 adapters of SmolLM2 in use kept 19 MB
 * resident each for 7.9 MiB of tensors (bench/loraServe.ts). With the threshold fixed at its starting value an
 * adapter costs about its tensors. Elsewhere than glibc on Linux it does nothing.
 */
export function keepFreedMemoryReturnable(): void {
  if (process.platform !== "linux" || applied) return;
  applied = true;
  try {
    const mallopt = koffi.load("libc.so.6").func("int mallopt(int param, int value)");
    mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  } catch {
    // Not glibc (musl, say): its allocator returns large blocks by itself.
  }
}
