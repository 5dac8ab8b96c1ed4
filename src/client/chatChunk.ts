import { errorOfEvent } from "./ApiError.ts";

/** The part of a streamed chat chunk (`chat.completion.chunk`, OpenAI's shape) a client reads. */
interface ChatChunk {
  choices?: { delta?: { content?: string | null } }[];
}

/**
 * The text one event of a streamed chat adds to the answer: `""` for a chunk without any (the role, the
 * usage), `null` at the end (`data: [DONE]`). An error event (`data: {"error":{...}}`) throws its ApiError.
 */
export function chatChunkText(data: string): string | null {
  if (data === "[DONE]") return null;
  const chunk = JSON.parse(data) as unknown;
  const error = errorOfEvent(chunk);
  if (error) throw error;
  return (chunk as ChatChunk).choices?.[0]?.delta?.content ?? "";
}
