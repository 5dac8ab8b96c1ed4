import { Type, type SchemaOptions, type TSchema } from "@sinclair/typebox";
import type { FastifyRequest } from "fastify";

/**
 * OpenAI's clients send `null` for "the default" (LangChain's completions class always sends
 * `"seed": null`), so the OpenAI-compatible bodies accept `null` wherever OpenAI does. The schema
 * says so (`Nullable`), and `dropNulls` removes those fields before validation: defaults then
 * apply and the handler only ever sees a field as absent, never as `null`.
 */

/**
 * `schema` or `null`, typed as `schema` alone: `dropNulls` removes the `null` before the handler
 * sees it. A `default` in `options` applies to the field when it is absent or `null`.
 */
export function OrNull<T extends TSchema>(schema: T, options: SchemaOptions = {}): T {
  // Typed as `schema` (for both TypeBox's and the Fastify type provider's static types), so the
  // handler's types have no `null` either.
  return Type.Union([schema, Type.Null()], options) as unknown as T;
}

/** An optional field that also takes `null`, meaning absent. */
export function Nullable<T extends TSchema>(schema: T, options: SchemaOptions = {}) {
  return Type.Optional(OrNull(schema, options));
}

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
