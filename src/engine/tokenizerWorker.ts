/**
 * The tokenizer's worker thread (see `TokenizerThread.ts`): loads models' vocabularies alone (`vocabOnly`) and
 * tokenizes prompts with them, off the event loop. A vocabulary is read from the file the engine loaded (its
 * `fileIdentity` the same before and after the read, else the engine tokenizes itself).
 */
import { parentPort } from "node:worker_threads";
import { getLlama, LlamaLogLevel, type Llama, type LlamaModel } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import type { RenderedSegments } from "../model/chatTemplate.ts";
import { fileIdentity } from "../model/fileIdentity.ts";
import { chatTokens } from "./promptTokens.ts";

/**
 * What to tokenize: a chat prompt's rendered segments, or a raw prompt (special tokens parsed unless `special` is
 * `false`, as for a text to embed).
 */
export type TokenizeJob = { rendered: RenderedSegments } | { text: string; special?: boolean };

export interface TokenizeRequest {
  id: number;
  /** The model file and its identity when the engine loaded it. */
  path: string;
  identity: string;
  job: TokenizeJob;
}

export type TokenizeAnswer =
  | { id: number; tokens: Uint32Array }
  | { id: number; refused: { message: string; param: string | null } }
  | { id: number; unavailable: string };

/** Vocabularies kept at once; the least recently used goes past it. */
const KEPT = 4;

let llama: Promise<Llama> | undefined;
const vocabularies = new Map<string, Promise<LlamaModel>>();

async function vocabulary(path: string, identity: string): Promise<LlamaModel | undefined> {
  const key = `${path}\0${identity}`;
  let model = vocabularies.get(key);
  if (model === undefined) {
    if (fileIdentity(path) !== identity) return undefined;
    llama ??= getLlama({ gpu: false, build: "never", logLevel: LlamaLogLevel.error, logger: () => {} });
    const l = await llama;
    model = l.loadModel({ modelPath: path, vocabOnly: true, useMmap: false });
    vocabularies.set(key, model);
    while (vocabularies.size > KEPT) {
      const [oldest, evicted] = vocabularies.entries().next().value!;
      vocabularies.delete(oldest);
      void evicted.then((m) => m.dispose()).catch(() => {});
    }
  } else {
    vocabularies.delete(key);
    vocabularies.set(key, model);
  }
  const loaded = await model;
  // Changed while it was read: not the vocabulary the engine serves.
  if (fileIdentity(path) !== identity) {
    vocabularies.delete(key);
    return undefined;
  }
  return loaded;
}

async function answer({ id, path, identity, job }: TokenizeRequest): Promise<TokenizeAnswer> {
  try {
    const model = await vocabulary(path, identity);
    if (model === undefined) return { id, unavailable: `${path} changed since it was loaded` };
    const tokenize = (text: string, special: boolean) => model.tokenize(text, special) as number[];
    const tokens =
      "rendered" in job ? chatTokens(job.rendered, tokenize) : tokenize(job.text, job.special ?? true);
    return { id, tokens: Uint32Array.from(tokens) };
  } catch (error) {
    if (error instanceof ConduitError) return { id, refused: { message: error.message, param: error.param } };
    return { id, unavailable: error instanceof Error ? error.message : String(error) };
  }
}

parentPort?.on("message", (request: TokenizeRequest) => {
  void answer(request).then((reply) =>
    parentPort!.postMessage(reply, "tokens" in reply ? [reply.tokens.buffer as ArrayBuffer] : []),
  );
});
