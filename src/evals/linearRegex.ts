import { RE2JS } from "re2js";

/**
 * Regular expressions a user supplies (regex graders, `pattern` in a grader's JSON schema) run on RE2's engine
 * (re2js, a JavaScript port of RE2): matching takes time linear in the text, where JavaScript's backtracking
 * `RegExp` can take exponential time (`(a+)+$` on 29 characters held the event loop 80 s). RE2's syntax is
 * JavaScript's without lookaround (`(?=`, `(?!`, `(?<=`, `(?<!`) and backreferences (`\1`, `\k<name>`), which
 * are refused by name; JavaScript's `\uXXXX` and `\u{X…}` escapes are accepted and read as RE2's `\x{…}`.
 */
export interface LinearRegex {
  test(text: string): boolean;
}

/** Why a pattern cannot be compiled, in words a user can act on. */
export class LinearRegexError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "LinearRegexError";
  }
}

/** The flags a regex grader takes, as RE2's. `u` changes nothing: RE2 always matches code points. */
const FLAGS: Record<string, number> = {
  i: RE2JS.CASE_INSENSITIVE,
  m: RE2JS.MULTILINE,
  s: RE2JS.DOTALL,
  u: 0,
};

const UNSUPPORTED: [RegExp, string][] = [
  [/^\(\?=/, "lookahead `(?=…)`"],
  [/^\(\?!/, "negative lookahead `(?!…)`"],
  [/^\(\?<=/, "lookbehind `(?<=…)`"],
  [/^\(\?<!/, "negative lookbehind `(?<!…)`"],
  [/^\\[1-9]/, "a backreference (`\\1`)"],
  [/^\\k</, "a named backreference (`\\k<name>`)"],
];

/**
 * Rewrites JavaScript-only escapes into RE2's and names the first construct RE2 does not have. One pass over the
 * pattern, outside and inside character classes alike (an escape means the same in both).
 */
function toRe2Syntax(pattern: string): string {
  let out = "";
  let inClass = false;
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i] as string;
    if (c === "\\") {
      const rest = pattern.slice(i, i + 12);
      const unicode = /^\\u(?:([0-9a-fA-F]{4})|\{([0-9a-fA-F]{1,6})\})/.exec(rest);
      if (unicode) {
        out += `\\x{${unicode[1] ?? unicode[2]}}`;
        i += unicode[0].length - 1;
        continue;
      }
      if (!inClass) refuseUnsupported(rest);
      out += pattern.slice(i, i + 2);
      i++;
      continue;
    }
    if (c === "[" && !inClass) inClass = true;
    else if (c === "]" && inClass) inClass = false;
    else if (c === "(" && !inClass) refuseUnsupported(pattern.slice(i, i + 4));
    out += c;
  }
  return out;
}

function refuseUnsupported(head: string): void {
  for (const [construct, name] of UNSUPPORTED)
    if (construct.test(head))
      throw new LinearRegexError(
        `${name} is not supported: patterns run on a linear-time engine (RE2 syntax), which has no lookaround and no backreferences`,
      );
}

/** Compiles a pattern with JavaScript-style flags (`i`, `m`, `s`, `u`); a bad one throws {@link LinearRegexError}. */
export function compileLinearRegex(pattern: string, flags = ""): LinearRegex {
  let mask = 0;
  for (const flag of flags) {
    const bit = FLAGS[flag];
    if (bit === undefined) throw new LinearRegexError(`unknown flag "${flag}" (the flags are i, m, s and u)`);
    mask |= bit;
  }
  let compiled: RE2JS;
  try {
    compiled = RE2JS.compile(toRe2Syntax(pattern), mask);
  } catch (error) {
    if (error instanceof LinearRegexError) throw error;
    throw new LinearRegexError((error as Error).message.replace(/^error parsing regexp: /, ""));
  }
  return { test: (text) => compiled.matcher(text).find() };
}

/**
 * Ajv's `code.regExp` engine on RE2, so the `pattern` keywords of a user's JSON schema match in linear time too.
 * Ajv passes the `u` flag; `code` tells Ajv's standalone mode how to name it (unused here).
 */
export const ajvLinearRegExp = Object.assign(
  (pattern: string, flags: string) => compileLinearRegex(pattern, flags),
  {
    code: "compileLinearRegex",
  },
);
