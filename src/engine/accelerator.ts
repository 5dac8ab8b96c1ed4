import type { Llama } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import type { GpuLayers, GpuSetting } from "../contract/accelerator.ts";
import type { AdapterBatching } from "./mixedAdapterBuild.ts";
export type { GpuLayers, GpuSetting };

/** The compute backend in use: `cpu` when no GPU is used. */
export type Backend = "cpu" | "cuda" | "vulkan" | "metal";

/** What generation runs on, for the start log line and `/healthz`. */
export interface AcceleratorInfo {
  /** `CONDUIT_GPU` as set. */
  setting: GpuSetting;
  backend: Backend;
  /** GPU device names (empty on the CPU). */
  devices: string[];
  /** Layers each model offloads (`0` on the CPU). */
  gpuLayers: GpuLayers | 0;
  /** The GPUs' memory, summed over devices; absent on the CPU. */
  gpuMemory?: { totalBytes: number; usedBytes: number; freeBytes: number };
  /** How generations of different LoRA adapters share a decode (mixedAdapterBuild.ts); absent: not known. */
  adapters?: AdapterBatching;
}

/** node-llama-cpp's `getLlama({ gpu })` for a setting. */
export function llamaGpuOption(setting: GpuSetting): false | "auto" | "cuda" | "vulkan" {
  return setting === "off" ? false : setting;
}

/** The backend a node-llama-cpp instance ended up with. */
export function backendOf(llama: Llama): Backend {
  return llama.gpu === false ? "cpu" : llama.gpu;
}

/** `gpuLayers` for `llama.loadModel`: none on the CPU, every layer for `all`, else the count. */
export function modelGpuLayers(backend: Backend, layers: GpuLayers): number | "max" {
  if (backend === "cpu") return 0;
  return layers === "all" ? "max" : layers;
}

export async function describeAccelerator(
  llama: Llama,
  setting: GpuSetting,
  layers: GpuLayers,
): Promise<AcceleratorInfo> {
  const backend = backendOf(llama);
  if (backend === "cpu") return { setting, backend, devices: [], gpuLayers: 0 };
  const [devices, vram] = await Promise.all([llama.getGpuDeviceNames(), llama.getVramState()]);
  return {
    setting,
    backend,
    devices,
    gpuLayers: layers,
    gpuMemory: { totalBytes: vram.total, usedBytes: vram.used, freeBytes: vram.free },
  };
}

/**
 * The error when `CONDUIT_GPU` names a backend node-llama-cpp cannot use here: what was asked, why, and the
 * two ways out (install what the prebuilt binaries need, or let `auto` fall back to the CPU).
 */
export function gpuUnavailable(setting: GpuSetting, cause: unknown): ConduitError {
  const reason = cause instanceof Error ? cause.message : String(cause);
  const needs =
    setting === "cuda"
      ? "an NVIDIA driver and the CUDA runtime the prebuilt binaries link against (see docs/operations.md, 'GPU')"
      : "a Vulkan driver (libvulkan) for the GPU";
  return new ConduitError(
    "unavailable",
    `CONDUIT_GPU=${setting}, but no ${setting === "cuda" ? "CUDA" : "Vulkan"} build of llama.cpp works on this ` +
      `machine (${reason}). It needs ${needs}; set CONDUIT_GPU=auto to use the CPU when there is no GPU.`,
    { cause },
  );
}

/** One line for the start log: `cpu`, or `cuda on NVIDIA H100 (79.1 GiB free of 79.6 GiB), all layers`. */
export function describeBackend(info: AcceleratorInfo): string {
  return describeDevice(info) + describeAdapters(info.adapters);
}

/** `; adapters: one decode for any mix (…)`, or how and why they are grouped. */
function describeAdapters(adapters: AdapterBatching | undefined): string {
  if (adapters === undefined) return "";
  return adapters.batching === "per-sequence"
    ? `; adapters: one decode for any mix of adapters (mixed-adapter build ${adapters.build})`
    : `; adapters: one decode per adapter in use (${adapters.reason})`;
}

function describeDevice(info: AcceleratorInfo): string {
  if (info.backend === "cpu")
    return info.setting === "auto" ? "cpu (CONDUIT_GPU=auto found no usable GPU)" : "cpu";
  const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(1)} GiB`;
  const memory = info.gpuMemory
    ? ` (${gib(info.gpuMemory.freeBytes)} free of ${gib(info.gpuMemory.totalBytes)})`
    : "";
  const layers = info.gpuLayers === "all" ? "all layers" : `${info.gpuLayers} layers`;
  return `${info.backend} on ${info.devices.join(", ") || "an unnamed device"}${memory}, ${layers} offloaded`;
}
