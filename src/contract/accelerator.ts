/**
 * The accelerator settings' vocabulary, shared by the config (which reads them), the engine (which acts on
 * them) and `/healthz` (which shows them). Imports nothing.
 */

/**
 * `CONDUIT_GPU`: which compute backend generation and training use. `auto` takes a GPU when node-llama-cpp's
 * prebuilt binaries find a working one (CUDA first, then Vulkan) and is the CPU otherwise, with nothing to
 * install or download; `cuda` and `vulkan` insist (the server does not start without one); `off` is the CPU.
 */
export const GPU_SETTINGS = ["auto", "cuda", "vulkan", "off"] as const;
export type GpuSetting = (typeof GPU_SETTINGS)[number];

/** `CONDUIT_GPU_LAYERS`: layers offloaded to the GPU, `all` (the default) or a count; ignored on the CPU. */
export type GpuLayers = "all" | number;

/**
 * `CONDUIT_ADAPTER_BATCHING`: how generations of different LoRA adapters share a decode. `auto` serves any mix
 * in one decode with the mixed-adapter build when `npm run setup:adapters` made it (on the CPU), and groups them
 * by adapter otherwise; `grouped` always groups (one decode per adapter in use each token step).
 */
export const ADAPTER_BATCHING_SETTINGS = ["auto", "grouped"] as const;
export type AdapterBatchingSetting = (typeof ADAPTER_BATCHING_SETTINGS)[number];
