import type { Static } from "@sinclair/typebox";
import type {
  ChatBodyWire,
  ChatResult,
  EmbeddingListWire,
  EmbeddingsBodyWire,
  LoadedModelEntry,
  ModelEntry,
} from "./generation.ts";
import type { ErrorBody, IoPairPreview, Message, PageQuery } from "./schemas.ts";

/**
 * The static types the API client (src/client/) needs beyond those schemas.ts and generation.ts export.
 * Types only: the dashboard's bundle imports this module, and the TypeBox schemas stay out of it.
 */

export type ErrorBodyWire = Static<typeof ErrorBody>;
export type MessageWire = Static<typeof Message>;
export type PageQueryWire = Partial<Static<typeof PageQuery>>;
export type IoPairPreviewWire = Static<typeof IoPairPreview>;
export type ModelEntryWire = Static<typeof ModelEntry>;
export type LoadedModelEntryWire = Static<typeof LoadedModelEntry>;
export type ChatResultWire = Static<typeof ChatResult>;

/** `POST /conduit/v1/embeddings`'s body as a client writes it: the input, and whichever fields it sets. */
export type EmbeddingsRequest = Pick<EmbeddingsBodyWire, "input"> &
  Partial<Omit<EmbeddingsBodyWire, "input">>;
export type { EmbeddingListWire };

/** `POST /conduit/v1/chat`'s body as a client writes it: the prompt, and whichever fields it sets. */
export type ChatRequest = Pick<ChatBodyWire, "prompt"> & Partial<Omit<ChatBodyWire, "prompt" | "stream">>;
