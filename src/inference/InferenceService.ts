import { ConduitError } from "../errors.ts";
import type { Engine } from "../engine/Engine.ts";
import type { ModelInfo, ModelRegistry } from "../model/ModelRegistry.ts";
import { readModelFileInfo } from "../model/modelFileInfo.ts";
import type {
  ChatMessage,
  GenerationResult,
  ModelRef,
  ResponseFormat,
  SamplingOptions,
  TokenLogprob,
} from "../engine/types.ts";
import type { Run, RunRepository } from "../store/RunRepository.ts";
import { methodOf } from "../train/RunService.ts";
import { runIdOfModelName, servedModelName } from "../train/modelNames.ts";

export interface InferenceRequest {
  /**
   * A model id from the registry, or one of the user's READY runs by id or by its `ft:` name. Defaults to
   * `CONDUIT_DEFAULT_MODEL`.
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
  signal?: AbortSignal;
  /** Streamed text of choice `index`, with its tokens' log probabilities when `logprobs` is set. */
  onText?: (index: number, text: string, logprobs?: TokenLogprob[]) => void;
}

export interface InferenceResult {
  model: string;
  choices: (GenerationResult & { index: number })[];
  promptTokens: number;
  /** Of `promptTokens`, those reused from the KV cache (a prefix shared with an earlier request). */
  cachedTokens: number;
  completionTokens: number;
}

export interface ServableModel {
  id: string;
  object: "model";
  created: number;
  owned_by: string;
  /** `base` for models in the models directory, `fine-tuned` for READY runs. */
  kind: "base" | "fine-tuned";
  /** Tokens of the model's training context, from its GGUF header (a LoRA fine-tune: its base's); `null` when unknown. */
  context_length: number | null;
  /** Bytes of the model's own file (a LoRA fine-tune: its adapter's); `null` when the file is not on this server. */
  size_bytes: number | null;
  /** The weights' file type as llama.cpp names it (`F32`, `Q8_0`, `Q4_K_M`, …; a LoRA fine-tune: its base's); `null` when unknown. */
  quantization: string | null;
  /** The model a fine-tune was trained from; `null` for a base model. */
  base_model: string | null;
}

/**
 * The one generation function behind every endpoint: the seed's chat and completions, a run's
 * inference, and the OpenAI-compatible routes all translate their requests into this.
 */
export class InferenceService {
  constructor(
    private readonly engine: Engine,
    private readonly registry: ModelRegistry,
    private readonly runs: RunRepository,
    private readonly defaultModel: string | undefined,
  ) {}

  /**
   * Resolves a model id for a user: their READY run with that id (or that `ft:` name, exactly as
   * `servedModelName` writes it), else a registry model.
   */
  async resolve(userId: string, id: string | undefined, param = "model"): Promise<ModelRef> {
    const name = id ?? this.defaultModel;
    if (!name)
      throw new ConduitError("invalid_request", `"${param}" is required (no CONDUIT_DEFAULT_MODEL is set)`, {
        param,
      });
    const run = await this.runNamed(userId, name);
    if (run) return this.refOfRun(run, param);
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

  async generate(userId: string, request: InferenceRequest, model?: ModelRef): Promise<InferenceResult> {
    const ref = model ?? (await this.resolve(userId, request.model));
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
            ...(request.responseFormat ? { responseFormat: request.responseFormat } : {}),
            ...(request.logprobs !== undefined ? { logprobs: request.logprobs } : {}),
            ...(request.signal ? { signal: request.signal } : {}),
            ...(request.onText
              ? {
                  onText: (text: string, logprobs?: TokenLogprob[]) =>
                    request.onText?.(index, text, logprobs),
                }
              : {}),
          });
          return { ...result, index };
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

  /** Models this user can name: the registry's and their READY runs. */
  async list(userId: string): Promise<ServableModel[]> {
    const base = await Promise.all(this.registry.list().map((m) => this.describeBase(m)));
    const runs = await this.runs.listReady(userId);
    const tuned = await Promise.all(runs.map((r) => this.describeRun(userId, r)));
    return [...base, ...tuned];
  }

  /** One model this user can name, as `list` shows it, or `undefined`: same precedence as `resolve`. */
  async get(userId: string, id: string): Promise<ServableModel | undefined> {
    const run = await this.runNamed(userId, id);
    if (run?.status === "READY") return this.describeRun(userId, run);
    const info = this.registry.info(id);
    return info && this.describeBase(info);
  }

  /** The user's run named by its id or its `ft:` name (`servedModelName`); `undefined` when none is. */
  private async runNamed(userId: string, name: string): Promise<Run | undefined> {
    const id = name.startsWith("ft_") ? name : runIdOfModelName(name);
    if (id === undefined) return undefined;
    const run = await this.runs.get(userId, id);
    return run && (name === run.id || name === servedModelName(run)) ? run : undefined;
  }

  private async describeBase(m: ModelInfo): Promise<ServableModel> {
    const file = await readModelFileInfo(m.path);
    return {
      id: m.id,
      object: "model",
      created: Math.floor(m.modifiedAt.getTime() / 1000),
      owned_by: "conduit",
      kind: "base",
      context_length: file?.contextLength ?? null,
      size_bytes: file?.sizeBytes ?? m.sizeBytes,
      quantization: file?.quantization ?? null,
      base_model: null,
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
      object: "model",
      created: Math.floor(Date.parse(`${run.updatedAt.replace(" ", "T")}Z`) / 1000),
      owned_by: userId,
      kind: "fine-tuned",
      context_length: weights?.contextLength ?? null,
      size_bytes: own?.sizeBytes ?? null,
      quantization: weights?.quantization ?? null,
      base_model: baseName,
    };
  }
}
