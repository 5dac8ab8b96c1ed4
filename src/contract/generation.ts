/**
 * Wire types of generation, by face: `generation/conduit.ts` (the Conduit API's chat and completions),
 * `generation/openai.ts` (the OpenAI-compatible routes), `generation/responses.ts` (OpenAI's Responses API),
 * `generation/embeddings.ts` (both faces' embeddings) and `generation/common.ts` (what all use).
 */
export * from "./generation/common.ts";
export * from "./generation/conduit.ts";
export * from "./generation/openai.ts";
export * from "./generation/responses.ts";
export * from "./generation/embeddings.ts";
