import { randomBytes } from "node:crypto";
import type { ToolCallFormat } from "../model/chatTemplate.ts";
import type { ResponseFormat, ToolCall, ToolDefinition } from "../engine/types.ts";
import { unsupportedJsonSchema } from "../engine/grammars.ts";
import { schemaOverBounds } from "../engine/schemaBounds.ts";

/**
 * Tool calls in a model's answer, and a grammar that makes the model write one. What the model writes depends
 * on its chat template (`ToolCallFormat`): Hermes/Qwen/SmolLM3 wrap each call in `<tool_call>…</tool_call>`
 * (a JSON object, or a list of them), Mistral writes `[TOOL_CALLS]` and a list, Llama 3.x answers with the
 * call's JSON object alone. A call is `{"name": …, "arguments": {…}}` (`"parameters"` is read too).
 */

/** `tool_choice`: `auto` (the model decides), `none` (no calls), `required` (one call), or one named function. */
export type ToolChoice = "none" | "auto" | "required" | { name: string };

export interface ParsedAnswer {
  /** The answer's text outside its tool calls, trimmed when there were calls. */
  content: string;
  calls: ToolCall[];
}

/**
 * The calls of declared functions in `text`. A block that does not parse, or that names a function not in
 * `tools`, stays in the content as text.
 */
export function parseToolCalls(text: string, tools: readonly ToolDefinition[]): ParsedAnswer {
  const names = new Set(tools.map((t) => t.name));
  const calls: ToolCall[] = [];
  let content = text;
  // <tool_call>…</tool_call>; the last one may be cut short of its closing tag.
  if (text.includes("<tool_call>")) {
    content = text.replace(/<tool_call>([\s\S]*?)(?:<\/tool_call>|$)/g, (block, body: string) => {
      const found = callsIn(body, names);
      if (found === undefined) return block;
      calls.push(...found);
      return "";
    });
  } else {
    // Mistral's [TOOL_CALLS] is a control token, not in the text: its list, like a Llama 3.x call, is the whole answer.
    const body = text.replace(/^\s*\[TOOL_CALLS\]/, "");
    const found = callsIn(body, names);
    if (found !== undefined) {
      calls.push(...found);
      content = "";
    }
  }
  return calls.length > 0 ? { content: content.trim(), calls } : { content: text, calls: [] };
}

/** The calls in a JSON text (one call object or a list of them), or `undefined` when it holds none. */
function callsIn(json: string, names: ReadonlySet<string>): ToolCall[] | undefined {
  let value: unknown;
  try {
    value = JSON.parse(json.trim());
  } catch {
    return undefined;
  }
  const items = Array.isArray(value) ? value : [value];
  const calls: ToolCall[] = [];
  for (const item of items) {
    if (typeof item !== "object" || item === null) return undefined;
    const { name, arguments: args, parameters } = item as Record<string, unknown>;
    const given = args ?? parameters ?? {};
    if (typeof name !== "string" || !names.has(name)) return undefined;
    if (typeof given === "string") {
      calls.push({ id: callId(), name, arguments: given });
      continue;
    }
    if (typeof given !== "object" || given === null || Array.isArray(given)) return undefined;
    calls.push({ id: callId(), name, arguments: JSON.stringify(given) });
  }
  return calls.length > 0 ? calls : undefined;
}

function callId(): string {
  return `call_${randomBytes(12).toString("base64url")}`;
}

/**
 * The grammar that makes the model call a function (`tool_choice` `required`: any of `tools`; a name: that
 * one), in the template's format. The arguments follow the function's `parameters` when the grammar can
 * express them (see `unsupportedJsonSchema`), else they are any JSON object.
 */
export function forcedToolCall(
  format: ToolCallFormat,
  tools: readonly ToolDefinition[],
  choice: "required" | { name: string },
): ResponseFormat {
  const chosen = choice === "required" ? tools : tools.filter((t) => t.name === choice.name);
  const calls = chosen.map((tool) => ({
    type: "object",
    properties: { name: { const: tool.name }, arguments: argumentsSchema(tool) },
    required: ["name", "arguments"],
  }));
  const schema = calls.length === 1 ? calls[0] : { oneOf: calls };
  return format === "hermes"
    ? { kind: "wrapped_json_schema", schema, prefix: "<tool_call>\n", suffix: "\n</tool_call>" }
    : { kind: "wrapped_json_schema", schema, prefix: "", suffix: "" };
}

const ANY_OBJECT = { type: "object", additionalProperties: true };

function argumentsSchema(tool: ToolDefinition): unknown {
  const p = tool.parameters;
  if (p === undefined || p.type !== "object") return ANY_OBJECT;
  // Kept as it is, so that the call's schema is refused naming the bound it is over.
  if (schemaOverBounds(p) !== undefined) return p;
  // References into $defs only resolve at a schema's root, and the arguments are nested in the call.
  if (JSON.stringify(p).includes('"$ref"') || unsupportedJsonSchema(p) !== undefined) return ANY_OBJECT;
  const { $defs: _defs, ...rest } = p;
  return rest;
}
