/**
 * Worker thread of bench/nativeLoop.ts: decodes synchronously on its own thread (the decode blocks this worker,
 * never the main thread's event loop) and posts each token to the main thread as soon as it has it.
 */
import { parentPort, workerData } from "node:worker_threads";
import { koffiDecoder } from "./koffiDecode.ts";

const { file, threads } = workerData as { file: string; threads: number };
const decoder = koffiDecoder(file, threads, false);
const port = parentPort!;
port.on("message", ({ bos, tokens }: { bos: number; tokens: number }) => {
  decoder.clear();
  let token = bos;
  for (let i = 0; i < tokens; i++) port.postMessage((token = decoder.step(token)));
  port.postMessage(-1);
});
port.postMessage("ready");
