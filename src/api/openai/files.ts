import fs from "node:fs";
import type { FastifyInstance, FastifyRequest } from "fastify";
import { Type } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import type { DatasetService, ReceivedFile, UploadInput } from "../../datasets/DatasetService.ts";
import { ConduitError } from "../../errors.ts";
import { toOpenAiFile, toOpenAiResultFile, resultFileRun } from "./fineTuningWire.ts";
import type { RunService } from "../../train/RunService.ts";
import {
  OpenAiFile,
  OpenAiFileDeleted,
  OpenAiFileList,
  OpenAiFileListQuery,
  OpenAiFileParams,
  OpenAiFileUpload,
} from "../../contract/openAiFineTuning.ts";
import { Name, responses } from "../../contract/schemas.ts";
import { acceptMultipart, limitJsonUploads, malformed } from "../uploadSource.ts";

const fileName = TypeCompiler.Compile(Name);

/**
 * OpenAI's files API on Conduit's files (see `fineTuningWire.ts`): an upload becomes a dataset of
 * its own holding the file; every file of your datasets is listed, read and deleted by its id. A succeeded
 * job's result file (`file-{job id}`, in the job's `result_files`) is what its run produced, read like a file
 * and deleted with the run.
 */
export default async function openAiFileRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { datasets, runs } = core;
  const tags = ["openai fine-tuning"];
  // This plugin is its own context: multipart reaches the /v1/files routes only.
  await acceptMultipart(app, core.config.maxUploadBytes);
  limitJsonUploads(app, core.config.bodyLimit);

  r.post(
    "/v1/files",
    {
      bodyLimit: core.config.maxUploadBytes,
      schema: {
        tags,
        summary: "OpenAI-compatible file upload (purpose fine-tune)",
        description:
          "Multipart with `file` and `purpose` (`fine-tune`). The file becomes a new dataset of its own, named after it, " +
          "and is validated like any upload (a bad line is a 400 naming it, and nothing is kept). JSONL of chat examples " +
          '(`{"messages": [...]}`, every assistant turn trained) or IO pairs, a JSON array, or CSV.',
        body: OpenAiFileUpload,
        response: responses({ 200: OpenAiFile }, [400, 401, 408, 413, 415, 507]),
      },
    },
    async (request) => {
      const input = await openAiUpload(request, datasets);
      return toOpenAiFile(await datasets.uploadAsDataset(request.userId, input));
    },
  );

  r.get(
    "/v1/files",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible file list: every file of your datasets",
        querystring: OpenAiFileListQuery,
        response: responses({ 200: OpenAiFileList }, [400, 401]),
      },
    },
    async (request) => {
      const { after, limit, order, purpose } = request.query;
      const files =
        purpose === undefined || purpose === "fine-tune"
          ? await datasets.listUserFiles(request.userId, { after, limit: limit + 1, order })
          : [];
      const data = files.slice(0, limit).map(toOpenAiFile);
      return {
        object: "list" as const,
        data,
        has_more: files.length > limit,
        first_id: data[0]?.id ?? null,
        last_id: data.at(-1)?.id ?? null,
      };
    },
  );

  r.get(
    "/v1/files/:file_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible file",
        params: OpenAiFileParams,
        response: responses({ 200: OpenAiFile }, [400, 401, 404, 409]),
      },
    },
    async (request) => {
      const { file_id } = request.params;
      const runId = resultFileRun(file_id);
      if (runId === undefined)
        return toOpenAiFile(await datasets.getUserFile(request.userId, file_id, "file_id"));
      const { run, artifact } = await resultFile(runs, request.userId, file_id, runId);
      return toOpenAiResultFile(run, artifact);
    },
  );

  r.get(
    "/v1/files/:file_id/content",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible file content: the file as uploaded, or a job's result file (its GGUF)",
        params: OpenAiFileParams,
        response: {
          200: {
            description: "The file's bytes.",
            content: {
              "application/octet-stream": { schema: Type.Unsafe({ type: "string", format: "binary" }) },
            },
          },
          ...responses({}, [400, 401, 404, 409]),
        },
      },
    },
    async (request, reply) => {
      const { file_id } = request.params;
      const runId = resultFileRun(file_id);
      if (runId !== undefined) {
        const { artifact } = await resultFile(runs, request.userId, file_id, runId);
        return reply
          .header("content-type", "application/octet-stream")
          .header("content-length", String(artifact.sizeBytes))
          .header("content-disposition", `attachment; filename="${artifact.fileName}"`)
          .send(fs.createReadStream(artifact.path));
      }
      const { file, path } = await datasets.userFilePath(request.userId, file_id, "file_id");
      return reply
        .header("content-type", "application/octet-stream")
        .header("content-length", String(file.size))
        .send(fs.createReadStream(path));
    },
  );

  r.delete(
    "/v1/files/:file_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible file delete",
        description:
          "Removes the file from its dataset, and the dataset too when no other file is left in it. A job's result " +
          "file goes with its run (`DELETE /conduit/finetuning/{finetune_id}`) and is refused here.",
        params: OpenAiFileParams,
        response: responses({ 200: OpenAiFileDeleted }),
      },
    },
    async (request) => {
      const runId = resultFileRun(request.params.file_id);
      if (runId !== undefined) {
        await resultFile(runs, request.userId, request.params.file_id, runId);
        throw new ConduitError(
          "invalid_request",
          `file ${request.params.file_id} is job ${runId}'s result and goes with its run: DELETE /conduit/finetuning/${runId}`,
          { param: "file_id" },
        );
      }
      await datasets.deleteUserFile(request.userId, request.params.file_id, "file_id");
      return { id: request.params.file_id, object: "file" as const, deleted: true };
    },
  );
}

/**
 * A job's result file: the run's own (someone else's run, or none, is a 404 naming the file) and what it produced
 * (`RunService.artifact`: a run that has not succeeded is a 409).
 */
async function resultFile(runs: RunService, userId: string, fileId: string, runId: string) {
  const run = await runs.get(userId, runId).catch((error: unknown) => {
    if (error instanceof ConduitError && error.code === "not_found")
      throw new ConduitError("not_found", `file ${fileId} not found`, { param: "file_id" });
    throw error;
  });
  return { run, artifact: await runs.artifact(userId, run.id) };
}

/**
 * The multipart body of `POST /v1/files`: a `file` part and a `purpose` field, in any order. The
 * file streams to a temp file; the body is read to its end before anything is stored.
 */
async function openAiUpload(request: FastifyRequest, datasets: DatasetService): Promise<UploadInput> {
  if (!request.isMultipart())
    throw new ConduitError(
      "invalid_request",
      'send the file as multipart/form-data with "file" and "purpose"',
      {
        param: "file",
      },
    );
  let file: ReceivedFile | undefined;
  try {
    let name: string | undefined;
    let purpose: string | undefined;
    for await (const part of request.parts()) {
      if (part.type === "file" && part.fieldname === "file") {
        if (file) await datasets.discard(file);
        file = await datasets.receive(part.file);
        name = part.filename;
      } else if (part.type === "field" && part.fieldname === "purpose") purpose = String(part.value);
      else {
        if (part.type === "file") part.file.resume();
        throw new ConduitError(
          "invalid_request",
          `multipart field "${part.fieldname}" is not supported; send "file" and "purpose"`,
          { param: part.fieldname },
        );
      }
    }
    if (purpose !== "fine-tune")
      throw new ConduitError(
        "invalid_request",
        purpose === undefined
          ? 'field "purpose" is required: "fine-tune"'
          : `field "purpose" must be "fine-tune" (the only purpose Conduit's files serve), not "${purpose.slice(0, 64)}"`,
        { param: "purpose" },
      );
    if (!file)
      throw new ConduitError("invalid_request", 'multipart body has no "file" field', { param: "file" });
    if (!name || !fileName.Check(name))
      throw new ConduitError(
        "invalid_request",
        "the file's name must be 1 to 256 characters without control characters",
        { param: "file" },
      );
    return { name, source: file };
  } catch (error) {
    if (file) await datasets.discard(file);
    throw malformed(error);
  }
}
