import { randomBytes } from "node:crypto";
import fs from "node:fs/promises";
import { Template } from "@huggingface/jinja";
import { readGgufFileInfo } from "node-llama-cpp";
import { ConduitError } from "../errors.ts";
import { identityOf } from "./fileIdentity.ts";
import type { ChatMessage, ModelRef, ToolDefinition } from "./types.ts";

/**
 * The template of last resort, for a model with no `tokenizer.chat_template` and no known family
 * (`FAMILY_TEMPLATES`): base models such as stories260K. ChatML because it is the most common instruct format
 * and needs no special tokens to be readable: a model without `<|im_start|>`/`<|im_end|>` tokens still sees
 * plain, consistent text, and fine-tuning a base model on it teaches the model this format. The inference
 * prompt (generation prompt on) is a prefix of the training conversation (assistant message included,
 * generation prompt off).
 *
 * An assistant turn ends with the model's EOS token (`eos_token`, one control token) where the model has one,
 * not with `<|im_end|>`: that marker is many tokens of plain text to such a model, and an answer cut by
 * `max_tokens` could end in a piece of it (`green<|im_end`). A model fine-tuned on this format ends its
 * answers with the EOS token, where generation stops. Without an EOS token, `<|im_end|>` ends every turn.
 */
export const CHATML_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}" +
  "{% if message['role'] == 'assistant' and eos_token %}{{ eos_token }}{% else %}{{ '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/** ChatML for a model whose vocabulary has `<|im_start|>` and `<|im_end|>` as control tokens (Qwen, SmolLM bases). */
const CHATML_TOKENS_TEMPLATE =
  "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/**
 * Gemma's turn format (Gemma 1 to 3, as Google's templates write it): `<start_of_turn>user\n…<end_of_turn>\n`,
 * the assistant's role named `model`, a system message put before the first user message's text.
 */
const GEMMA_TEMPLATE =
  "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first_user_prefix = messages[0]['content'] + '\\n\\n' %}" +
  "{% set loop_messages = messages[1:] %}{% else %}{% set first_user_prefix = '' %}{% set loop_messages = messages %}{% endif %}" +
  "{% for message in loop_messages %}{% if message['role'] == 'assistant' %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}" +
  "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') + message['content'] + '<end_of_turn>\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/** Llama 3's header format. */
const LLAMA3_TEMPLATE =
  "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/** Phi-3's format. */
const PHI3_TEMPLATE =
  "{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}{% endfor %}" +
  "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}";

/** What the model's GGUF header says of its lineage and vocabulary, to pick a family's template. */
export interface ModelLineage {
  /** `general.architecture` (`gemma3`, `llama`, …). */
  architecture?: string | undefined;
  /** `general.name` and `general.basename`. */
  names: readonly string[];
  /** Whether the vocabulary has this text as one control token. */
  hasControlToken(text: string): boolean;
}

/**
 * Chat formats of model families, for a model without an embedded template, in order: the first that fits
 * is used. A family fits by architecture or name (as node-llama-cpp's `resolveChatWrapper` matches them) and
 * only when the vocabulary has its turn markers as control tokens, so that a turn always ends with one token
 * the engine stops at. ChatML by its tokens alone: a vocabulary with `<|im_start|>` and `<|im_end|>` was
 * trained on it (Qwen and SmolLM bases).
 */
export const FAMILY_TEMPLATES: readonly {
  name: string;
  source: string;
  markers: readonly string[];
  fits(lineage: ModelLineage): boolean;
}[] = [
  {
    name: "gemma",
    source: GEMMA_TEMPLATE,
    markers: ["<start_of_turn>", "<end_of_turn>"],
    // Gemma 4 writes turns another way (`<|turn>`); its templates are embedded.
    fits: ({ architecture, names }) =>
      /^gemma[0-3]?n?$/.test(architecture ?? "") ||
      names.some((n) => /gemma/i.test(n) && !/gemma[ -]?4/i.test(n)),
  },
  {
    name: "llama3",
    source: LLAMA3_TEMPLATE,
    markers: ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
    fits: () => true,
  },
  {
    name: "phi3",
    source: PHI3_TEMPLATE,
    markers: ["<|user|>", "<|assistant|>", "<|end|>"],
    fits: () => true,
  },
  {
    name: "chatml",
    source: CHATML_TOKENS_TEMPLATE,
    markers: ["<|im_start|>", "<|im_end|>"],
    fits: () => true,
  },
];

/** The template of a model without its own: its family's (`FAMILY_TEMPLATES`), or ChatML as text. */
export function familyTemplate(lineage: ModelLineage): { name: string; source: string } | undefined {
  return FAMILY_TEMPLATES.find(
    (family) => family.markers.every((marker) => lineage.hasControlToken(marker)) && family.fits(lineage),
  );
}

/** A short name for an embedded template, from the turn markers it writes (`custom` when none is known). */
export function templateName(source: string): string {
  if (source.includes("<start_of_turn>")) return "gemma";
  if (source.includes("<|start_header_id|>")) return "llama3";
  if (source.includes("<|im_start|>")) return "chatml";
  if (source.includes("[INST]")) return "mistral";
  if (source.includes("<|user|>") && source.includes("<|end|>")) return "phi3";
  return "custom";
}

/** Where a model's chat template comes from. */
export type ChatTemplateSource = "embedded" | "architecture" | "fallback";

/**
 * Where the fallback template's assistant turn ends. A model without ChatML control tokens (stories260K, or a
 * base model fine-tuned on this format) writes them as plain text, and its answer would otherwise end with a
 * literal `<|im_end|>`, often followed by further made-up turns. Chat requests on a model using
 * `CHATML_TEMPLATE` stop at the first of these (in addition to the request's own `stop`); raw prompts do not.
 */
export const CHATML_STOP_STRINGS: readonly string[] = ["<|im_end|>", "<|im_start|>"];

export interface FormatChatOptions {
  /** Append the opening of an assistant turn (inference). Off when formatting a whole conversation (training). */
  addGenerationPrompt: boolean;
  /** Functions the model may call, rendered by a template that supports tools (`supportsTools`). */
  tools?: readonly ToolDefinition[] | undefined;
}

/**
 * How a template's model writes a tool call: `hermes` (Qwen, Hermes, SmolLM3: `<tool_call>{json}</tool_call>`),
 * `mistral` (`[TOOL_CALLS][{json}, …]`) or `json` (Llama 3.x: the answer is the call's JSON object).
 */
export type ToolCallFormat = "hermes" | "mistral" | "json";

/** A model's chat template, ready to render. */
export interface ChatTemplate {
  /** The Jinja source: the model's own `tokenizer.chat_template`, its family's, or `CHATML_TEMPLATE`. */
  source: string;
  /**
   * `embedded`: the model's own `tokenizer.chat_template`; `architecture`: its family's (`FAMILY_TEMPLATES`),
   * chosen by its architecture, name and vocabulary; `fallback`: `CHATML_TEMPLATE`, as plain text.
   */
  origin: ChatTemplateSource;
  /** The format's short name: `gemma`, `llama3`, `phi3`, `chatml`, `mistral`, or `custom` for an embedded one. */
  name: string;
  /** True when the model has no template and `CHATML_TEMPLATE` is used. */
  isFallback: boolean;
  /**
   * Text that ends an assistant turn written as plain text: `CHATML_STOP_STRINGS` for the fallback, none for a
   * model's own template (its end-of-turn is a control token the engine stops at).
   */
  stopStrings: readonly string[];
  /** BOS token text as the template sees it (`bos_token`); empty when the model has none. */
  bosToken: string;
  /** EOS token text as the template sees it (`eos_token`); empty when the model has none. */
  eosToken: string;
  /** True when the template renders `tools` (a probe tool's name shows in its output). */
  supportsTools: boolean;
  /** How the model writes tool calls, read from the template's text (see `ToolCallFormat`). */
  toolCallFormat: ToolCallFormat;
  render(messages: readonly ChatMessage[], options: FormatChatOptions): string;
  /**
   * The rendered text in pieces: the template's own text (`trusted`: its control-token text is meant) and
   * each message's content (not trusted: text a user wrote, whose `<|im_end|>` must stay plain text).
   * `exact` is false when the template changes the contents it renders (trims them, say), so the pieces
   * could not be told apart; the pieces are then the whole text as one trusted piece.
   */
  renderSegments(messages: readonly ChatMessage[], options: FormatChatOptions): RenderedSegments;
}

export interface RenderedSegments {
  segments: { text: string; trusted: boolean }[];
  exact: boolean;
  /** The messages' contents, as given. */
  contents: string[];
  /**
   * Text from the request that the template writes inside its own pieces (tool definitions, tool calls): it
   * cannot be kept apart, so it must hold no control-token text.
   */
  opaque: string[];
}

// Keyed by path, size and mtime: a fine-tuned model written over an old file gets its template re-read.
const cache = new Map<string, Promise<ChatTemplate>>();
const CACHE_LIMIT = 64;

/**
 * Renders `messages` with the model's own chat template (`tokenizer.chat_template` in the GGUF), its family's
 * when it has none (`FAMILY_TEMPLATES`), or with ChatML as the last resort (see `CHATML_TEMPLATE`). The template sees `messages`,
 * `add_generation_prompt`, `bos_token` and `eos_token`.
 *
 * This is the one formatting function: the trainer formats IO pairs with it (assistant answer included,
 * `addGenerationPrompt: false`) and inference formats requests with it (`addGenerationPrompt: true`), so a
 * fine-tuned model is served exactly the text it was trained on. The text is tokenized with special tokens
 * parsed; a BOS token is prepended only when the model asks for one (`tokenizer.ggml.add_bos_token`) and the
 * text does not already start with it.
 *
 * Throws `invalid_request` (param `messages`) when the template rejects the conversation (`raise_exception`).
 */
export async function formatChat(
  model: ModelRef,
  messages: readonly ChatMessage[],
  options: FormatChatOptions,
): Promise<string> {
  const template = await loadChatTemplate(model);
  return template.render(messages, options);
}

/** The model's chat template (cached per file). Throws `model_not_found` when the file cannot be read. */
export async function loadChatTemplate(model: ModelRef): Promise<ChatTemplate> {
  let key: string;
  try {
    const stat = await fs.stat(model.path);
    key = `${model.path}\0${identityOf(stat)}`;
  } catch (error) {
    throw new ConduitError("model_not_found", `The model '${model.id}' does not exist.`, {
      param: "model",
      cause: error,
    });
  }
  let entry = cache.get(key);
  if (!entry) {
    entry = readChatTemplate(model);
    // Failed reads are not cached, so a model that is being written can be retried.
    entry.catch(() => cache.delete(key));
    if (cache.size >= CACHE_LIMIT) cache.delete(cache.keys().next().value!);
    cache.set(key, entry);
  }
  return entry;
}

async function readChatTemplate(model: ModelRef): Promise<ChatTemplate> {
  let info;
  try {
    info = await readGgufFileInfo(model.path, { readTensorInfo: false, logWarnings: false });
  } catch (error) {
    throw new ConduitError("unavailable", `The model '${model.id}' is not a readable GGUF file.`, {
      cause: error,
    });
  }
  const tokenizer = info.metadata.tokenizer;
  const tokens = tokenizer?.ggml?.tokens;
  const types = tokenizer?.ggml?.token_type;
  const tokenText = (id: number | undefined) => (id === undefined ? "" : (tokens?.[id] ?? ""));
  const general = info.metadata.general as
    { architecture?: unknown; name?: unknown; basename?: unknown } | undefined;
  const own = tokenizer?.chat_template;
  if (typeof own === "string" && own.trim() !== "")
    return compileChatTemplate(own, {
      origin: "embedded",
      name: templateName(own),
      bosToken: tokenText(tokenizer?.ggml?.bos_token_id),
      eosToken: tokenText(tokenizer?.ggml?.eos_token_id),
    });
  let controls: Set<string> | undefined;
  const isControl = (id: number | undefined) => id !== undefined && types?.[id] === CONTROL_TOKEN;
  const lineage: ModelLineage = {
    architecture: typeof general?.architecture === "string" ? general.architecture : undefined,
    names: [general?.name, general?.basename].filter((n): n is string => typeof n === "string"),
    hasControlToken(text) {
      controls ??= new Set((tokens ?? []).filter((_, id) => isControl(id)));
      return controls.has(text);
    },
  };
  const family = familyTemplate(lineage);
  if (family)
    return compileChatTemplate(family.source, {
      origin: "architecture",
      name: family.name,
      bosToken: tokenText(tokenizer?.ggml?.bos_token_id),
      eosToken: tokenText(tokenizer?.ggml?.eos_token_id),
    });
  const eosId = tokenizer?.ggml?.eos_token_id;
  return compileChatTemplate(CHATML_TEMPLATE, {
    origin: "fallback",
    name: "chatml",
    bosToken: tokenText(tokenizer?.ggml?.bos_token_id),
    // The fallback ends an assistant turn with the EOS token only where it is one control token.
    eosToken: isControl(eosId) ? tokenText(eosId) : "",
  });
}

/** llama.cpp's `LLAMA_TOKEN_TYPE_CONTROL`. */
const CONTROL_TOKEN = 3;

/** Compiles a Jinja chat template. Exported for callers that hold a template without a GGUF file (tests). */
export function compileChatTemplate(
  source: string,
  tokens: {
    /** Defaults to `fallback` with `isFallback`, else `embedded`. */
    origin?: ChatTemplateSource;
    /** Defaults to `chatml` for the fallback, else `templateName(source)`. */
    name?: string;
    isFallback?: boolean;
    bosToken?: string;
    eosToken?: string;
  } = {},
): ChatTemplate {
  let template: Template;
  try {
    template = new Template(source);
  } catch (error) {
    // A template the renderer cannot parse is a model problem, not the request's.
    throw new ConduitError("unavailable", "The model's chat template cannot be parsed.", { cause: error });
  }
  const bosToken = tokens.bosToken ?? "";
  const eosToken = tokens.eosToken ?? "";
  const origin = tokens.origin ?? (tokens.isFallback ? "fallback" : "embedded");
  const isFallback = origin === "fallback";
  const render = (messages: readonly ChatMessage[], options: FormatChatOptions) =>
    template.render({
      // Copies, so a template cannot mutate the caller's objects.
      messages: messages.map(templateMessage),
      ...(options.tools && options.tools.length > 0
        ? { tools: options.tools.map((f) => ({ type: "function", function: { ...f } })) }
        : {}),
      add_generation_prompt: options.addGenerationPrompt,
      bos_token: bosToken,
      eos_token: eosToken,
    });
  const chat: ChatTemplate = {
    source,
    origin,
    name: tokens.name ?? (isFallback ? "chatml" : templateName(source)),
    isFallback,
    stopStrings: isFallback ? CHATML_STOP_STRINGS : [],
    bosToken,
    eosToken,
    supportsTools: rendersTools(render),
    toolCallFormat: source.includes("<tool_call>")
      ? "hermes"
      : source.includes("[TOOL_CALLS]")
        ? "mistral"
        : "json",
    renderSegments(messages, options) {
      const plain = chat.render(messages, options);
      // Each content is rendered as a marker no text contains (private-use characters and a nonce), then
      // the markers are put back as untrusted pieces.
      const nonce = randomBytes(6).toString("hex");
      const marked = chat.render(
        messages.map((m, i) => ({ ...m, content: `\uE000${nonce}:${i}\uE001` })),
        options,
      );
      const segments: { text: string; trusted: boolean }[] = [];
      let last = 0;
      for (const match of marked.matchAll(new RegExp(`\uE000${nonce}:(\\d+)\uE001`, "g"))) {
        if (match.index > last) segments.push({ text: marked.slice(last, match.index), trusted: true });
        const content = messages[Number(match[1])]?.content ?? "";
        if (content !== "") segments.push({ text: content, trusted: false });
        last = match.index + match[0].length;
      }
      if (last < marked.length) segments.push({ text: marked.slice(last), trusted: true });
      const exact = segments.map((segment) => segment.text).join("") === plain;
      const contents = messages.map((m) => m.content);
      const opaque = [
        ...(options.tools ?? []).map((tool) => JSON.stringify(tool)),
        ...messages.flatMap((m) => [
          ...(m.toolCalls ?? []).flatMap((c) => [c.id, c.name, c.arguments]),
          ...(m.toolCallId !== undefined ? [m.toolCallId] : []),
        ]),
      ];
      return exact
        ? { segments, exact, contents, opaque }
        : { segments: [{ text: plain, trusted: true }], exact, contents, opaque };
    },
    render(messages, options) {
      try {
        return render(messages, options);
      } catch (error) {
        const reason = error instanceof Error ? error.message : String(error);
        throw new ConduitError(
          "invalid_request",
          `The model's chat template rejected the messages: ${reason}`,
          {
            param: "messages",
            cause: error,
          },
        );
      }
    },
  };
  return chat;
}

/**
 * A message as chat templates expect it: OpenAI's fields, with each call's `arguments` parsed into an object
 * (Hugging Face templates write `tool_call.arguments | tojson`), or left as text when it is not JSON.
 */
function templateMessage(m: ChatMessage): Record<string, unknown> {
  return {
    role: m.role,
    content: m.content,
    ...(m.toolCalls && m.toolCalls.length > 0
      ? {
          tool_calls: m.toolCalls.map((c) => ({
            id: c.id,
            type: "function",
            function: { name: c.name, arguments: parseArguments(c.arguments) },
          })),
        }
      : {}),
    ...(m.toolCallId !== undefined ? { tool_call_id: m.toolCallId } : {}),
  };
}

function parseArguments(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

const PROBE_TOOL = "conduit_probe_tool_7f3a";

/** Whether `render` writes the tools it is given: a probe tool's name must show in the prompt. */
function rendersTools(
  render: (messages: readonly ChatMessage[], options: FormatChatOptions) => string,
): boolean {
  try {
    const tools = [{ name: PROBE_TOOL, description: "", parameters: { type: "object", properties: {} } }];
    return render([{ role: "user", content: "x" }], { addGenerationPrompt: true, tools }).includes(
      PROBE_TOOL,
    );
  } catch {
    return false;
  }
}
