/**
 * Which compute backend Conduit's two native paths get on this machine, in a few seconds and without a model:
 *
 *   node --import tsx bench/gpu/check.ts engine [cuda|vulkan|off]    # node-llama-cpp, as the engine asks for it
 *   node --import tsx bench/gpu/check.ts trainer [cuda|vulkan|cpu]   # the trainer's koffi-loaded libllama
 *
 * `engine` calls `getLlama` the way src/engine/ModelPool.ts does (prebuilt binaries only, no build) and prints
 * the backend, the GPU names and their memory. `trainer` loads the libllama the trainer would
 * (src/train/native/llamaLib.ts's findBinDir), loads ggml's backends from its folder and lists the devices ggml
 * registered. One mode per process: both would load the same libraries and register the backends twice.
 * Exits 1 when a GPU was asked for and none came up.
 */
import { getLlama, LlamaLogLevel } from "node-llama-cpp";
import { deviceMemory, gpuDevices } from "../../src/train/native/devices.ts";
import { loadLlamaLib } from "../../src/train/libllama/llamaLib.ts";

const [mode = "engine", backend = "cuda"] = process.argv.slice(2);
const gib = (bytes: number) => `${(bytes / 2 ** 30).toFixed(1)} GiB`;

if (mode === "engine") {
  const started = performance.now();
  const llama = await getLlama({
    gpu: backend === "off" || backend === "cpu" ? false : (backend as "cuda" | "vulkan"),
    build: "never",
    maxThreads: 0,
    logLevel: LlamaLogLevel.warn,
  });
  const vram = llama.gpu === false ? undefined : await llama.getVramState();
  console.log(
    `engine: node-llama-cpp gpu=${llama.gpu} devices=${JSON.stringify(await llama.getGpuDeviceNames())}` +
      (vram ? ` vram free ${gib(vram.free)} of ${gib(vram.total)}` : "") +
      ` build=${llama.buildType} llama.cpp=${llama.llamaCppRelease.release} ` +
      `(getLlama ${((performance.now() - started) / 1000).toFixed(1)} s)`,
  );
  await llama.dispose();
  if (backend !== "off" && backend !== "cpu" && llama.gpu !== backend) process.exit(1);
} else if (mode === "trainer") {
  const gpu = backend === "off" ? "cpu" : (backend as "cpu" | "cuda" | "vulkan");
  const lib = loadLlamaLib({ gpu });
  lib.ggml_backend_load_all_from_path(lib.binDir);
  lib.llama_backend_init();
  const devices = gpuDevices(lib);
  const all: string[] = [];
  for (let i = 0; i < Number(lib.ggml_backend_dev_count()); i++)
    all.push(lib.ggml_backend_dev_name(lib.ggml_backend_dev_get(i)));
  console.log(
    `trainer: llama.cpp ${lib.llama_version()} from ${lib.binDir}; ggml devices ${JSON.stringify(all)}; GPUs: ` +
      (devices
        .map((d) => {
          const { freeBytes, totalBytes } = deviceMemory(lib, d);
          return `${d.name} ${d.description} (${gib(freeBytes)} free of ${gib(totalBytes)})`;
        })
        .join(", ") || "none"),
  );
  lib.llama_backend_free();
  if (gpu !== "cpu" && devices.length === 0) process.exit(1);
} else {
  throw new Error(`mode is engine or trainer, not ${mode}`);
}
