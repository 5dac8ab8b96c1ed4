import type { FastifyInstance } from "fastify";
import { Type } from "@sinclair/typebox";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import {
  CreateDatasetBody,
  Dataset,
  DatasetFile,
  DatasetParams,
  FileParams,
  IoPairPreview,
  Message,
  PageQuery,
  RenameDatasetBody,
  UploadBody,
  UploadQuery,
  responses,
} from "../../contract/schemas.ts";
import { acceptMultipart, limitJsonUploads, rawContentTypes, uploadSource } from "../uploadSource.ts";
import { toDatasetWire, toFileWire, SUCCESS } from "./wire.ts";

/** API document 4.2: datasets and their files. */
export default async function datasetRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { datasets } = core;
  const tags = ["datasets"];

  r.post(
    "/conduit/dataset",
    {
      schema: {
        tags,
        summary: "Create a dataset",
        body: CreateDatasetBody,
        response: responses({ 200: Dataset }, [400, 401, 413, 415, 507]),
      },
    },
    async (request) => toDatasetWire(await datasets.create(request.userId, request.body.name)),
  );

  r.get(
    "/conduit/dataset",
    {
      schema: {
        tags,
        summary: "List your datasets, newest first",
        querystring: PageQuery,
        response: responses({ 200: Type.Array(Dataset) }, [400, 401]),
      },
    },
    async (request) => (await datasets.list(request.userId, request.query)).map(toDatasetWire),
  );

  r.get(
    "/conduit/dataset/:dataset_id",
    {
      schema: {
        tags,
        summary: "Read a dataset",
        params: DatasetParams,
        response: responses({ 200: Dataset }),
      },
    },
    async (request) => toDatasetWire(await datasets.get(request.userId, request.params.dataset_id)),
  );

  r.patch(
    "/conduit/dataset/:dataset_id",
    {
      schema: {
        tags,
        summary: "Rename a dataset",
        params: DatasetParams,
        body: RenameDatasetBody,
        response: responses({ 200: Message }, [400, 401, 404, 413, 415, 507]),
      },
    },
    async (request) => {
      await datasets.rename(request.userId, request.params.dataset_id, request.body.name);
      return SUCCESS;
    },
  );

  r.delete(
    "/conduit/dataset/:dataset_id",
    {
      schema: {
        tags,
        summary: "Delete a dataset and its files",
        params: DatasetParams,
        response: responses({ 200: Message }),
      },
    },
    async (request) => {
      await datasets.delete(request.userId, request.params.dataset_id);
      return SUCCESS;
    },
  );

  datasetFileRoutes(app, core);
  await datasetUploadRoute(app, core);
}

/** A dataset's files: list, read, their pairs, delete. */
function datasetFileRoutes(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { datasets } = core;
  const tags = ["datasets"];

  r.get(
    "/conduit/dataset/:dataset_id/files",
    {
      schema: {
        tags,
        summary: "List a dataset's files, newest first",
        params: DatasetParams,
        querystring: PageQuery,
        response: responses({ 200: Type.Array(DatasetFile) }),
      },
    },
    async (request) =>
      (await datasets.listFiles(request.userId, request.params.dataset_id, request.query)).map(toFileWire),
  );

  r.get(
    "/conduit/dataset/:dataset_id/file/:file_id",
    {
      schema: {
        tags,
        summary: "Read a file's record",
        params: FileParams,
        response: responses({ 200: DatasetFile }),
      },
    },
    async (request) =>
      toFileWire(await datasets.getFile(request.userId, request.params.dataset_id, request.params.file_id)),
  );

  r.get(
    "/conduit/dataset/:dataset_id/file/:file_id/pairs",
    {
      schema: {
        tags,
        summary: "Preview a file's IO pairs",
        params: FileParams,
        querystring: PageQuery,
        response: responses({ 200: Type.Array(IoPairPreview) }),
      },
    },
    async (request) =>
      datasets.previewFile(request.userId, request.params.dataset_id, request.params.file_id, request.query),
  );

  r.delete(
    "/conduit/dataset/:dataset_id/file/:file_id",
    {
      schema: {
        tags,
        summary: "Delete a file from a dataset",
        params: FileParams,
        response: responses({ 200: Message }),
      },
    },
    async (request) => {
      await datasets.deleteFile(request.userId, request.params.dataset_id, request.params.file_id);
      return SUCCESS;
    },
  );
}

/** The upload of a file of pairs, in a context of its own (its raw-body parsers apply to it alone). */
async function datasetUploadRoute(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { datasets } = core;
  const tags = ["datasets"];

  // The upload route lives in its own context so its raw-body parsers apply to it alone.
  await r.register(async (upload) => {
    await acceptMultipart(upload, core.config.maxUploadBytes);
    limitJsonUploads(upload, core.config.bodyLimit);
    upload.addContentTypeParser(rawContentTypes, (_request, payload, done) => done(null, payload));
    upload.withTypeProvider<TypeBoxTypeProvider>().post(
      "/conduit/dataset/:dataset_id/upload",
      {
        bodyLimit: core.config.maxUploadBytes,
        schema: {
          tags,
          summary: "Upload a file of IO pairs",
          description:
            "Send the file as `multipart/form-data` (field `file`, optional fields `name` and `format`, in any order), as a raw body " +
            "(`Content-Type: application/jsonl`, `text/csv`, ... with `?name=`), or as JSON " +
            "`{name, content}` / `{name, ioPairs:[{input,output}]}`. Formats: JSONL, JSON array, CSV " +
            "(`input,output` columns; `prompt`/`completion` also accepted). Every pair is validated before " +
            "anything is stored: a bad line (invalid JSON or CSV, a missing field, text that is not UTF-8) is a 400 " +
            "naming the line. Beyond `CONDUIT_MAX_UPLOAD_BYTES`: 413. A body that stops arriving for " +
            "`CONDUIT_BODY_TIMEOUT_MS`: 408. A full disk: 507, and nothing is stored.",
          params: DatasetParams,
          querystring: UploadQuery,
          body: UploadBody,
          response: responses({ 200: DatasetFile }, [400, 401, 404, 408, 413, 415, 507]),
        },
      },
      async (request) => {
        const input = await uploadSource(request, request.query, datasets);
        return toFileWire(await datasets.upload(request.userId, request.params.dataset_id, input));
      },
    );
  });
}
