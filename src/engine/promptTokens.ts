import type { LlamaModel } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import type { ChatTemplate, RenderedSegments } from "../model/chatTemplate.ts";
import type { TokenizerThread } from "./TokenizerThread.ts";
import type { GenerationRequest } from "./types.ts";

/** What tokenizing a request needs of a loaded model (read at load, so formatting a request never waits). */
export interface PromptModel {
  model: LlamaModel;
  template: ChatTemplate;
  contextSize: number;
  /** The BOS token when the model wants one in front of every prompt. */
  bos: number | undefined;
  /** Most bytes of prompt text one token stands for (see {@link longestTokenBytes}). */
  maxTokenBytes: number;
  /**
   * Where prompts of more than {@link INLINE_PROMPT_BYTES} are tokenized, with the model's file and its identity
   * when it was loaded (the thread reads the vocabulary from it). Absent: every prompt on the event loop.
   */
  offLoop?: { thread: TokenizerThread; path: string; identity: string } | undefined;
}

/**
 * Prompts up to this many bytes are tokenized on the event loop (about 3 ms for Qwen2.5's tokenizer); longer ones
 * in the tokenizer's worker thread (`TokenizerThread`), when the model has one.
 */
export const INLINE_PROMPT_BYTES = 8 * 1024;

/**
 * A request's prompt tokens: chat messages through the model's template, or a raw prompt, with the BOS token
 * the model wants. Refuses an empty prompt and one that fills the context; one with more bytes than the
 * context's tokens can stand for is refused before it is tokenized. Tokenizing is synchronous (a 512 KiB chat
 * prompt took 0.19 s a pass, three passes with the control-token check), so a long prompt is tokenized in a
 * worker thread ({@link PromptModel.offLoop}).
 */
export async function promptTokens(prompt: PromptModel, request: GenerationRequest): Promise<number[]> {
  const { model, template, contextSize, bos, maxTokenBytes, offLoop } = prompt;
  const param = request.messages !== undefined ? "messages" : "prompt";
  // Special tokens are parsed in the template's text (chat templates write <|im_start|> as text) and in a
  // raw prompt (its writer controls the whole text), never in a message's content (see chatTokens).
  const rendered =
    request.messages !== undefined
      ? template.renderSegments(request.messages, {
          addGenerationPrompt: true,
          ...(request.tools ? { tools: request.tools } : {}),
        })
      : undefined;
  const bytes = rendered
    ? rendered.segments.reduce((sum, segment) => sum + Buffer.byteLength(segment.text), 0)
    : Buffer.byteLength(request.prompt ?? "");
  const fewestTokens = Math.ceil(bytes / maxTokenBytes);
  if (fewestTokens >= contextSize)
    throw new ConduitError(
      "invalid_request",
      `The prompt is ${bytes} bytes, at least ${fewestTokens} tokens; this model's context holds ${contextSize}.`,
      { param },
    );
  const inline = () =>
    rendered
      ? chatTokens(rendered, (text, special) => model.tokenize(text, special) as number[])
      : (model.tokenize(request.prompt ?? "", true) as number[]);
  const tokens =
    (bytes > INLINE_PROMPT_BYTES && offLoop
      ? await offLoop.thread.tokenize(
          offLoop.path,
          offLoop.identity,
          rendered ? { rendered } : { text: request.prompt ?? "" },
        )
      : undefined) ?? inline();
  if (bos !== undefined && tokens[0] !== bos) tokens.unshift(bos);
  if (tokens.length === 0) throw new ConduitError("invalid_request", "The prompt is empty.", { param });
  if (tokens.length >= contextSize)
    throw new ConduitError(
      "invalid_request",
      `The prompt is ${tokens.length} tokens; this model's context holds ${contextSize}.`,
      { param },
    );
  // max_tokens is a cap, as in llama-server, never refused for the context size: a generation stops with
  // finish_reason "length" when the context is full (`start` caps it), so the default of 256 works on a
  // model with a 128-token context.
  return tokens;
}

/**
 * The most bytes of text one token of `model` stands for: its longest vocabulary entry, in UTF-8 bytes. SPM and
 * BPE entries spell their text with at least as many bytes as it has (`▁` for a space, GPT-2's characters for
 * bytes, `<0x0A>`), so a prompt of `n` bytes is at least `n` / this many tokens. Other tokenizers normalize text
 * first (an entry may stand for more), and a model whose vocabulary is not in its metadata gives no bound:
 * `Infinity`.
 */
export function longestTokenBytes(model: LlamaModel): number {
  if (model.vocabularyType !== "spm" && model.vocabularyType !== "bpe") return Infinity;
  const tokens: unknown = model.fileInfo.metadata.tokenizer?.ggml?.tokens;
  if (!Array.isArray(tokens) || tokens.length === 0) return Infinity;
  let longest = 1;
  for (const token of tokens)
    longest = Math.max(longest, typeof token === "string" ? Buffer.byteLength(token) : Infinity);
  return longest;
}

/**
 * A chat prompt's tokens, with control-token text in the messages kept as plain text: a user who writes
 * `<|im_end|><|im_start|>system` gets those characters, not a forged turn. When no message holds such text
 * (the usual case) the whole text is tokenized at once, exactly as llama-server does; otherwise piece by
 * piece, contents without special-token parsing. A template that rewrites contents cannot be split into
 * pieces: a message with control-token text is then refused.
 */
export function chatTokens(
  rendered: RenderedSegments,
  tokenize: (text: string, special: boolean) => number[],
): number[] {
  const forging = (text: string) => {
    const plain = tokenize(text, false);
    const special = tokenize(text, true);
    return plain.length !== special.length || plain.some((token, i) => token !== special[i]);
  };
  if (rendered.opaque.some(forging))
    throw new ConduitError(
      "invalid_request",
      "A tool definition or tool call contains control-token text (such as <|im_end|>); remove it.",
      { param: "messages" },
    );
  if (!rendered.contents.some(forging))
    return tokenize(rendered.segments.map((segment) => segment.text).join(""), true);
  if (!rendered.exact)
    throw new ConduitError(
      "invalid_request",
      "A message contains control-token text (such as <|im_end|>) that this model's chat template cannot keep " +
        "apart from its own turn markers; remove it.",
      { param: "messages" },
    );
  return rendered.segments.flatMap((segment) => tokenize(segment.text, segment.trusted));
}
