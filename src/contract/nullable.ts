import { Type, type SchemaOptions, type TSchema } from "@sinclair/typebox";

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
