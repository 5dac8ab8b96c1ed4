import type { TSchema } from "@sinclair/typebox";
import type { FastifyRequest } from "fastify";

/** Removes the `null` fields a schema accepts `null` for (see `OrNull` in src/contract/nullable.ts) before validation. */
type JsonSchema = {
  type?: unknown;
  anyOf?: JsonSchema[];
  properties?: Record<string, JsonSchema>;
  items?: JsonSchema;
};

function acceptsNull(schema: JsonSchema): boolean {
  return schema.type === "null" || (schema.anyOf ?? []).some(acceptsNull);
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Deletes the `null` fields of `value` that `schema` accepts `null` for, at any depth. */
function strip(value: unknown, schema: JsonSchema): void {
  if (Array.isArray(value) && schema.items) for (const item of value) strip(item, schema.items);
  if (!isRecord(value)) return;
  for (const [key, field] of Object.entries(schema.properties ?? {})) {
    if (value[key] === null && acceptsNull(field)) delete value[key];
    else if (value[key] !== undefined) strip(value[key], field);
  }
  for (const branch of schema.anyOf ?? []) strip(value, branch);
}

/** A `preValidation` hook that drops the body's `null` fields where `schema` accepts `null` (see `Nullable`). */
export function dropNulls(schema: TSchema) {
  return async (request: FastifyRequest): Promise<void> => strip(request.body, schema as JsonSchema);
}
