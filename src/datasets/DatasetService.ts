import { pipeline, Transform, type Readable } from "node:stream";
import { ConduitError } from "../errors.ts";
import type { BlobStore } from "../store/BlobStore.ts";
import type { DatasetRepository } from "../store/DatasetRepository.ts";
import type { Dataset, DatasetFile, Page } from "../domain/datasets.ts";
import { newId } from "../store/ids.ts";
import {
  countIoPairs,
  detectFormat,
  IoPairError,
  readIoPairs,
  type IoFormat,
  type IoPair,
} from "./ioPairs.ts";

/** An upload already streamed to a temp file by `DatasetService.receive`. */
export interface ReceivedFile {
  tempPath: string;
  size: number;
}

export interface UploadInput {
  /** File name as the user gave it: metadata only, never part of a path. */
  name: string;
  /** The bytes: a stream, or a file `receive` took in first (`upload` discards it either way). */
  source: Readable | ReceivedFile;
  format?: IoFormat | undefined;
}

/** Datasets, their files and the IO pairs in them. */
export class DatasetService {
  constructor(
    private readonly datasets: DatasetRepository,
    private readonly blobs: BlobStore,
    private readonly maxUploadBytes: number,
    /** Largest pair of an upload (`CONDUIT_MAX_PAIR_BYTES`). Defaults to no limit. */
    private readonly maxPairBytes = Number.POSITIVE_INFINITY,
  ) {}

  create(userId: string, name: string): Promise<Dataset> {
    return this.datasets.create(userId, name);
  }

  list(userId: string, page: Page): Promise<Dataset[]> {
    return this.datasets.list(userId, page);
  }

  async get(userId: string, id: string): Promise<Dataset> {
    const dataset = await this.datasets.get(userId, id);
    if (!dataset) throw new ConduitError("not_found", `dataset ${id} not found`, { param: "dataset_id" });
    return dataset;
  }

  /** Finds a dataset by id, else by name (the Conduit API's run body uses either). */
  async find(userId: string, ref: { id?: string | undefined; name?: string | undefined }): Promise<Dataset> {
    const dataset = ref.id
      ? await this.datasets.get(userId, ref.id)
      : ref.name
        ? await this.datasets.findByName(userId, ref.name)
        : undefined;
    if (!dataset)
      throw new ConduitError(
        "not_found",
        ref.id ? `dataset ${ref.id} not found` : `no dataset named "${ref.name ?? ""}"`,
        { param: ref.id ? "datasetID" : "datasetName" },
      );
    return dataset;
  }

  async rename(userId: string, id: string, name: string): Promise<void> {
    if (!(await this.datasets.rename(userId, id, name)))
      throw new ConduitError("not_found", `dataset ${id} not found`, { param: "dataset_id" });
  }

  async delete(userId: string, id: string): Promise<void> {
    const blobs = await this.datasets.delete(userId, id);
    if (!blobs) throw new ConduitError("not_found", `dataset ${id} not found`, { param: "dataset_id" });
    await Promise.all(blobs.map((blob) => this.blobs.remove(blob)));
    await this.blobs.remove(`files/${id}`);
  }

  async listFiles(userId: string, datasetId: string, page: Page): Promise<DatasetFile[]> {
    await this.get(userId, datasetId);
    return this.datasets.listFiles(userId, datasetId, page);
  }

  async getFile(userId: string, datasetId: string, fileId: string): Promise<DatasetFile> {
    const file = await this.datasets.getFile(userId, datasetId, fileId);
    if (!file)
      throw new ConduitError("not_found", `file ${fileId} not found in dataset ${datasetId}`, {
        param: "file_id",
      });
    return file;
  }

  /**
   * Streams an upload to a temp file (never whole into memory) within the upload limit. Pass the
   * result to `upload`, or to `discard` if the request fails before that.
   */
  async receive(source: Readable): Promise<ReceivedFile> {
    const limit = this.maxUploadBytes;
    const tooLarge = () =>
      new ConduitError("payload_too_large", `the file is larger than the upload limit of ${limit} bytes`);
    let seen = 0;
    const limiter = new Transform({
      transform(chunk: Buffer, _encoding, callback) {
        seen += chunk.length;
        if (seen > limit) callback(tooLarge());
        else callback(null, chunk);
      },
    });
    // pipeline, not pipe: it also sees a source that failed before we got it (a multipart
    // part cut short is destroyed with its error while the request is still being parsed).
    const received = await this.blobs.writeTemp(pipeline(source, limiter, () => undefined));
    // The multipart parser truncates rather than failing when a file hits its limit.
    if ((source as Readable & { truncated?: boolean }).truncated) {
      await this.discard(received);
      throw tooLarge();
    }
    return received;
  }

  discard(file: ReceivedFile): Promise<void> {
    return this.blobs.discard(file.tempPath);
  }

  /**
   * Validates every pair of an upload and only then stores it: a bad line is a 400 naming the
   * line, and nothing is kept.
   */
  async upload(userId: string, datasetId: string, input: UploadInput): Promise<DatasetFile> {
    let received = "tempPath" in input.source ? input.source : undefined;
    try {
      await this.get(userId, datasetId);
      received ??= await this.receive(input.source as Readable);
      const { tempPath, size } = received;
      if (size === 0) throw new ConduitError("invalid_file", "the file is empty", { param: "file" });
      const format = input.format ?? (await detectFormat(tempPath, input.name));
      let ioPairsCount: number;
      try {
        ioPairsCount = await countIoPairs(tempPath, format, { maxPairBytes: this.maxPairBytes });
      } catch (error) {
        if (error instanceof IoPairError)
          throw new ConduitError("invalid_file", `${input.name}: ${error.message}`, { param: "file" });
        throw error;
      }
      if (ioPairsCount === 0)
        throw new ConduitError("invalid_file", `${input.name}: the file has no IO pairs`, { param: "file" });
      const fileId = newId("file");
      const blob = `files/${datasetId}/${fileId}`;
      await this.blobs.commit(tempPath, blob);
      const file = await this.datasets.addFile(userId, datasetId, {
        id: fileId,
        name: input.name,
        size,
        format,
        ioPairsCount,
        blob,
      });
      if (!file) {
        await this.blobs.remove(blob);
        throw new ConduitError("not_found", `dataset ${datasetId} not found`, { param: "dataset_id" });
      }
      return file;
    } finally {
      if (received) await this.discard(received);
    }
  }

  async deleteFile(userId: string, datasetId: string, fileId: string): Promise<void> {
    await this.get(userId, datasetId);
    const blob = await this.datasets.deleteFile(userId, datasetId, fileId);
    if (!blob)
      throw new ConduitError("not_found", `file ${fileId} not found in dataset ${datasetId}`, {
        param: "file_id",
      });
    await this.blobs.remove(blob);
  }

  /** Pairs of one file, for previews (`offset`/`limit` count pairs). */
  async previewFile(userId: string, datasetId: string, fileId: string, page: Page): Promise<IoPair[]> {
    const file = await this.getFile(userId, datasetId, fileId);
    const pairs: IoPair[] = [];
    let index = 0;
    for await (const pair of readIoPairs(this.blobs.pathOf(file.blob), file.format as IoFormat)) {
      if (index++ < page.offset) continue;
      pairs.push(pair);
      if (pairs.length >= page.limit) break;
    }
    return pairs;
  }

  /** A file of any of the user's datasets (a run's validation file); 404 naming `param` if there is none. */
  async getUserFile(userId: string, fileId: string, param: string): Promise<DatasetFile> {
    const file = await this.datasets.getUserFile(userId, fileId);
    if (!file) throw new ConduitError("not_found", `file ${fileId} not found`, { param });
    return file;
  }

  /** Where one of the user's files is stored, to stream it back. */
  async userFilePath(
    userId: string,
    fileId: string,
    param: string,
  ): Promise<{ file: DatasetFile; path: string }> {
    const file = await this.getUserFile(userId, fileId, param);
    return { file, path: this.blobs.pathOf(file.blob) };
  }

  /** The user's files of every dataset, by id (creation order), after the cursor `after` (a file id). */
  listUserFiles(
    userId: string,
    page: { after?: string | undefined; limit: number; order: "asc" | "desc" },
  ): Promise<DatasetFile[]> {
    return this.datasets.listUserFiles(userId, page);
  }

  /**
   * Stores an upload as a new dataset of its own, named after the file (OpenAI's `POST /v1/files`:
   * there a file is all a job trains on). A refused file leaves no dataset behind.
   */
  async uploadAsDataset(userId: string, input: UploadInput): Promise<DatasetFile> {
    const dataset = await this.datasets.create(userId, input.name);
    try {
      return await this.upload(userId, dataset.id, input);
    } catch (error) {
      await this.delete(userId, dataset.id).catch(() => undefined);
      throw error;
    }
  }

  /** Deletes one of the user's files by its id alone, and its dataset with it when no other file is left in it. */
  async deleteUserFile(userId: string, fileId: string, param: string): Promise<void> {
    const file = await this.getUserFile(userId, fileId, param);
    await this.deleteFile(userId, file.datasetId, file.id);
    const left = await this.datasets.listFiles(userId, file.datasetId, { limit: 1, offset: 0 });
    if (left.length === 0) await this.delete(userId, file.datasetId).catch(() => undefined);
  }

  /**
   * Every pair of a dataset, file by file in upload order (training input), leaving out the file
   * `except` (a validation file that belongs to the training dataset).
   */
  async *pairs(userId: string, datasetId: string, except?: string): AsyncGenerator<IoPair> {
    for (const file of await this.datasets.allFiles(userId, datasetId))
      if (file.id !== except) yield* readIoPairs(this.blobs.pathOf(file.blob), file.format as IoFormat);
  }

  /** Every pair of one of the user's files, in order. */
  async *filePairs(userId: string, fileId: string, param: string): AsyncGenerator<IoPair> {
    const file = await this.getUserFile(userId, fileId, param);
    yield* readIoPairs(this.blobs.pathOf(file.blob), file.format as IoFormat);
  }
}
