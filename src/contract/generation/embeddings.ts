/** Wire types of embeddings, both faces: `POST /v1/embeddings` (OpenAI's) and `POST /conduit/v1/embeddings`. */
import { Type, type Static } from "@sinclair/typebox";
import { Nullable } from "../nullable.ts";
import { noControlCharacters, noNul, REASON } from "../patterns.ts";

/** Most inputs one embedding request may hold (OpenAI's limit). */
export const MAX_EMBEDDING_INPUTS = 2048;
/** Most tokens one embedding request may evaluate, all its inputs together (BOS and end tokens included). */
export const MAX_EMBEDDING_TOKENS = 65_536;

const TokenIds = Type.Array(Type.Integer({ minimum: 0, maximum: 4294967295 }), {
  minItems: 1,
  maxItems: MAX_EMBEDDING_TOKENS,
});

const Input = Type.Union(
  [
    Type.String({ minLength: 1, pattern: noNul }),
    Type.Array(Type.String({ minLength: 1, pattern: noNul }), {
      minItems: 1,
      maxItems: MAX_EMBEDDING_INPUTS,
    }),
    TokenIds,
    Type.Array(TokenIds, { minItems: 1, maxItems: MAX_EMBEDDING_INPUTS }),
  ],
  {
    description:
      `A text, up to ${MAX_EMBEDDING_INPUTS} texts, a list of token ids, or up to ${MAX_EMBEDDING_INPUTS} such lists: ` +
      "one vector each, in order. Texts are tokenized as plain text (no special tokens); the model's BOS token " +
      "is added in front of each input and the end token its vocabulary wants after it. Each input must fit the " +
      "model's context (`context_length`, capped at `CONDUIT_CONTEXT_SIZE`) less one token, and all of them " +
      `together hold at most ${MAX_EMBEDDING_TOKENS} tokens: past either bound the answer is a \`400\` naming \`input\`.`,
    [REASON]: `must be a non-empty string, an array of 1 to ${MAX_EMBEDDING_INPUTS} non-empty strings, an array of token ids, or an array of such arrays`,
  },
);

const EncodingFormat = Type.Union([Type.Literal("float"), Type.Literal("base64")], {
  default: "float",
  description:
    "`float`: each vector as an array of numbers; `base64`: its little-endian float32 bytes in base64 (what " +
    "OpenAI's clients ask for by default and decode). Defaults to `float`.",
});
const DIMENSIONS =
  "The vectors' length: accepted when it is the model's own (its embedding length); vectors are never " +
  "shortened, so another value is a `400` naming `dimensions`.";

const EmbeddingFields = {
  model: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 256,
      pattern: noControlCharacters,
      description:
        "A model id or one of your READY runs (id or `ft:` name): a LoRA fine-tune embeds with its adapter " +
        "applied. Defaults to `CONDUIT_DEFAULT_MODEL`.",
    }),
  ),
  input: Input,
  encoding_format: Type.Optional(EncodingFormat),
  dimensions: Type.Optional(Type.Integer({ minimum: 1, description: DIMENSIONS })),
};

/** `POST /v1/embeddings`: OpenAI's body (`null` is the default wherever OpenAI takes it). */
export const OpenAiEmbeddingsBody = Type.Object(
  {
    ...EmbeddingFields,
    encoding_format: Nullable(EncodingFormat, { description: EncodingFormat.description }),
    dimensions: Nullable(Type.Integer({ minimum: 1 }), { description: DIMENSIONS }),
    user: Nullable(Type.String(), { description: "Your end user's id; written to the request's log line." }),
  },
  { additionalProperties: false },
);

/** `POST /conduit/v1/embeddings`: the same fields, with the Conduit API's leniency (other fields are ignored). */
export const EmbeddingsBody = Type.Object(EmbeddingFields, { additionalProperties: true });

/** What both faces answer: OpenAI's embedding list. */
export const EmbeddingList = Type.Object({
  object: Type.Literal("list"),
  data: Type.Array(
    Type.Object({
      object: Type.Literal("embedding"),
      index: Type.Integer(),
      embedding: Type.Union([Type.Array(Type.Number()), Type.String()], {
        description: "The vector: numbers, or base64 of its little-endian float32 bytes (`encoding_format`).",
      }),
    }),
  ),
  model: Type.String({ description: "The model as asked for (an `ft:` name stays one)." }),
  usage: Type.Object({
    prompt_tokens: Type.Integer({ description: "Tokens evaluated, BOS and end tokens included." }),
    total_tokens: Type.Integer({ description: "Same as `prompt_tokens`." }),
  }),
});

export type OpenAiEmbeddingsBodyWire = Static<typeof OpenAiEmbeddingsBody>;
export type EmbeddingsBodyWire = Static<typeof EmbeddingsBody>;
export type EmbeddingListWire = Static<typeof EmbeddingList>;
