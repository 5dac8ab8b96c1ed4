import {
  GGML_BACKEND_DEVICE_TYPE_GPU,
  type LlamaLib,
  type Pointer,
  type ComputeDevice,
} from "../libllama/llamaLib.ts";

/** A GPU ggml registered: its backend library loaded and found the device. */
export interface GpuDevice {
  pointer: Pointer;
  name: string;
  description: string;
}

/** The GPUs ggml registered once `ggml_backend_load_all_from_path` has run (none on a CPU-only machine). */
export function gpuDevices(lib: LlamaLib): GpuDevice[] {
  const devices: GpuDevice[] = [];
  for (let i = 0; i < Number(lib.ggml_backend_dev_count()); i++) {
    const pointer = lib.ggml_backend_dev_get(i);
    if (lib.ggml_backend_dev_type(pointer) !== GGML_BACKEND_DEVICE_TYPE_GPU) continue;
    devices.push({
      pointer,
      name: lib.ggml_backend_dev_name(pointer),
      description: lib.ggml_backend_dev_description(pointer),
    });
  }
  return devices;
}

/** Free and total bytes of a device's memory. */
export function deviceMemory(lib: LlamaLib, device: GpuDevice): { freeBytes: number; totalBytes: number } {
  const free: [number] = [0];
  const total: [number] = [0];
  lib.ggml_backend_dev_memory(device.pointer, free, total);
  return { freeBytes: Number(free[0]), totalBytes: Number(total[0]) };
}

/**
 * The GPU memory a trainer takes, as the drop of the devices' free memory from when it started: sampled at
 * every progress report, so `peakBytes` is the largest drop seen (other processes on the GPU count too).
 */
export class GpuMemoryWatch {
  private readonly freeAtStart: number[];
  peakBytes = 0;

  constructor(
    private readonly lib: LlamaLib,
    private readonly devices: GpuDevice[],
  ) {
    this.freeAtStart = devices.map((d) => deviceMemory(lib, d).freeBytes);
  }

  sample(): void {
    let used = 0;
    for (const [i, device] of this.devices.entries())
      used += Math.max(0, this.freeAtStart[i]! - deviceMemory(this.lib, device).freeBytes);
    this.peakBytes = Math.max(this.peakBytes, used);
  }
}

/**
 * Ops of the training graph a GPU device cannot run. ggml's scheduler runs each of them on the CPU (copying its
 * inputs across), which is correct but slow: e.g. CUDA's OUT_PROD takes only F32 operands, so the backward pass
 * through quantized base weights (QLoRA) runs on the CPU. Checked on the graphs of the first training step.
 */
export class OffloadAudit {
  private readonly missing = new Map<string, number>();
  private active: boolean;

  constructor(
    private readonly lib: LlamaLib,
    private readonly device: GpuDevice | undefined,
  ) {
    this.active = device !== undefined;
  }

  /** Called for each node the scheduler asks about. */
  check(tensor: Pointer, op: number): void {
    if (!this.active || this.lib.ggml_backend_dev_supports_op(this.device!.pointer, tensor)) return;
    const name = this.lib.ggml_op_name(op);
    this.missing.set(name, (this.missing.get(name) ?? 0) + 1);
  }

  /** Ends the audit: a log line naming the ops left to the CPU, or undefined when every op runs on the GPU. */
  finish(device: ComputeDevice): string | undefined {
    if (!this.active) return undefined;
    this.active = false;
    if (this.missing.size === 0) return undefined;
    const ops = [...this.missing].map(([name, count]) => `${name} ×${count}`).join(", ");
    return (
      `trainer: ${this.device!.name} (${device}) cannot run ${ops} of a training step; ggml runs ` +
      `${this.missing.size === 1 ? "it" : "them"} on the CPU, copying the inputs across (slower, same result)`
    );
  }
}
