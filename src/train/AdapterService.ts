import fsp from "node:fs/promises";
import { pipeline, Transform, type Readable } from "node:stream";
import { ConduitError } from "../errors.ts";
import type { ModelRegistry } from "../model/ModelRegistry.ts";
import type { Adapter, AdapterRepository } from "../store/AdapterRepository.ts";
import type { BlobStore } from "../store/BlobStore.ts";
import { newId } from "../store/ids.ts";
import { timestamp } from "../domain/time.ts";
import {
  AdapterFileError,
  checkGgufAdapter,
  convertPeftAdapter,
  readBaseShape,
  type BaseModelShape,
} from "./core/adapterImport.ts";
import { servedAdapterType, writeTrainedAdapter } from "./core/loraAdapter.ts";
import { adapterOutputType, type AdapterTypeSetting } from "../domain/runs.ts";

/** An uploaded file held in the blob store's temp folder until the import keeps or discards it. */
export interface ReceivedAdapterFile {
  tempPath: string;
  size: number;
}

/** `POST /conduit/models/adapters`, as the service takes it. */
export interface ImportAdapter {
  /** The models-directory model the adapter is for. */
  baseModel: string;
  /** A label for listings. Defaults to the adapter's id. */
  name?: string | undefined;
  /** A GGUF LoRA adapter; or, instead, the two PEFT files. */
  gguf?: ReceivedAdapterFile | undefined;
  peftModel?: ReceivedAdapterFile | undefined;
  peftConfig?: ReceivedAdapterFile | undefined;
}

export interface AdapterServiceOptions {
  /** Largest file of an import, in bytes (`CONDUIT_MAX_ADAPTER_BYTES`). */
  maxBytes: number;
  /** How a converted PEFT adapter is stored, as a run's adapter is (`CONDUIT_ADAPTER_TYPE`). Defaults to `q8_0`. */
  adapterType?: AdapterTypeSetting;
  /** Hears an adapter deleted (the engine unloads it). */
  onDeleted?: (adapter: Adapter) => void;
}

/**
 * LoRA adapters trained elsewhere: imported for a base model of the models directory (a GGUF LoRA kept as it
 * is, or a PEFT adapter converted to one by the trainers' adapter writer) once checked against that base, listed,
 * served like a LoRA run's adapter (`ad_…` is the model name), and deleted with their file. Only their owner
 * sees them.
 */
export class AdapterService {
  constructor(
    private readonly repository: AdapterRepository,
    private readonly registry: ModelRegistry,
    private readonly blobs: BlobStore,
    private readonly options: AdapterServiceOptions,
  ) {}

  get maxBytes(): number {
    return this.options.maxBytes;
  }

  /** Streams one uploaded file to a temp file, refusing it (413) past the size limit. */
  async receive(source: Readable): Promise<ReceivedAdapterFile> {
    const limit = this.options.maxBytes;
    const tooLarge = () =>
      new ConduitError(
        "payload_too_large",
        `an adapter file is at most ${limit} bytes (CONDUIT_MAX_ADAPTER_BYTES)`,
      );
    let seen = 0;
    const limiter = new Transform({
      transform(chunk: Buffer, _encoding, callback) {
        seen += chunk.length;
        if (seen > limit) callback(tooLarge());
        else callback(null, chunk);
      },
    });
    const received = await this.blobs.writeTemp(pipeline(source, limiter, () => undefined));
    // The multipart parser truncates rather than failing when a file hits its limit.
    if ((source as Readable & { truncated?: boolean }).truncated) {
      await this.blobs.discard(received.tempPath);
      throw tooLarge();
    }
    return received;
  }

  /** Removes what an import received (after it failed, or once the adapter is kept elsewhere). */
  async discard(command: ImportAdapter): Promise<void> {
    for (const file of [command.gguf, command.peftModel, command.peftConfig])
      if (file) await this.blobs.discard(file.tempPath);
  }

  /**
   * Checks the upload against its base and keeps it: a `400` naming the field and the mismatch (another
   * architecture, a tensor the base does not have, a wrong shape, a truncated file, a missing config), and
   * nothing is kept. The received temp files are removed either way.
   */
  async import(userId: string, command: ImportAdapter): Promise<Adapter> {
    try {
      return await this.importChecked(userId, command);
    } catch (error) {
      if (error instanceof AdapterFileError)
        throw new ConduitError("invalid_request", error.message, { param: error.field });
      throw error;
    } finally {
      await this.discard(command);
    }
  }

  private async importChecked(userId: string, command: ImportAdapter): Promise<Adapter> {
    const { gguf, peftModel, peftConfig } = command;
    if (gguf && (peftModel || peftConfig))
      throw new AdapterFileError(
        "file",
        'send a GGUF adapter as "file", or a PEFT adapter as "adapter_model" and "adapter_config", not both',
      );
    if (!gguf && !peftModel)
      throw new AdapterFileError(
        peftConfig ? "adapter_model" : "file",
        peftConfig
          ? 'a PEFT adapter needs "adapter_model" (adapter_model.safetensors) beside "adapter_config"'
          : 'send a GGUF LoRA adapter as "file", or a PEFT adapter as "adapter_model" and "adapter_config"',
      );
    if (peftModel && !peftConfig)
      throw new AdapterFileError(
        "adapter_config",
        'a PEFT adapter needs "adapter_config" (adapter_config.json) beside "adapter_model"',
      );
    const baseRef = this.registry.resolve(command.baseModel);
    if (!baseRef)
      throw new ConduitError(
        "model_not_found",
        `base model "${command.baseModel}" is not in the models directory`,
        {
          param: "base_model",
        },
      );
    let base: BaseModelShape;
    try {
      base = await readBaseShape(baseRef.path);
    } catch {
      throw new AdapterFileError(
        "base_model",
        `base model "${command.baseModel}" cannot be read as a GGUF model`,
      );
    }
    if (base.tensors.length === 0 || base.architecture === "")
      throw new AdapterFileError("base_model", `base model "${command.baseModel}" has no tensors to adapt`);

    const id = newId("ad");
    const key = `adapters/${id}.gguf`;
    const target = this.blobs.pathOf(key);
    let checked;
    let format: Adapter["format"];
    if (gguf) {
      checked = await checkGgufAdapter(gguf.tempPath, base, command.baseModel);
      format = "gguf";
      await this.blobs.commit(gguf.tempPath, key);
    } else {
      checked = await convertPeftAdapter(peftModel!.tempPath, peftConfig!.tempPath, base, command.baseModel);
      format = "peft";
      const temp = this.blobs.tempPath();
      try {
        await writeTrainedAdapter(
          base,
          temp,
          checked.weights,
          { rank: checked.rank, alpha: checked.alpha, targets: [], complexity: 1 },
          checked.values,
          servedAdapterType(adapterOutputType(this.options.adapterType ?? "q8_0")),
        );
        await this.blobs.commit(temp, key);
      } finally {
        await this.blobs.discard(temp);
      }
    }
    const adapter: Adapter = {
      id,
      userId,
      name: command.name ?? id,
      baseModel: command.baseModel,
      format,
      rank: checked.rank,
      alpha: checked.alpha,
      weights: checked.weights.length,
      sizeBytes: (await fsp.stat(target)).size,
      path: target,
      createdAt: timestamp(),
    };
    try {
      await this.repository.insert(adapter);
    } catch (error) {
      await this.blobs.remove(key);
      throw error;
    }
    return adapter;
  }

  async list(userId: string): Promise<Adapter[]> {
    return this.repository.list(userId);
  }

  /** The user's adapter; `not_found` for an unknown id or another user's. */
  async get(userId: string, id: string): Promise<Adapter> {
    const adapter = await this.repository.get(userId, id);
    if (!adapter) throw new ConduitError("not_found", `adapter ${id} not found`, { param: "adapter_id" });
    return adapter;
  }

  /** Deletes the user's adapter and its file (and unloads it). */
  async delete(userId: string, id: string): Promise<Adapter> {
    const adapter = await this.repository.delete(userId, id);
    if (!adapter) throw new ConduitError("not_found", `adapter ${id} not found`, { param: "adapter_id" });
    this.options.onDeleted?.(adapter);
    await this.blobs.remove(`adapters/${adapter.id}.gguf`);
    return adapter;
  }
}
