/**
 * OpenAI's Responses API (`POST /v1/responses`), stateless, translated: its body into the same generation
 * request as chat completions, the result into a response object, and a streamed answer into its typed
 * events. Pure functions; the route only calls them and `respondWithResponseEvents`.
 */
import type { ChatMessage, ResponseFormat } from "../../engine/types.ts";
import { ConduitError } from "../../errors.ts";
import type {
  OpenAiResponsesBodyWire,
  ResponsesInputItemWire,
  ResponsesTextFormatWire,
} from "../../contract/generation.ts";
import type { InferenceResult } from "../../inference/InferenceService.ts";
import type { GenerationInput } from "../generation/common.ts";

type Parts = string | { text: string }[];
const joined = (content: Parts) =>
  typeof content === "string" ? content : content.map((p) => p.text).join("");

/**
 * `instructions` (a system turn), then `input`: a string is the user's turn; items are messages, and function
 * calls (each joins the assistant turn before it, or starts one) with their outputs (`tool` turns).
 */
export function responsesMessages(
  body: Pick<OpenAiResponsesBodyWire, "instructions" | "input">,
): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (body.instructions !== undefined) messages.push({ role: "system", content: body.instructions });
  const items: ResponsesInputItemWire[] =
    typeof body.input === "string" ? [{ role: "user", content: body.input }] : body.input;
  for (const item of items) {
    if (item.type === "function_call") {
      const call = { id: item.call_id, name: item.name, arguments: item.arguments };
      const last = messages.at(-1);
      if (last?.role === "assistant") last.toolCalls = [...(last.toolCalls ?? []), call];
      else messages.push({ role: "assistant", content: "", toolCalls: [call] });
    } else if (item.type === "function_call_output")
      messages.push({ role: "tool", content: joined(item.output), toolCallId: item.call_id });
    else
      messages.push({
        role: item.role === "developer" ? "system" : item.role,
        content: joined(item.content),
      });
  }
  return messages;
}

/** `text.format` → the engine's grammar request; `text` (or none) is free text. */
export function textFormat(format: ResponsesTextFormatWire | undefined): ResponseFormat | undefined {
  if (format?.type === "json_object") return { kind: "json" };
  if (format?.type === "json_schema") return { kind: "json_schema", schema: format.schema };
  return undefined;
}

/** `POST /v1/responses`'s body → the generation request (OpenAI's defaults: `temperature` 1, `top_p` 1). */
export function fromResponsesRequest(body: OpenAiResponsesBodyWire): GenerationInput {
  const choice = body.tool_choice;
  return {
    model: body.model,
    messages: responsesMessages(body),
    sampling: {
      ...(body.max_output_tokens !== undefined ? { maxTokens: body.max_output_tokens } : {}),
      temperature: body.temperature,
      topK: 0,
      topP: body.top_p,
      presencePenalty: 0,
      frequencyPenalty: 0,
    },
    responseFormat: textFormat(body.text?.format),
    tools: body.tools?.map((t) => ({
      name: t.name,
      ...(t.description !== undefined ? { description: t.description } : {}),
      ...(t.parameters !== undefined ? { parameters: t.parameters } : {}),
    })),
    toolChoice: typeof choice === "object" ? { name: choice.name } : choice,
    parallelToolCalls: body.parallel_tool_calls,
  };
}

/** The generation's field names as the Responses API spells them. */
const responsesParams: Record<string, string> = {
  response_format: "text.format",
  maxTokens: "max_output_tokens",
  messages: "input",
};

/** A message of the shared generation with the field names it quotes (and `max_tokens`) in this face's words. */
function inResponsesWords(message: string): string {
  let out = message.replace(/\bmax_tokens\b/g, "max_output_tokens");
  for (const [from, to] of Object.entries(responsesParams)) out = out.replaceAll(`"${from}"`, `"${to}"`);
  return out;
}

/** An error of the shared generation, naming the field as this face's body does. */
export function toResponsesError(error: unknown): unknown {
  if (!(error instanceof ConduitError) || error.status >= 500) return error;
  const param = error.param === null ? null : (responsesParams[error.param] ?? error.param);
  const message = inResponsesWords(error.message);
  if (param === error.param && message === error.message) return error;
  return new ConduitError(error.code, message, {
    param,
    ...(error.retryAfter !== undefined ? { retryAfter: error.retryAfter } : {}),
    cause: error,
  });
}

/** What a response starts with: its id (`resp_…`), creation time (Unix seconds) and the model named. */
export interface ResponseHead {
  id: string;
  created_at: number;
  model: string;
}

type Status = "in_progress" | "completed" | "incomplete";

const outputText = (text: string) => ({ type: "output_text" as const, text, annotations: [], logprobs: [] });

/** Item ids follow from the response's: `msg_…` for its text, `fc_…_i` for its i-th call. */
const messageId = (head: ResponseHead) => `msg_${head.id.slice("resp_".length)}`;
const callId = (head: ResponseHead, i: number) => `fc_${head.id.slice("resp_".length)}_${i}`;

function messageItem(head: ResponseHead, text: string | undefined, status: Status) {
  return {
    type: "message" as const,
    id: messageId(head),
    status,
    role: "assistant" as const,
    content: text === undefined ? [] : [outputText(text)],
  };
}

function callItem(
  head: ResponseHead,
  i: number,
  call: { id: string; name: string; arguments: string },
  status: Status,
) {
  return {
    type: "function_call" as const,
    id: callId(head, i),
    call_id: call.id,
    name: call.name,
    arguments: status === "in_progress" ? "" : call.arguments,
    status,
  };
}

/** The request's settings a response repeats, with OpenAI's defaults. */
export function responseSettings(body: OpenAiResponsesBodyWire) {
  return {
    instructions: body.instructions ?? null,
    max_output_tokens: body.max_output_tokens ?? null,
    metadata: body.metadata ?? {},
    parallel_tool_calls: body.parallel_tool_calls ?? true,
    previous_response_id: null,
    reasoning: { effort: null, summary: null },
    store: false,
    temperature: body.temperature,
    text: { format: body.text?.format ?? { type: "text" } },
    tool_choice: body.tool_choice ?? "auto",
    tools: body.tools ?? [],
    top_p: body.top_p,
    truncation: "disabled",
    user: body.user ?? null,
    background: false,
  };
}

type Settings = ReturnType<typeof responseSettings>;

/** The answer's items: its text (when it has some, or no calls), then each call. */
function outputOf(head: ResponseHead, result: InferenceResult, status: Status) {
  const choice = result.choices[0];
  if (!choice) return [];
  const calls = choice.toolCalls ?? [];
  return [
    ...(choice.text !== "" || calls.length === 0 ? [messageItem(head, choice.text, status)] : []),
    ...calls.map((c, i) => callItem(head, i, c, "completed")),
  ];
}

function usageOf(result: InferenceResult) {
  return {
    input_tokens: result.promptTokens,
    input_tokens_details: { cached_tokens: result.cachedTokens },
    output_tokens: result.completionTokens,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: result.promptTokens + result.completionTokens,
  };
}

/** A finished generation as OpenAI's response object; cut short by the token cap, it is `incomplete`. */
export function toResponse(head: ResponseHead, settings: Settings, result: InferenceResult | undefined) {
  const incomplete = result?.choices[0]?.finishReason === "length";
  const status: Status = result === undefined ? "in_progress" : incomplete ? "incomplete" : "completed";
  return {
    id: head.id,
    object: "response" as const,
    created_at: head.created_at,
    status,
    error: null,
    incomplete_details: incomplete ? { reason: "max_output_tokens" as const } : null,
    model: head.model,
    output: result === undefined ? [] : outputOf(head, result, status),
    usage: result === undefined ? null : usageOf(result),
    ...settings,
  };
}

/** One streamed event: its `type` (also the SSE event's name) and its data, `sequence_number` included. */
export interface ResponseEvent {
  type: string;
  data: Record<string, unknown>;
}

/**
 * The events of one streamed response, in OpenAI's order: `start` (created, in progress), `text` for each
 * piece of the answer's text (the first adds the message item and its text part), `finish` (the text's and
 * each call's closing events, then `response.completed` or `response.incomplete`).
 */
export class ResponseEvents {
  private sequence = 0;
  /** The answer's text so far; `undefined` until its message item is added. */
  private written: string | undefined;
  private at = { item_id: "", output_index: 0, content_index: 0 };

  constructor(
    private readonly head: ResponseHead,
    private readonly settings: Settings,
  ) {}

  private event(type: string, fields: Record<string, unknown>): ResponseEvent {
    return { type, data: { type, sequence_number: this.sequence++, ...fields } };
  }

  start(): ResponseEvent[] {
    const response = toResponse(this.head, this.settings, undefined);
    return [this.event("response.created", { response }), this.event("response.in_progress", { response })];
  }

  text(delta: string): ResponseEvent[] {
    const events: ResponseEvent[] = [];
    if (this.written === undefined) {
      this.written = "";
      this.at = { item_id: messageId(this.head), output_index: 0, content_index: 0 };
      events.push(
        this.event("response.output_item.added", {
          output_index: 0,
          item: messageItem(this.head, undefined, "in_progress"),
        }),
        this.event("response.content_part.added", { ...this.at, part: outputText("") }),
      );
    }
    this.written += delta;
    if (delta !== "")
      events.push(this.event("response.output_text.delta", { ...this.at, delta, logprobs: [] }));
    return events;
  }

  finish(result: InferenceResult): ResponseEvent[] {
    const choice = result.choices[0];
    const calls = choice?.toolCalls ?? [];
    const response = toResponse(this.head, this.settings, result);
    const events: ResponseEvent[] = [];
    // An answer with no calls always has a message item, even an empty one.
    if (this.written === undefined && (calls.length === 0 || choice?.text !== ""))
      events.push(...this.text(choice?.text ?? ""));
    if (this.written !== undefined) {
      const text = this.written;
      events.push(
        this.event("response.output_text.done", { ...this.at, text, logprobs: [] }),
        this.event("response.content_part.done", { ...this.at, part: outputText(text) }),
        this.event("response.output_item.done", {
          output_index: 0,
          item: messageItem(this.head, text, response.status),
        }),
      );
    }
    const first = this.written === undefined ? 0 : 1;
    calls.forEach((call, i) => {
      const at = { item_id: callId(this.head, i), output_index: first + i };
      events.push(
        this.event("response.output_item.added", {
          output_index: at.output_index,
          item: callItem(this.head, i, call, "in_progress"),
        }),
        this.event("response.function_call_arguments.delta", { ...at, delta: call.arguments }),
        this.event("response.function_call_arguments.done", {
          ...at,
          name: call.name,
          arguments: call.arguments,
        }),
        this.event("response.output_item.done", {
          output_index: at.output_index,
          item: callItem(this.head, i, call, "completed"),
        }),
      );
    });
    events.push(
      this.event(response.status === "incomplete" ? "response.incomplete" : "response.completed", {
        response,
      }),
    );
    return events;
  }
}
