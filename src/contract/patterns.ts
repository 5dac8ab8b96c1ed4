/** The text patterns and the reason keyword every schema of the contract shares. */

/**
 * Names and ids are stored and listed, so they carry no control characters: PostgreSQL refuses
 * NUL in text, and the others only hide in listings and logs.
 */
export const noControlCharacters = "^[^\\u0000-\\u001f\\u007f]*$";
/** Free text (a system prompt) may span lines, but not hold NUL, which is never meaningful text. */
export const noNul = "^[^\\u0000]*$";
/** Why a value failed one of the patterns above, for the 400's message. */
export const patternReasons: Record<string, string> = {
  [noControlCharacters]: "must not contain control characters",
  [noNul]: "must not contain NUL characters",
};
/**
 * A schema keyword: when a value fails anywhere inside a schema that has it, the 400 gives this
 * reason (and names the field that has it) instead of the validator's own words, e.g.
 * `is not supported yet; only false is accepted`.
 */
export const REASON = "x-reason";
