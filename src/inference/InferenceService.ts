import fsp from "node:fs/promises";
import { ConduitError } from "../errors.ts";
import { loadChatTemplate, type ChatTemplateSource } from "../model/chatTemplate.ts";
import { forcedToolCall, parseToolCalls, type ToolChoice } from "./toolCalls.ts";
import type { Engine } from "../engine/Engine.ts";
import type { ModelInfo, ModelRegistry } from "../model/ModelRegistry.ts";
import { readModelFileInfo } from "../model/modelFileInfo.ts";
import type {
  ChatMessage,
  EmbeddingResult,
  GenerationResult,
  ModelRef,
  ResponseFormat,
  SamplingOptions,
  TokenLogprob,
  ToolCall,
  ToolDefinition,
} from "../engine/types.ts";
import type { RunRepository } from "../store/RunRepository.ts";
import type { Adapter, AdapterRepository } from "../store/AdapterRepository.ts";
import { keptCheckpointPath, methodOf, type Run } from "../domain/runs.ts";
import {
  checkpointModelName,
  checkpointOfModelName,
  runIdOfModelName,
  servedModelName,
} from "../domain/modelNames.ts";
import { parseTimestamp } from "../domain/time.ts";

export interface InferenceRequest {
  /**
   * A model id from the registry, one of the user's READY runs by id or by its `ft:` name, or one of their imported
   * adapters by id (`ad_…`). Defaults to `CONDUIT_DEFAULT_MODEL`.
   */
  model?: string | undefined;
  messages?: ChatMessage[];
  /** A raw prompt, or several (OpenAI's prompt array): each gets `n` choices, numbered in order. */
  prompt?: string | string[];
  sampling: SamplingOptions;
  /** Constrains every choice to JSON. Defaults to free text. */
  responseFormat?: ResponseFormat | undefined;
  /** Independent generations for the same input (OpenAI `n`), for each prompt. Defaults to `1`. */
  n?: number;
  /** Each token's log probability and this many alternatives, for every choice (see `GenerationRequest`). */
  logprobs?: number | undefined;
  /**
   * Functions the model may call (chat only, on a model whose template supports tools). The answer's calls are
   * parsed into each choice's `toolCalls` (unless `toolChoice` is `none`).
   */
  tools?: ToolDefinition[] | undefined;
  /** Defaults to `auto`; `required` or a name is enforced with a grammar. */
  toolChoice?: ToolChoice | undefined;
  /** `false`: at most one call per choice (the first). Defaults to `true`. */
  parallelToolCalls?: boolean | undefined;
  signal?: AbortSignal;
  /** Streamed text of choice `index`, with its tokens' log probabilities when `logprobs` is set. */
  onText?: (index: number, text: string, logprobs?: TokenLogprob[]) => void;
}

/** What to embed (see {@link InferenceService.embed}). */
export interface EmbeddingInput {
  /** As in {@link InferenceRequest.model}. */
  model?: string | undefined;
  /** Texts or token ids, one vector each. */
  inputs: (string | number[])[];
  /** The vectors' length the caller expects; another than the model's is an `invalid_request`. */
  dimensions?: number | undefined;
  signal?: AbortSignal;
}

/** The vectors, and the model that made them (its id: a run's, for a fine-tune). */
export type EmbeddingOutput = EmbeddingResult & { model: string };

/** A choice: with tools, `text` is the answer outside its calls and `finishReason` `tool_calls` when it made some. */
export type InferenceChoice = Omit<GenerationResult, "finishReason"> & {
  index: number;
  finishReason: GenerationResult["finishReason"] | "tool_calls";
  toolCalls?: ToolCall[];
};

export interface InferenceResult {
  model: string;
  choices: InferenceChoice[];
  promptTokens: number;
  /** Of `promptTokens`, those reused from the KV cache (a prefix shared with an earlier request). */
  cachedTokens: number;
  completionTokens: number;
}

/** A model a user can name, as the models lists show it (each face writes it in its own shape). */
export interface ServableModel {
  id: string;
  /** Seconds since the epoch: a base model's file's change, a run's last update, an adapter's import. */
  created: number;
  /** The user whose run or adapter it is; `null` for a base model (the server's own). */
  owner: string | null;
  /** `base` for models in the models directory, `fine-tuned` for READY runs, `adapter` for imported adapters. */
  kind: "base" | "fine-tuned" | "adapter";
  /** Tokens of the model's training context, from its GGUF header (a LoRA fine-tune: its base's); `null` when unknown. */
  contextLength: number | null;
  /** Bytes of the model's own file (a LoRA fine-tune: its adapter's); `null` when the file is not on this server. */
  sizeBytes: number | null;
  /** The weights' file type as llama.cpp names it (`F32`, `Q8_0`, `Q4_K_M`, …; a LoRA fine-tune: its base's); `null` when unknown. */
  quantization: string | null;
  /** The model a fine-tune was trained from; `null` for a base model. */
  baseModel: string | null;
  /** The chat template chats are rendered with (see `ChatTemplate.origin`); `null` when the file cannot be read. */
  chatTemplate: { source: ChatTemplateSource; name: string } | null;
}

/** Which chat template a model file's chats get; `null` when the file cannot be read. */
async function chatTemplateOf(id: string, path: string | undefined): Promise<ServableModel["chatTemplate"]> {
  if (path === undefined) return null;
  try {
    const template = await loadChatTemplate({ id, path });
    return { source: template.origin, name: template.name };
  } catch {
    return null;
  }
}

/** A model held in memory, as `GET /conduit/v1/models/loaded` shows it. */
export interface LoadedModel {
  id: string;
  kind: "base" | "fine-tuned" | "adapter";
  base_model: string | null;
  /** Bytes of model file held: the weights of a base or full fine-tune, the adapter of a LoRA one. */
  memory_bytes: number;
  context_size: number;
  active_generations: number;
  queued_requests: number;
  /** Unix seconds. */
  last_used: number;
  idle_seconds: number;
}

/**
 * The one generation function behind every endpoint: the Conduit API's chat and completions, a run's
 * inference, and the OpenAI-compatible routes all translate their requests into this.
 */
export class InferenceService {
  constructor(
    private readonly engine: Engine,
    private readonly registry: ModelRegistry,
    private readonly runs: RunRepository,
    private readonly defaultModel: string | undefined,
    private readonly adapters?: AdapterRepository,
  ) {}

  /**
   * Resolves a model id for a user: their READY run with that id (or that `ft:` name, exactly as
   * `servedModelName` writes it), else a registry model.
   */
  async resolve(userId: string, id: string | undefined, param: string): Promise<ModelRef> {
    const name = id ?? this.defaultModel;
    if (!name)
      throw new ConduitError("invalid_request", `"${param}" is required (no CONDUIT_DEFAULT_MODEL is set)`, {
        param,
      });
    const run = await this.runNamed(userId, name);
    if (run) return this.refOfRun(run, param);
    const adapter = await this.adapterNamed(userId, name);
    if (adapter) return this.refOfAdapter(adapter, param);
    const checkpoint = await this.checkpointNamed(userId, name);
    if (checkpoint) return this.refOfCheckpoint(checkpoint.run, checkpoint.step, param);
    const model = this.registry.resolve(name);
    if (!model) throw new ConduitError("model_not_found", `model "${name}" not found`, { param });
    return model;
  }

  /**
   * What serves `run`: its model file, or for a LoRA run its base model plus its adapter (the engine loads the
   * base once for all of them). Throws `conflict` when the run is not READY or its base is gone.
   */
  refOfRun(run: Run, param?: string): ModelRef {
    if (run.status !== "READY" || !run.modelPath)
      throw new ConduitError(
        "conflict",
        `run ${run.id} is ${run.status}, not READY; it cannot serve yet`,
        param === undefined ? {} : { param },
      );
    if (methodOf(run.config) === "full") return { id: run.id, path: run.modelPath };
    const baseName = String(run.config.baseModelName);
    const base = this.registry.resolve(baseName);
    if (!base)
      throw new ConduitError(
        "conflict",
        `run ${run.id} is a LoRA adapter of base model "${baseName}", which is no longer in the models directory`,
        param === undefined ? {} : { param },
      );
    return { id: run.id, path: base.path, lora: { path: run.modelPath } };
  }

  /** What serves an imported adapter: its base model plus the adapter, as for a LoRA run. */
  refOfAdapter(adapter: Adapter, param?: string): ModelRef {
    const base = this.registry.resolve(adapter.baseModel);
    if (!base)
      throw new ConduitError(
        "conflict",
        `adapter ${adapter.id} is for base model "${adapter.baseModel}", which is no longer in the models directory`,
        param === undefined ? {} : { param },
      );
    return { id: adapter.id, path: base.path, lora: { path: adapter.path } };
  }

  /**
   * What serves a READY run's kept checkpoint: its base model plus the checkpoint's adapter. Throws
   * `model_not_found` when the run kept no such checkpoint.
   */
  private refOfCheckpoint(run: Run, step: number, param: string): ModelRef {
    const ref = this.refOfRun(run, param);
    const file = run.stats.checkpoints?.some((c) => c.step === step)
      ? keptCheckpointPath(run, step)
      : undefined;
    if (file === undefined || ref.lora === undefined)
      throw new ConduitError(
        "model_not_found",
        `model "${checkpointModelName(run, step)}" not found: run ${run.id} kept no checkpoint at step ${step}`,
        { param },
      );
    return { id: `${run.id}:ckpt-step-${step}`, path: ref.path, lora: { path: file } };
  }

  async generate(userId: string, request: InferenceRequest, model?: ModelRef): Promise<InferenceResult> {
    const ref = model ?? (await this.resolve(userId, request.model, "model"));
    const tools = await this.checkTools(ref, request);
    const forced =
      tools && (request.toolChoice === "required" || typeof request.toolChoice === "object")
        ? forcedToolCall((await loadChatTemplate(ref)).toolCallFormat, tools, request.toolChoice)
        : undefined;
    const responseFormat = forced ?? request.responseFormat;
    const n = request.n ?? 1;
    const inputs = request.messages
      ? [{ messages: request.messages }]
      : [request.prompt ?? ""].flat().map((prompt) => ({ prompt }));
    const choices = await Promise.all(
      inputs.flatMap((input, p) =>
        Array.from({ length: n }, async (_, i) => {
          const index = p * n + i;
          const result = await this.engine.generate({
            model: ref,
            ...input,
            sampling:
              request.sampling.seed !== undefined && i > 0
                ? { ...request.sampling, seed: request.sampling.seed + i }
                : request.sampling,
            ...(responseFormat ? { responseFormat } : {}),
            ...(tools ? { tools } : {}),
            ...(request.logprobs !== undefined ? { logprobs: request.logprobs } : {}),
            ...(request.signal ? { signal: request.signal } : {}),
            ...(request.onText
              ? {
                  onText: (text: string, logprobs?: TokenLogprob[]) =>
                    request.onText?.(index, text, logprobs),
                }
              : {}),
          });
          return this.withToolCalls({ ...result, index }, request);
        }),
      ),
    );
    return {
      model: ref.id,
      choices,
      // Choices of one input share its prompt: count it once.
      promptTokens: choices.reduce((sum, c) => sum + (c.index % n === 0 ? c.promptTokens : 0), 0),
      cachedTokens: choices.reduce((sum, c) => sum + (c.index % n === 0 ? c.cachedTokens : 0), 0),
      completionTokens: choices.reduce((sum, c) => sum + c.completionTokens, 0),
    };
  }

  /**
   * Embeds `request.inputs` with a model the user may use (a registry model, or one of their READY runs: a LoRA
   * run with its adapter applied): one vector per input, in order.
   */
  async embed(userId: string, request: EmbeddingInput): Promise<EmbeddingOutput> {
    const ref = await this.resolve(userId, request.model, "model");
    const result = await this.engine.embed({
      model: ref,
      inputs: request.inputs,
      ...(request.dimensions !== undefined ? { dimensions: request.dimensions } : {}),
      ...(request.signal ? { signal: request.signal } : {}),
    });
    return { model: ref.id, ...result };
  }

  /**
   * The request's tools, checked: `undefined` when it has none. A model whose chat template cannot render tools
   * (or tool messages) is an `invalid_request` naming the field, never silently ignored.
   */
  private async checkTools(ref: ModelRef, request: InferenceRequest): Promise<ToolDefinition[] | undefined> {
    const tools = request.tools && request.tools.length > 0 ? request.tools : undefined;
    const toolMessages = (request.messages ?? []).some(
      (m) => m.role === "tool" || (m.toolCalls?.length ?? 0) > 0,
    );
    const choice = request.toolChoice;
    if (!tools && (choice === "required" || typeof choice === "object"))
      throw new ConduitError("invalid_request", 'field "tool_choice" needs "tools" to choose from', {
        param: "tool_choice",
      });
    if (!tools && !toolMessages) return undefined;
    if (request.messages === undefined)
      throw new ConduitError("invalid_request", 'field "tools" needs chat messages', { param: "tools" });
    const template = await loadChatTemplate(ref);
    if (!template.supportsTools)
      throw new ConduitError(
        "invalid_request",
        `model "${ref.id}" has a chat template without tool support, so ` +
          (tools
            ? 'field "tools" cannot be used with it'
            : "tool calls and tool messages cannot be used with it"),
        { param: tools ? "tools" : "messages" },
      );
    if (typeof choice === "object" && !tools?.some((t) => t.name === choice.name))
      throw new ConduitError(
        "invalid_request",
        `field "tool_choice" names function "${choice.name}", which is not in "tools"`,
        { param: "tool_choice" },
      );
    if (tools && request.responseFormat && (choice === "required" || typeof choice === "object"))
      throw new ConduitError(
        "invalid_request",
        'field "tool_choice" makes the model call a function, which "response_format" would not allow',
        { param: "tool_choice" },
      );
    return tools;
  }

  /** The choice's tool calls parsed out of its text (with tools, unless `tool_choice` is `none`). */
  private withToolCalls(choice: InferenceChoice, request: InferenceRequest): InferenceChoice {
    if (!request.tools || request.tools.length === 0 || request.toolChoice === "none") return choice;
    const parsed = parseToolCalls(choice.text, request.tools);
    if (parsed.calls.length === 0) return choice;
    const calls = request.parallelToolCalls === false ? parsed.calls.slice(0, 1) : parsed.calls;
    return {
      ...choice,
      text: parsed.content,
      toolCalls: calls,
      finishReason: choice.finishReason === "stop" ? "tool_calls" : choice.finishReason,
    };
  }

  /** Models this user can name: the registry's, their READY runs and their imported adapters. */
  async list(userId: string): Promise<ServableModel[]> {
    const base = await Promise.all(this.registry.list().map((m) => this.describeBase(m)));
    const runs = await this.runs.listReady(userId);
    const tuned = await Promise.all(runs.map((r) => this.describeRun(userId, r)));
    const adapters = (await this.adapters?.list(userId)) ?? [];
    const imported = await Promise.all(adapters.map((a) => this.describeAdapter(userId, a)));
    return [...base, ...tuned, ...imported];
  }

  /**
   * One model this user can name, as `list` shows it: same precedence as `resolve`. Throws `model_not_found`
   * when there is none.
   */
  async get(userId: string, id: string): Promise<ServableModel> {
    const run = await this.runNamed(userId, id);
    if (run?.status === "READY") return this.describeRun(userId, run);
    const adapter = await this.adapterNamed(userId, id);
    if (adapter) return this.describeAdapter(userId, adapter);
    const checkpoint = await this.checkpointNamed(userId, id);
    if (
      checkpoint?.run.status === "READY" &&
      checkpoint.run.stats.checkpoints?.some((c) => c.step === checkpoint.step)
    )
      return {
        ...(await this.describeRun(userId, checkpoint.run)),
        id: checkpointModelName(checkpoint.run, checkpoint.step),
        sizeBytes: await fsp
          .stat(keptCheckpointPath(checkpoint.run, checkpoint.step) ?? "")
          .then((s) => s.size)
          .catch(() => null),
      };
    const info = this.registry.info(id);
    if (!info) throw new ConduitError("model_not_found", `model "${id}" not found`, { param: "model" });
    return this.describeBase(info);
  }

  /** The user's run named by its id or its `ft:` name (`servedModelName`); `undefined` when none is. */
  private async runNamed(userId: string, name: string): Promise<Run | undefined> {
    const id = name.startsWith("ft_") ? name : runIdOfModelName(name);
    if (id === undefined) return undefined;
    const run = await this.runs.get(userId, id);
    return run && (name === run.id || name === servedModelName(run)) ? run : undefined;
  }

  /** The user's imported adapter named by its id; `undefined` when none is. */
  private async adapterNamed(userId: string, name: string): Promise<Adapter | undefined> {
    return name.startsWith("ad_") ? this.adapters?.get(userId, name) : undefined;
  }

  private async describeAdapter(userId: string, adapter: Adapter): Promise<ServableModel> {
    const basePath = this.registry.resolve(adapter.baseModel)?.path;
    const weights = basePath ? await readModelFileInfo(basePath) : undefined;
    return {
      id: adapter.id,
      created: Math.floor(parseTimestamp(adapter.createdAt) / 1000),
      owner: userId,
      kind: "adapter",
      contextLength: weights?.contextLength ?? null,
      sizeBytes: adapter.sizeBytes,
      quantization: weights?.quantization ?? null,
      baseModel: adapter.baseModel,
      chatTemplate: await chatTemplateOf(adapter.id, basePath),
    };
  }

  /** The user's run and step a checkpoint's model name names (`<run name>:ckpt-step-<step>`); `undefined` when none. */
  private async checkpointNamed(
    userId: string,
    name: string,
  ): Promise<{ run: Run; step: number } | undefined> {
    const parsed = checkpointOfModelName(name);
    if (parsed === undefined) return undefined;
    const run = await this.runNamed(userId, parsed.runName);
    return run && { run, step: parsed.step };
  }

  private async describeBase(m: ModelInfo): Promise<ServableModel> {
    const file = await readModelFileInfo(m.path);
    return {
      id: m.id,
      created: Math.floor(m.modifiedAt.getTime() / 1000),
      owner: null,
      kind: "base",
      contextLength: file?.contextLength ?? null,
      sizeBytes: file?.sizeBytes ?? m.sizeBytes,
      quantization: file?.quantization ?? null,
      baseModel: null,
      chatTemplate: await chatTemplateOf(m.id, m.path),
    };
  }

  private async describeRun(
    userId: string,
    run: Pick<Run, "id" | "updatedAt" | "config" | "modelPath">,
  ): Promise<ServableModel> {
    const own = run.modelPath ? await readModelFileInfo(run.modelPath) : undefined;
    const baseName = typeof run.config.baseModelName === "string" ? run.config.baseModelName : null;
    // A LoRA run serves its adapter on its base's weights.
    const basePath = baseName === null ? undefined : this.registry.resolve(baseName)?.path;
    const weights =
      methodOf(run.config) !== "lora" ? own : basePath ? await readModelFileInfo(basePath) : undefined;
    return {
      id: servedModelName(run),
      created: Math.floor(parseTimestamp(run.updatedAt) / 1000),
      owner: userId,
      kind: "fine-tuned",
      contextLength: weights?.contextLength ?? null,
      sizeBytes: own?.sizeBytes ?? null,
      quantization: weights?.quantization ?? null,
      baseModel: baseName,
      // A LoRA fine-tune is rendered with its base's template.
      chatTemplate: await chatTemplateOf(
        servedModelName(run),
        methodOf(run.config) !== "lora" ? (run.modelPath ?? undefined) : basePath,
      ),
    };
  }

  /**
   * What the engine holds in memory that this user may see: base models, and their own fine-tunes (never
   * another user's), most recently used first.
   */
  async loaded(userId: string, now = Date.now()): Promise<LoadedModel[]> {
    const out: LoadedModel[] = [];
    for (const m of this.engine.loaded()) {
      let baseModel: string | null = null;
      if (m.id.startsWith("ft_")) {
        const run = await this.runs.get(userId, m.id);
        if (!run) continue;
        baseModel = typeof run.config.baseModelName === "string" ? run.config.baseModelName : null;
      } else if (m.id.startsWith("ad_")) {
        const adapter = await this.adapters?.get(userId, m.id);
        if (!adapter) continue;
        baseModel = adapter.baseModel;
      } else if (m.lora !== undefined || this.registry.resolve(m.id)?.path !== m.path) continue;
      const lastUsed = m.lastUsedAt.getTime();
      out.push({
        id: m.id,
        kind: m.id.startsWith("ft_") ? "fine-tuned" : m.id.startsWith("ad_") ? "adapter" : "base",
        base_model: baseModel,
        memory_bytes: m.sizeBytes,
        context_size: m.contextSize,
        active_generations: m.activeSequences,
        queued_requests: m.queuedRequests,
        last_used: Math.floor(lastUsed / 1000),
        idle_seconds: m.activeSequences > 0 ? 0 : Math.max(0, Math.floor((now - lastUsed) / 1000)),
      });
    }
    return out.sort((a, b) => b.last_used - a.last_used);
  }
}
