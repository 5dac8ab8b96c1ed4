/**
 * Wire types of OpenAI's Responses API (`POST /v1/responses`), stateless: the request body, with OpenAI's
 * defaults, and the response object. Every field OpenAI documents is honoured or refused with a 400 naming it.
 */
import { Type, type Static } from "@sinclair/typebox";
import { Nullable, OrNull } from "../nullable.ts";
import { noControlCharacters, noNul, REASON } from "../patterns.ts";
import { openAiName } from "./common.ts";
import { FunctionName, NotYet, Nothing, OpenAiSampling } from "./openai.ts";

const Text = Type.String({ pattern: noNul });
const ItemId = Nullable(Type.String({ maxLength: 256, pattern: noControlCharacters }), {
  description: "The item's id, as an earlier response wrote it. Not used.",
});
const ItemStatus = Nullable(
  Type.Union([Type.Literal("in_progress"), Type.Literal("completed"), Type.Literal("incomplete")]),
  { description: "Not used." },
);
const CallId = Type.String({
  minLength: 1,
  maxLength: 256,
  pattern: noControlCharacters,
  description: "The call's id (`call_id` of the `function_call` item).",
});

/** A text part of a message: `input_text` (what the user or system wrote) or `output_text` (an earlier answer). */
const ResponsesTextPart = Type.Union(
  [
    Type.Object({ type: Type.Literal("input_text"), text: Text }, { additionalProperties: false }),
    Type.Object(
      {
        type: Type.Literal("output_text"),
        text: Text,
        annotations: Nullable(Nothing),
        logprobs: Nullable(Type.Array(Type.Unknown()), { description: "Not used." }),
      },
      { additionalProperties: false },
    ),
  ],
  {
    [REASON]:
      'must be {"type": "input_text", "text": ...} or {"type": "output_text", "text": ...}; image, file, audio and refusal parts are not supported yet',
  },
);

const ResponsesMessage = Type.Object(
  {
    type: Nullable(Type.Literal("message"), { description: "Defaults to `message`." }),
    role: Type.Union(
      [Type.Literal("user"), Type.Literal("assistant"), Type.Literal("system"), Type.Literal("developer")],
      {
        description: "`developer` is a system message.",
        [REASON]: 'must be "user", "assistant", "system" or "developer"',
      },
    ),
    content: Type.Union([Text, Type.Array(ResponsesTextPart, { maxItems: 1024 })], {
      description: "A string, or text parts (joined).",
      [REASON]:
        "must be a string or an array of text parts; image, file and audio parts are not supported yet",
    }),
    id: ItemId,
    status: ItemStatus,
  },
  { additionalProperties: false },
);

const ResponsesFunctionCall = Type.Object(
  {
    type: Type.Literal("function_call"),
    call_id: CallId,
    name: FunctionName,
    arguments: Type.String({ pattern: noNul, description: "The arguments object as JSON text." }),
    id: ItemId,
    status: ItemStatus,
  },
  { additionalProperties: false },
);

const ResponsesFunctionCallOutput = Type.Object(
  {
    type: Type.Literal("function_call_output"),
    call_id: CallId,
    output: Type.Union([Text, Type.Array(ResponsesTextPart, { maxItems: 1024 })], {
      description: "What the function answered: text, or text parts (joined).",
    }),
    id: ItemId,
    status: ItemStatus,
  },
  { additionalProperties: false },
);

/** One item of `input`: a message, a function call an earlier answer made, or a function's output. */
export const ResponsesInputItem = Type.Union(
  [ResponsesMessage, ResponsesFunctionCall, ResponsesFunctionCallOutput],
  {
    [REASON]:
      'must be a message ({"role", "content"}), a {"type": "function_call"} or a {"type": "function_call_output"} item; ' +
      "reasoning, item references and built-in tool items are not supported yet",
  },
);

/** A function tool, as the Responses API writes it (flat: `name` and `parameters` at the top). */
const ResponsesTool = Type.Object(
  {
    type: Type.Literal("function"),
    name: FunctionName,
    description: Nullable(Text),
    parameters: Nullable(Type.Record(Type.String(), Type.Unknown()), {
      description:
        "A JSON Schema of the arguments object. A call forced by `tool_choice` follows it when the grammar can " +
        "express it (the keywords `text.format` takes), else its arguments are any JSON object.",
    }),
    strict: Nullable(Type.Boolean(), { description: "Accepted; see `parameters`." }),
  },
  { additionalProperties: false },
);

/** A function tool, or a 400 at the tool saying built-in tools are not supported (an `anyOf`, for the reason). */
const ResponsesToolItem = Type.Union([ResponsesTool, Type.Never()], {
  [REASON]:
    'must be a function tool ({"type": "function", "name": ..., "parameters": {...}}); built-in tools (web search, file search, …) are not supported',
});

const ResponsesToolChoice = Type.Union(
  [
    Type.Literal("none"),
    Type.Literal("auto"),
    Type.Literal("required"),
    Type.Object({ type: Type.Literal("function"), name: FunctionName }, { additionalProperties: false }),
  ],
  {
    description:
      '`"auto"` (the default): the model may call; `"none"`: no calls are parsed; `"required"` or ' +
      '`{"type": "function", "name": …}`: exactly one call, enforced by a grammar.',
    [REASON]: 'must be "none", "auto", "required" or {"type": "function", "name": ...}',
  },
);

/** `text.format`: the Responses API's `response_format`, with the JSON schema's fields at the top. */
export const ResponsesTextFormat = Type.Union(
  [
    Type.Object({ type: Type.Literal("text") }, { additionalProperties: false }),
    Type.Object({ type: Type.Literal("json_object") }, { additionalProperties: false }),
    Type.Object(
      {
        type: Type.Literal("json_schema"),
        name: Type.String({ pattern: openAiName, description: "The format's name. Not used." }),
        schema: Type.Record(Type.String(), Type.Unknown(), {
          description:
            "The JSON Schema the answer must match; the keywords of `response_format` on chat completions.",
        }),
        description: Nullable(Type.String(), { description: "Not used." }),
        strict: Nullable(Type.Boolean(), { description: "Accepted; the schema is always enforced exactly." }),
      },
      { additionalProperties: false },
    ),
  ],
  {
    description:
      '`{"type": "text"}` (the default), `{"type": "json_object"}` or `{"type": "json_schema", "name", "schema"}`, ' +
      "enforced by a grammar while sampling.",
    [REASON]:
      'must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "name": ..., "schema": {...}}',
  },
);

const notStored = "Conduit does not store responses: send the whole conversation as `input`";

export const OpenAiResponsesBody = Type.Object(
  {
    model: OpenAiSampling.model,
    input: Type.Union([Text, Type.Array(ResponsesInputItem, { minItems: 1, maxItems: 4096 })], {
      description:
        "The user's text, or the conversation as a list of items (messages, function calls and their outputs).",
      [REASON]: "must be a string or a non-empty array of input items",
    }),
    instructions: Nullable(Text, { description: "A system message put before `input`." }),
    max_output_tokens: Nullable(Type.Integer({ minimum: 1 }), {
      description:
        'Most tokens to generate; a longer answer ends with `status: "incomplete"`. Absent: up to the room left in the context.',
    }),
    temperature: OpenAiSampling.temperature,
    top_p: OpenAiSampling.top_p,
    stream: OrNull(Type.Boolean(), {
      default: false,
      description:
        "Server-Sent Events with OpenAI's typed events (`response.created` … `response.completed`). Defaults to `false`.",
    }),
    stream_options: Nullable(
      Type.Object(
        { include_obfuscation: NotYet("stream obfuscation", { schema: Type.Literal(false), text: "false" }) },
        { additionalProperties: false },
      ),
    ),
    tools: Nullable(Type.Array(ResponsesToolItem, { maxItems: 128 }), {
      description:
        "Functions the model may call, rendered by the model's chat template (as `tools` of chat completions); a " +
        "model whose template has no tool support is a `400` naming `tools`. Calls come back as `function_call` items.",
    }),
    tool_choice: Nullable(ResponsesToolChoice),
    parallel_tool_calls: Nullable(Type.Boolean(), {
      description: "`false`: at most one call per answer (the first). Defaults to `true`.",
    }),
    text: Nullable(
      Type.Object(
        {
          format: Nullable(ResponsesTextFormat),
          verbosity: NotYet("verbosity", { schema: Type.Literal("medium"), text: '"medium"' }),
        },
        { additionalProperties: false },
      ),
    ),
    previous_response_id: Type.Optional(
      Type.Null({ description: `Not supported: ${notStored}.`, [REASON]: `is not supported: ${notStored}` }),
    ),
    store: Nullable(Type.Literal(false), {
      description: "Only `false`: responses are not stored. Absent or `null`: not stored.",
      [REASON]: `must be false: ${notStored}`,
    }),
    conversation: Type.Optional(
      Type.Null({ description: `Not supported: ${notStored}.`, [REASON]: `is not supported: ${notStored}` }),
    ),
    background: NotYet("background responses", { schema: Type.Literal(false), text: "false" }),
    metadata: Nullable(
      Type.Record(Type.String({ maxLength: 64 }), Type.String({ maxLength: 512 }), { maxProperties: 16 }),
      { description: "Up to 16 keys of your own, sent back in the response." },
    ),
    user: OpenAiSampling.user,
    safety_identifier: Nullable(Type.String(), {
      description: "Your end user's id; written to the request's log line.",
    }),
    prompt_cache_key: Nullable(Type.String({ maxLength: 1024 }), {
      description: "Accepted and unused: Conduit's prefix cache is automatic.",
    }),
    truncation: NotYet("truncating the input", { schema: Type.Literal("disabled"), text: '"disabled"' }),
    include: NotYet("extra output data", { schema: Nothing, text: "[]" }),
    reasoning: NotYet("reasoning options"),
    max_tool_calls: NotYet("a cap on built-in tool calls"),
    prompt: NotYet("prompt templates"),
    prompt_cache_retention: NotYet("choosing how long prompts stay cached"),
    service_tier: NotYet("service tiers", {
      schema: Type.Union([Type.Literal("auto"), Type.Literal("default")]),
      text: '"auto" or "default"',
    }),
    top_logprobs: NotYet("log probabilities", { schema: Type.Literal(0), text: "0" }),
  },
  { additionalProperties: false },
);

const OutputText = Type.Object(
  {
    type: Type.Literal("output_text"),
    text: Type.String(),
    annotations: Type.Array(Type.Unknown(), { maxItems: 0 }),
    logprobs: Type.Array(Type.Unknown(), { maxItems: 0 }),
  },
  { additionalProperties: false },
);

const ItemStatusOut = Type.Union([
  Type.Literal("in_progress"),
  Type.Literal("completed"),
  Type.Literal("incomplete"),
]);

/** An item of a response's `output`: the answer's text, or one function call. */
export const ResponseOutputItem = Type.Union([
  Type.Object(
    {
      type: Type.Literal("message"),
      id: Type.String(),
      status: ItemStatusOut,
      role: Type.Literal("assistant"),
      content: Type.Array(OutputText),
    },
    { additionalProperties: false },
  ),
  Type.Object(
    {
      type: Type.Literal("function_call"),
      id: Type.String(),
      call_id: Type.String({ description: "What a `function_call_output` item names to answer it." }),
      name: Type.String(),
      arguments: Type.String({ description: "The arguments object as JSON text." }),
      status: ItemStatusOut,
    },
    { additionalProperties: false },
  ),
]);

/** OpenAI's response object. Open to further fields (OpenAI adds some over time). */
export const OpenAiResponse = Type.Object(
  {
    id: Type.String({ description: "`resp_…`; not stored, so it cannot be fetched or continued." }),
    object: Type.Literal("response"),
    created_at: Type.Integer({ description: "Unix seconds." }),
    status: Type.Union([Type.Literal("in_progress"), Type.Literal("completed"), Type.Literal("incomplete")], {
      description: "`incomplete` when the answer reached `max_output_tokens` or the end of the context.",
    }),
    error: Type.Null(),
    incomplete_details: Type.Union([
      Type.Object({ reason: Type.Literal("max_output_tokens") }, { additionalProperties: false }),
      Type.Null(),
    ]),
    model: Type.String(),
    output: Type.Array(ResponseOutputItem),
    usage: Type.Union([
      Type.Object(
        {
          input_tokens: Type.Integer(),
          input_tokens_details: Type.Object({ cached_tokens: Type.Integer() }),
          output_tokens: Type.Integer(),
          output_tokens_details: Type.Object({ reasoning_tokens: Type.Integer() }),
          total_tokens: Type.Integer(),
        },
        { additionalProperties: false },
      ),
      Type.Null(),
    ]),
  },
  { $id: "OpenAiResponse", additionalProperties: true },
);

export const responsesEvents =
  "Server-Sent Events, each named by its `type`: `response.created`, `response.in_progress`, then per output " +
  "item `response.output_item.added`, for text `response.content_part.added`, `response.output_text.delta`…, " +
  "`response.output_text.done`, `response.content_part.done`, for a call `response.function_call_arguments.delta` " +
  "and `.done`, then `response.output_item.done`; last `response.completed` (or `response.incomplete`) with the " +
  'whole response. Every event has a `sequence_number`. An error after the first event is a final `data: {"error":{...}}`.';

export type OpenAiResponsesBodyWire = Static<typeof OpenAiResponsesBody>;
export type ResponsesInputItemWire = Static<typeof ResponsesInputItem>;
export type ResponsesTextFormatWire = Static<typeof ResponsesTextFormat>;
