import type { EmbeddingInput, EmbeddingOutput } from "../../inference/InferenceService.ts";
import type { EmbeddingListWire, EmbeddingsBodyWire } from "../../contract/generation.ts";

/**
 * An embeddings body of either face (`/v1/embeddings`, `/conduit/v1/embeddings`: the same fields) as the
 * inference service's request: `input` is one text, texts, one list of token ids, or lists of them.
 */
export function fromEmbeddingsBody(body: EmbeddingsBodyWire): Omit<EmbeddingInput, "signal"> {
  const { input } = body;
  const inputs: (string | number[])[] =
    typeof input === "string"
      ? [input]
      : input.every((item) => typeof item === "number")
        ? [input as number[]]
        : (input as (string | number[])[]);
  return { model: body.model, inputs, dimensions: body.dimensions };
}

/**
 * The vectors as OpenAI's embedding list, named as the request named the model (an `ft:` name stays one);
 * `base64`: each vector's little-endian float32 bytes.
 */
export function toEmbeddingList(
  model: string,
  result: EmbeddingOutput,
  encoding: "float" | "base64" | undefined,
): EmbeddingListWire {
  return {
    object: "list",
    data: result.vectors.map((vector, index) => ({
      object: "embedding",
      index,
      embedding: encoding === "base64" ? float32Base64(vector) : vector,
    })),
    model,
    usage: { prompt_tokens: result.promptTokens, total_tokens: result.promptTokens },
  };
}

function float32Base64(vector: number[]): string {
  const floats = Float32Array.from(vector);
  const bytes = Buffer.from(floats.buffer, floats.byteOffset, floats.byteLength);
  // Float32Array is in the platform's byte order; the wire's is little-endian.
  if (new Uint8Array(Uint16Array.of(1).buffer)[0] === 0) bytes.swap32();
  return bytes.toString("base64");
}
