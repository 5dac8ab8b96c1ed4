import { Readable } from "node:stream";
import type { FastifyInstance, FastifyRequest } from "fastify";
import multipart from "@fastify/multipart";
import { TypeCompiler } from "@sinclair/typebox/compiler";
import type { DatasetService, ReceivedFile, UploadInput } from "../datasets/DatasetService.ts";
import type { IoFormat } from "../datasets/ioPairs.ts";
import { ConduitError } from "../errors.ts";
import { FileFormat, Name, type UploadJsonBodyWire } from "../contract/schemas.ts";

export { rawContentTypes } from "../contract/schemas.ts";

const fileName = TypeCompiler.Compile(Name);
const fileFormat = TypeCompiler.Compile(FileFormat);

/**
 * Lets the routes of `context` (an encapsulated plugin holding upload routes) read multipart bodies, one
 * file each. Registered there, not on the whole app: the plugin adds three hooks (onRequest, preValidation,
 * onResponse) to every route in its context, a measurable share of a small GET's cost (bench/api.ts).
 */
export async function acceptMultipart(context: FastifyInstance, maxUploadBytes: number): Promise<void> {
  await context.register(multipart, {
    limits: { fileSize: maxUploadBytes + 1, files: 1, fields: 8, fieldSize: 1024 },
  });
}

/**
 * A JSON upload (`{name, content}`, `{name, ioPairs}`) is parsed and validated whole, synchronously, so it is held
 * to the JSON body limit, not the file limit of its route: 80 MiB of `ioPairs` held the event loop for 5 s. The
 * JSON parser refuses a bigger body (`jsonTooLarge`); this hook on an upload context refuses one whose
 * Content-Length says so before it is read.
 */
export function limitJsonUploads(context: FastifyInstance, bodyLimit: number): void {
  context.addHook("preParsing", async (request, _reply, payload) => {
    const type = request.headers["content-type"]?.split(";")[0]?.trim().toLowerCase();
    if (type === "application/json" && Number(request.headers["content-length"]) > bodyLimit)
      throw jsonTooLarge(bodyLimit);
    return payload;
  });
}

/** The 413 of a JSON body over `CONDUIT_BODY_LIMIT`. */
export function jsonTooLarge(bodyLimit: number): ConduitError {
  return new ConduitError(
    "payload_too_large",
    `a JSON body is at most ${bodyLimit} bytes (CONDUIT_BODY_LIMIT); upload a bigger file as ` +
      "multipart/form-data or as a raw body",
  );
}

interface UploadQuery {
  name?: string | undefined;
  format?: IoFormat | undefined;
}

/**
 * The three ways to send a file: multipart, a raw body, or JSON (`content` or `ioPairs`). The
 * name is checked by the same rule whichever way it comes.
 */
export async function uploadSource(
  request: FastifyRequest,
  query: UploadQuery,
  datasets: DatasetService,
): Promise<UploadInput> {
  if (request.isMultipart()) return multipartSource(request, query, datasets);
  if (request.body instanceof Readable)
    return { name: query.name ?? rawUploadName(request), source: request.body, format: query.format };
  if (request.body === undefined || request.body === null)
    throw new ConduitError(
      "invalid_request",
      "the upload has no body: send the file as multipart/form-data, as a raw body (Content-Type " +
        "application/jsonl, text/csv, ... with ?name=) or as JSON {name, content} or {name, ioPairs}",
      { param: "file" },
    );
  // The route's schema has checked it (`UploadBody`'s JSON form), exactly one of `content` and `ioPairs` included.
  const body = request.body as UploadJsonBodyWire;
  if (body.ioPairs !== undefined) {
    const lines = body.ioPairs.map(
      (pair) => JSON.stringify({ input: pair.input, output: pair.output }) + "\n",
    );
    return { name: body.name, source: Readable.from(lines), format: "jsonl" };
  }
  return {
    name: body.name,
    source: Readable.from([Buffer.from(body.content ?? "", "utf8")]),
    format: body.format,
  };
}

/**
 * A raw upload's name when `?name=` is left out: `upload`, with the extension its media type implies
 * (`upload.jsonl`, `upload.csv`); a `text/plain` or `application/octet-stream` file's format is then
 * detected from its first character, as for a name without an extension.
 */
function rawUploadName(request: FastifyRequest): string {
  const type = request.headers["content-type"]?.split(";")[0]?.trim().toLowerCase();
  if (type === "application/jsonl" || type === "application/x-ndjson") return "upload.jsonl";
  if (type === "text/csv") return "upload.csv";
  return "upload";
}

/**
 * Multipart: the `file` part streams to a temp file, and the `name` and `format` fields count
 * wherever they come (curl sends them in the order of its `-F` options). The body is read to its
 * end before anything is stored, so a truncated one is refused.
 */
async function multipartSource(
  request: FastifyRequest,
  query: UploadQuery,
  datasets: DatasetService,
): Promise<UploadInput> {
  let file: ReceivedFile | undefined;
  try {
    let filename: string | undefined;
    const fields: { name?: string; format?: string } = {};
    for await (const part of request.parts()) {
      if (part.type === "file") {
        if (part.fieldname !== "file") {
          part.file.resume();
          throw new ConduitError(
            "invalid_request",
            `multipart file field "${part.fieldname}" is not "file"`,
            {
              param: "file",
            },
          );
        }
        file = await datasets.receive(part.file);
        filename = part.filename;
      } else if (part.fieldname === "name" || part.fieldname === "format") {
        fields[part.fieldname] = String(part.value);
      } else {
        throw new ConduitError(
          "invalid_request",
          `multipart field "${part.fieldname}" is not known; send "file" and optionally "name" and "format"`,
          { param: part.fieldname },
        );
      }
    }
    if (!file)
      throw new ConduitError("invalid_request", 'multipart body has no "file" field', { param: "file" });
    if (fields.format !== undefined && !fileFormat.Check(fields.format))
      throw new ConduitError("invalid_request", 'field "format" must be "jsonl", "json" or "csv"', {
        param: "format",
      });
    const name = fields.name ?? query.name ?? (filename || "upload");
    if (!fileName.Check(name))
      throw new ConduitError(
        "invalid_request",
        fields.name !== undefined
          ? 'field "name" must be 1 to 256 characters without control characters'
          : 'the file\'s name must be 1 to 256 characters without control characters; send a "name" field',
        { param: fields.name !== undefined ? "name" : "file" },
      );
    return { name, source: file, format: (fields.format as IoFormat | undefined) ?? query.format };
  } catch (error) {
    if (file) await datasets.discard(file);
    throw malformed(error);
  }
}

/** busboy's parse errors carry no code: they mean the client sent a malformed multipart body. */
export function malformed(error: unknown): unknown {
  if (!(error instanceof Error) || error instanceof ConduitError || "code" in error) return error;
  if (!/^Multipart: |multipart data/.test(error.message)) return error;
  return new ConduitError("invalid_request", `malformed multipart body: ${error.message}`);
}
