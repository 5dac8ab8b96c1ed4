import type { Kysely, Transaction } from "kysely";
import { newId } from "./ids.ts";
import type { Database, DatasetTable, FileTable } from "./schema.ts";
import { timestamp } from "../domain/time.ts";
import type { Dataset, DatasetFile, DatasetStatus, Page } from "../domain/datasets.ts";

export type { Dataset, DatasetFile, DatasetStatus, Page } from "../domain/datasets.ts";

function toDataset(row: DatasetTable): Dataset {
  return {
    id: row.id,
    userId: row.user_id,
    name: row.name,
    ioPairsCount: row.io_pairs_count,
    status: row.status as DatasetStatus,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

function toFile(row: FileTable): DatasetFile {
  return {
    id: row.id,
    datasetId: row.dataset_id,
    userId: row.user_id,
    name: row.name,
    size: row.size,
    type: "IO",
    format: row.format,
    ioPairsCount: row.io_pairs_count,
    blob: row.blob,
    createdAt: row.created_at,
    updatedAt: row.updated_at,
  };
}

/**
 * Datasets and their files (one aggregate: a file never outlives its dataset). Every method
 * takes the owner, so another user's ids behave exactly like ids that do not exist.
 */
export class DatasetRepository {
  constructor(private readonly db: Kysely<Database>) {}

  async create(userId: string, name: string): Promise<Dataset> {
    const now = timestamp();
    const row: DatasetTable = {
      id: newId("ds"),
      user_id: userId,
      name,
      io_pairs_count: 0,
      status: "READY",
      created_at: now,
      updated_at: now,
    };
    await this.db.insertInto("datasets").values(row).execute();
    return toDataset(row);
  }

  async get(userId: string, id: string): Promise<Dataset | undefined> {
    const row = await this.db
      .selectFrom("datasets")
      .selectAll()
      .where("id", "=", id)
      .where("user_id", "=", userId)
      .executeTakeFirst();
    return row && toDataset(row);
  }

  /** The user's most recently created dataset with this name. */
  async findByName(userId: string, name: string): Promise<Dataset | undefined> {
    const row = await this.db
      .selectFrom("datasets")
      .selectAll()
      .where("name", "=", name)
      .where("user_id", "=", userId)
      .orderBy("created_at", "desc")
      .orderBy("id", "desc")
      .executeTakeFirst();
    return row && toDataset(row);
  }

  async list(userId: string, page: Page): Promise<Dataset[]> {
    const rows = await this.db
      .selectFrom("datasets")
      .selectAll()
      .where("user_id", "=", userId)
      .orderBy("created_at", "desc")
      .orderBy("id", "desc")
      .limit(page.limit)
      .offset(page.offset)
      .execute();
    return rows.map(toDataset);
  }

  async rename(userId: string, id: string, name: string): Promise<boolean> {
    const result = await this.db
      .updateTable("datasets")
      .set({ name, updated_at: timestamp() })
      .where("id", "=", id)
      .where("user_id", "=", userId)
      .executeTakeFirst();
    return Number(result.numUpdatedRows) > 0;
  }

  /** Deletes the dataset and its file records; returns the blob keys to remove, or undefined if absent. */
  async delete(userId: string, id: string): Promise<string[] | undefined> {
    return this.db.transaction().execute(async (tx) => {
      const files = await tx
        .selectFrom("files")
        .select("blob")
        .where("dataset_id", "=", id)
        .where("user_id", "=", userId)
        .execute();
      await tx.deleteFrom("files").where("dataset_id", "=", id).where("user_id", "=", userId).execute();
      const result = await tx
        .deleteFrom("datasets")
        .where("id", "=", id)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      return Number(result.numDeletedRows) > 0 ? files.map((f) => f.blob) : undefined;
    });
  }

  async listFiles(userId: string, datasetId: string, page: Page): Promise<DatasetFile[]> {
    const rows = await this.db
      .selectFrom("files")
      .selectAll()
      .where("dataset_id", "=", datasetId)
      .where("user_id", "=", userId)
      .orderBy("created_at", "desc")
      .orderBy("id", "desc")
      .limit(page.limit)
      .offset(page.offset)
      .execute();
    return rows.map(toFile);
  }

  async allFiles(userId: string, datasetId: string): Promise<DatasetFile[]> {
    const rows = await this.db
      .selectFrom("files")
      .selectAll()
      .where("dataset_id", "=", datasetId)
      .where("user_id", "=", userId)
      .orderBy("created_at")
      .orderBy("id")
      .execute();
    return rows.map(toFile);
  }

  /**
   * The user's files of every dataset, by id (creation order), from after the cursor `after` (a file
   * id, which need not exist any more): newest first with `order: "desc"`.
   */
  async listUserFiles(
    userId: string,
    page: { after?: string | undefined; limit: number; order: "asc" | "desc" },
  ): Promise<DatasetFile[]> {
    let query = this.db.selectFrom("files").selectAll().where("user_id", "=", userId);
    if (page.after !== undefined) query = query.where("id", page.order === "desc" ? "<" : ">", page.after);
    const rows = await query.orderBy("id", page.order).limit(page.limit).execute();
    return rows.map(toFile);
  }

  /** A file of any of the user's datasets. */
  async getUserFile(userId: string, fileId: string): Promise<DatasetFile | undefined> {
    const row = await this.db
      .selectFrom("files")
      .selectAll()
      .where("id", "=", fileId)
      .where("user_id", "=", userId)
      .executeTakeFirst();
    return row && toFile(row);
  }

  async getFile(userId: string, datasetId: string, fileId: string): Promise<DatasetFile | undefined> {
    const row = await this.db
      .selectFrom("files")
      .selectAll()
      .where("id", "=", fileId)
      .where("dataset_id", "=", datasetId)
      .where("user_id", "=", userId)
      .executeTakeFirst();
    return row && toFile(row);
  }

  /** Which of these blob keys a file record holds (the sweeper removes blobs no record holds). */
  async recordedBlobs(keys: string[]): Promise<Set<string>> {
    const found = new Set<string>();
    for (let start = 0; start < keys.length; start += 500) {
      const rows = await this.db
        .selectFrom("files")
        .select("blob")
        .where("blob", "in", keys.slice(start, start + 500))
        .execute();
      for (const row of rows) found.add(row.blob);
    }
    return found;
  }

  /** Records a stored file and adds its pairs to the dataset; undefined if the dataset is gone. */
  async addFile(
    userId: string,
    datasetId: string,
    file: { id: string; name: string; size: number; format: string; ioPairsCount: number; blob: string },
  ): Promise<DatasetFile | undefined> {
    return this.db.transaction().execute(async (tx) => {
      const now = timestamp();
      const updated = await tx
        .updateTable("datasets")
        .set((eb) => ({ io_pairs_count: eb("io_pairs_count", "+", file.ioPairsCount), updated_at: now }))
        .where("id", "=", datasetId)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      if (Number(updated.numUpdatedRows) === 0) return undefined;
      const row: FileTable = {
        id: file.id,
        dataset_id: datasetId,
        user_id: userId,
        name: file.name,
        size: file.size,
        type: "IO",
        format: file.format,
        io_pairs_count: file.ioPairsCount,
        blob: file.blob,
        created_at: now,
        updated_at: now,
      };
      await tx.insertInto("files").values(row).execute();
      return toFile(row);
    });
  }

  /** Deletes a file record and subtracts its pairs; returns its blob key, or undefined if absent. */
  async deleteFile(userId: string, datasetId: string, fileId: string): Promise<string | undefined> {
    return this.db.transaction().execute(async (tx: Transaction<Database>) => {
      const file = await tx
        .selectFrom("files")
        .select(["blob", "io_pairs_count"])
        .where("id", "=", fileId)
        .where("dataset_id", "=", datasetId)
        .where("user_id", "=", userId)
        .executeTakeFirst();
      if (!file) return undefined;
      await tx.deleteFrom("files").where("id", "=", fileId).execute();
      await tx
        .updateTable("datasets")
        .set((eb) => ({
          io_pairs_count: eb("io_pairs_count", "-", file.io_pairs_count),
          updated_at: timestamp(),
        }))
        .where("id", "=", datasetId)
        .execute();
      return file.blob;
    });
  }
}
