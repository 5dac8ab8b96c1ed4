import type { FastifyInstance, FastifyRequest } from "fastify";
import multipart from "@fastify/multipart";
import { Type } from "@sinclair/typebox";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import { ConduitError } from "../../errors.ts";
import { Message, Name, responses } from "../../contract/schemas.ts";
import { Adapter, AdapterParams, ImportAdapterUpload, type AdapterWire } from "../../contract/adapters.ts";
import type { Adapter as AdapterRecord } from "../../domain/adapters.ts";
import type { AdapterService, ImportAdapter } from "../../train/AdapterService.ts";
import { malformed } from "../uploadSource.ts";
import { SUCCESS } from "./wire.ts";

const adapterName = TypeCompiler.Compile(Name);

function toAdapterWire(a: AdapterRecord): AdapterWire {
  return {
    id: a.id,
    name: a.name,
    base_model: a.baseModel,
    format: a.format,
    rank: a.rank,
    alpha: a.alpha,
    weights: a.weights,
    size_bytes: a.sizeBytes,
    created_at: a.createdAt,
  };
}

/** The file parts of an import, by field name. */
const FILE_FIELDS = { file: "gguf", adapter_model: "peftModel", adapter_config: "peftConfig" } as const;

/**
 * The multipart body of an import: `base_model`, optional `name`, and the files (`file`, or `adapter_model` and
 * `adapter_config`), in any order. Each file streams to a temp file under the size limit; the body is read to its
 * end before anything is checked.
 */
async function importCommand(request: FastifyRequest, adapters: AdapterService): Promise<ImportAdapter> {
  if (!request.isMultipart())
    throw new ConduitError(
      "invalid_request",
      'send the adapter as multipart/form-data: "base_model" and "file" (GGUF), or "adapter_model" and "adapter_config" (PEFT)',
      { param: "file" },
    );
  const command: Partial<ImportAdapter> = {};
  try {
    for await (const part of request.parts()) {
      if (part.type === "file") {
        const field = FILE_FIELDS[part.fieldname as keyof typeof FILE_FIELDS] as
          (typeof FILE_FIELDS)[keyof typeof FILE_FIELDS] | undefined;
        if (field === undefined || command[field] !== undefined) {
          part.file.resume();
          throw new ConduitError(
            "invalid_request",
            field === undefined
              ? `multipart file field "${part.fieldname.slice(0, 64)}" is not known; send "file", or "adapter_model" and "adapter_config"`
              : `multipart file field "${part.fieldname}" is sent twice`,
            { param: part.fieldname.slice(0, 64) },
          );
        }
        command[field] = await adapters.receive(part.file);
      } else if (part.fieldname === "base_model" || part.fieldname === "name") {
        const value = String(part.value);
        if (!adapterName.Check(value))
          throw new ConduitError(
            "invalid_request",
            `field "${part.fieldname}" must be 1 to 256 characters without control characters`,
            { param: part.fieldname },
          );
        if (part.fieldname === "name") command.name = value;
        else command.baseModel = value;
      } else
        throw new ConduitError(
          "invalid_request",
          `multipart field "${part.fieldname.slice(0, 64)}" is not known; send "base_model", "name" and the adapter's files`,
          { param: part.fieldname.slice(0, 64) },
        );
    }
    if (command.baseModel === undefined)
      throw new ConduitError(
        "invalid_request",
        'field "base_model" is required: the model the adapter is for',
        {
          param: "base_model",
        },
      );
    return command as ImportAdapter;
  } catch (error) {
    await adapters.discard(command as ImportAdapter);
    throw malformed(error);
  }
}

/** Imported LoRA adapters: import, list, read, delete. Served by id like a run (`model: "ad_…"`). */
export default async function adapterRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { adapters } = core;
  const tags = ["models"];
  // This plugin is its own context: multipart reaches the import route only.
  await app.register(multipart, {
    limits: { fileSize: adapters.maxBytes + 1, files: 2, fields: 4, fieldSize: 1024 },
  });

  r.post(
    "/conduit/models/adapters",
    {
      bodyLimit: adapters.maxBytes * 2 + 64 * 1024,
      schema: {
        tags,
        summary: "Import a LoRA adapter trained elsewhere, for a base model",
        description:
          "Multipart: `base_model` (a model of the models directory), an optional `name`, and either `file` (a GGUF " +
          "LoRA adapter) or `adapter_model` + `adapter_config` (a PEFT adapter's `adapter_model.safetensors` and " +
          "`adapter_config.json`, converted to a GGUF LoRA). The adapter is checked against the base before it is " +
          "kept: its architecture, every tensor's name and shape, its rank and alpha, and that every tensor lies " +
          "inside the file. A mismatch is a 400 naming it (`param`: the field at fault), and nothing is kept. " +
          "Chat with it by passing its `id` as `model`.",
        body: ImportAdapterUpload,
        response: responses({ 200: Adapter }, [400, 401, 404, 413, 415, 507]),
      },
    },
    async (request) => {
      const command = await importCommand(request, adapters);
      return toAdapterWire(await adapters.import(request.userId, command));
    },
  );

  r.get(
    "/conduit/models/adapters",
    {
      schema: {
        tags,
        summary: "List your imported adapters, oldest first",
        response: responses({ 200: Type.Array(Adapter) }, [401]),
      },
    },
    async (request) => (await adapters.list(request.userId)).map(toAdapterWire),
  );

  r.get(
    "/conduit/models/adapters/:adapter_id",
    {
      schema: {
        tags,
        summary: "Read an imported adapter",
        params: AdapterParams,
        response: responses({ 200: Adapter }),
      },
    },
    async (request) => toAdapterWire(await adapters.get(request.userId, request.params.adapter_id)),
  );

  r.delete(
    "/conduit/models/adapters/:adapter_id",
    {
      schema: {
        tags,
        summary: "Delete an imported adapter and its file",
        params: AdapterParams,
        response: responses({ 200: Message }),
      },
    },
    async (request) => {
      await adapters.delete(request.userId, request.params.adapter_id);
      return SUCCESS;
    },
  );
}
