import secureJson from "secure-json-parse";

/**
 * A JSON request body's bytes to its value, with the rules every JSON body is held to: UTF-8 text (RFC 8259; other
 * bytes are refused, not read as U+FFFD), Fastify's own parse (`__proto__` and `constructor.prototype` keys dropped:
 * no prototype pollution, while free-form objects such as a JSON schema keep every other key), and no lone UTF-16
 * surrogate in a string or key (JSON's `\ud800` escapes can spell one; no UTF-8 text, nor the database, can hold
 * it). Pure and plain data in and out, so that a big body can be parsed in a worker thread (`JsonParserThread`).
 */
export type ParsedJsonBody =
  | { value: unknown }
  | { error: { code: "invalid_json" | "invalid_request"; message: string; param?: string } };

const utf8 = new TextDecoder("utf-8", { fatal: true });

export function parseJsonBody(bytes: Uint8Array): ParsedJsonBody {
  let text: string;
  try {
    text = utf8.decode(bytes);
  } catch {
    return { error: { code: "invalid_json", message: "the body is not valid JSON: it is not UTF-8 text" } };
  }
  let value: unknown;
  try {
    value = secureJson.parse(text, undefined, { protoAction: "remove", constructorAction: "remove" });
  } catch {
    return { error: { code: "invalid_json", message: "the body is not valid JSON" } };
  }
  const bad = loneSurrogate(value);
  if (bad === undefined) return { value };
  return {
    error: {
      code: "invalid_request",
      message: `${bad === "" ? "the body" : `"${bad}"`} holds a lone UTF-16 surrogate (an unpaired \\ud800–\\udfff escape), which is not text`,
      ...(bad === "" ? {} : { param: bad }),
    },
  };
}

/** The path (`messages[2].content`) of the first string, or object key, that is not well-formed UTF-16, if any. */
function loneSurrogate(value: unknown, at = ""): string | undefined {
  if (typeof value === "string") return value.isWellFormed() ? undefined : at;
  if (Array.isArray(value)) {
    for (const [i, item] of value.entries()) {
      const found = loneSurrogate(item, `${at}[${i}]`);
      if (found !== undefined) return found;
    }
    return undefined;
  }
  if (typeof value === "object" && value !== null)
    for (const [key, item] of Object.entries(value)) {
      const path = at === "" ? key : `${at}.${key}`;
      if (!key.isWellFormed()) return path;
      const found = loneSurrogate(item, path);
      if (found !== undefined) return found;
    }
  return undefined;
}
