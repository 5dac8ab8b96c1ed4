/**
 * GBNF for JSON numbers inside a range (`minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum`). The
 * grammar generates exactly the decimals in the range that are written without an exponent and without
 * leading zeros (`12`, `-0.5`, `3.25`; never `1e2`, `007` or `-0`): every text it allows is inside the range,
 * and every integer in the range is allowed (every decimal too, for `number`). Pure: no model, no llama.cpp.
 */

/** A bound as the schema gives it. */
export interface Bound {
  value: number;
  exclusive: boolean;
}

/** The written digits of a non-negative finite number: integer part (no leading zeros) and fraction (no trailing zeros). */
interface Decimal {
  int: string;
  frac: string;
}

/** Grammar rules being written: name → body. */
class Rules {
  readonly bodies = new Map<string, string>();
  private next = 0;
  constructor(private readonly prefix: string) {}

  add(body: string): string {
    for (const [name, existing] of this.bodies) if (existing === body) return name;
    const name = `${this.prefix}-${this.next++}`;
    this.bodies.set(name, body);
    return name;
  }
}

/**
 * The GBNF of the numbers (`integer: false`) or integers between `min` and `max` (either may be absent), as an
 * expression and the rules it refers to (named from `prefix`, a GBNF rule name). `undefined` when no number is in
 * the range.
 */
export function numberRangeGbnf(
  prefix: string,
  integer: boolean,
  min: Bound | undefined,
  max: Bound | undefined,
): { expression: string; rules: Map<string, string> } | undefined {
  const rules = new Rules(prefix);
  const alternatives: string[] = [];
  if (integer) {
    // Integer bounds, inclusive.
    const lo = min === undefined ? undefined : integerAbove(min);
    const hi = max === undefined ? undefined : integerBelow(max);
    if (lo !== undefined && hi !== undefined && lo > hi) return undefined;
    if (hi === undefined || hi >= 0n) {
      const part = integersBetween(lo === undefined || lo < 0n ? 0n : lo, hi);
      if (part) alternatives.push(part);
    }
    if (lo === undefined || lo < 0n) {
      const part = integersBetween(
        hi === undefined || hi >= 0n ? 1n : -hi,
        lo === undefined ? undefined : -lo,
      );
      if (part) alternatives.push(`"-" ${part}`);
    }
  } else {
    if (min !== undefined && max !== undefined) {
      if (min.value > max.value) return undefined;
      if (min.value === max.value && (min.exclusive || max.exclusive)) return undefined;
    }
    // Zero and above, then below zero as "-" and a magnitude above zero.
    if (max === undefined || max.value > 0 || (max.value === 0 && !max.exclusive)) {
      const lo = min === undefined || min.value < 0 ? { value: 0, exclusive: false } : min;
      const part = magnitudes(rules, lo, max);
      if (part) alternatives.push(part);
    }
    if (min === undefined || min.value < 0) {
      const lo =
        max === undefined || max.value >= 0
          ? { value: 0, exclusive: true }
          : { value: -max.value, exclusive: max.exclusive };
      const hi = min === undefined ? undefined : { value: -min.value, exclusive: min.exclusive };
      const part = magnitudes(rules, lo, hi);
      if (part) alternatives.push(`"-" ( ${part} )`);
    }
  }
  if (alternatives.length === 0) return undefined;
  return { expression: `( ${alternatives.join(" | ")} )`, rules: rules.bodies };
}

/** The least integer the bound lets through from below. */
function integerAbove(bound: Bound): bigint {
  const floor = BigInt(Math.floor(bound.value));
  return Number.isInteger(bound.value) && !bound.exclusive ? floor : floor + 1n;
}

/** The greatest integer the bound lets through from above. */
function integerBelow(bound: Bound): bigint {
  const ceil = BigInt(Math.ceil(bound.value));
  return Number.isInteger(bound.value) && !bound.exclusive ? ceil : ceil - 1n;
}

/** Integers from `lo` (≥ 0) to `hi` (no bound when absent) written in decimal; `undefined` when none. */
function integersBetween(lo: bigint, hi: bigint | undefined): string | undefined {
  if (hi !== undefined && lo > hi) return undefined;
  const low = lo.toString();
  const alternatives: string[] = [];
  const top = hi === undefined ? low.length : hi.toString().length;
  for (let length = low.length; length <= top; length++) {
    const from = length === low.length ? low : length === 1 ? "0" : "1" + "0".repeat(length - 1);
    const to = hi !== undefined && length === top ? hi.toString() : "9".repeat(length);
    alternatives.push(sameLength(from, to));
  }
  // Past the upper bound's length, any longer number: at least one more digit.
  if (hi === undefined) alternatives.push(`[1-9] [0-9]{${low.length},}`);
  return alternatives.length === 1 ? alternatives[0] : `( ${alternatives.join(" | ")} )`;
}

/** Digit strings of `from`'s length from `from` to `to` (same length, `from` ≤ `to`). */
function sameLength(from: string, to: string): string {
  if (from.length === 0) return '""';
  const [a, b] = [from[0]!, to[0]!];
  const restFrom = from.slice(1);
  const restTo = to.slice(1);
  const any = (n: number) => (n === 0 ? "" : n === 1 ? " [0-9]" : ` [0-9]{${n}}`);
  if (a === b) return restFrom.length === 0 ? `"${a}"` : `"${a}" ${sameLength(restFrom, restTo)}`;
  const n = restFrom.length;
  if (/^0*$/.test(restFrom) && /^9*$/.test(restTo)) return `${digitClass(a, b)}${any(n)}`;
  const parts: string[] = [];
  let first = a;
  if (!/^0*$/.test(restFrom)) {
    parts.push(`"${a}" ${sameLength(restFrom, "9".repeat(n))}`);
    first = String(Number(a) + 1);
  }
  let last = b;
  const lastFull = /^9*$/.test(restTo);
  if (!lastFull) last = String(Number(b) - 1);
  if (first <= last) parts.push(`${digitClass(first, last)}${any(n)}`);
  if (!lastFull) parts.push(`"${b}" ${sameLength("0".repeat(n), restTo)}`);
  return parts.length === 1 ? parts[0]! : `( ${parts.join(" | ")} )`;
}

function digitClass(from: string, to: string): string {
  return from === to ? `"${from}"` : `[${from}-${to}]`;
}

/**
 * Most digits a bound may have, before and after its decimal point together: the grammar grows with the
 * square of a bound's digits (1e300 would be some 90,000 characters of GBNF).
 */
export const MAX_BOUND_DIGITS = 40;

/** How many digits the grammar writes for a bound (`1e-7` is 0.0000001: 8). */
export function boundDigits(value: number): number {
  const { int, frac } = decimalOf(value);
  return int.length + frac.length;
}

/** The digits of a non-negative finite number as JavaScript writes it shortest (`1e21` and `1e-7` expanded). */
function decimalOf(value: number): Decimal {
  const [mantissa, exponentText] = Math.abs(value).toString().split("e");
  const exponent = Number(exponentText ?? 0);
  const [int, frac = ""] = mantissa!.split(".");
  const digits = int! + frac;
  // Position of the decimal point in `digits`.
  const point = int!.length + exponent;
  const padded = point < 0 ? "0".repeat(-point) + digits : digits.padEnd(point, "0");
  const at = Math.max(point, 0);
  const intPart = padded.slice(0, at).replace(/^0+(?=.)/, "") || "0";
  return { int: intPart, frac: padded.slice(at).replace(/0+$/, "") };
}

/**
 * Non-negative decimals from `lo` to `hi` (absent: no bound), written `int` or `int.frac`: the integer part
 * fixes the fraction's bounds only at `lo`'s and `hi`'s own integer parts.
 */
function magnitudes(rules: Rules, lo: Bound, hi: Bound | undefined): string | undefined {
  const low = decimalOf(lo.value);
  const high = hi === undefined ? undefined : decimalOf(hi.value);
  const alternatives: string[] = [];
  const withFraction = (int: string, fraction: Fraction) => {
    const dotted = fraction.nonEmpty === undefined ? undefined : `"." ${fraction.nonEmpty}`;
    if (fraction.empty && dotted) alternatives.push(`${int} ( ${dotted} )?`);
    else if (fraction.empty) alternatives.push(int);
    else if (dotted) alternatives.push(`${int} ${dotted}`);
  };
  const lowInt = BigInt(low.int);
  if (high !== undefined && high.int === low.int) {
    withFraction(`"${low.int}"`, fractions(rules, low.frac, lo.exclusive, high.frac, hi!.exclusive));
  } else {
    withFraction(`"${low.int}"`, fractions(rules, low.frac, lo.exclusive, undefined, false));
    const between = integersBetween(lowInt + 1n, high === undefined ? undefined : BigInt(high.int) - 1n);
    if (between) withFraction(between, fractions(rules, undefined, false, undefined, false));
    if (high !== undefined)
      withFraction(`"${high.int}"`, fractions(rules, undefined, false, high.frac, hi!.exclusive));
  }
  return alternatives.length === 0 ? undefined : alternatives.join(" | ");
}

/** The digit strings after a decimal point that keep a value within bounds: the empty one, the others as a rule. */
interface Fraction {
  empty: boolean;
  /** Rule of the non-empty digit strings; absent when there are none. */
  nonEmpty: string | undefined;
}

/**
 * Digit strings `d` with `0.lo ≤ 0.d ≤ 0.hi` (`<` where exclusive; an absent bound: none), read as a
 * digit-by-digit automaton: after each digit, each bound either still holds the next digit back (its rest
 * remains) or no longer matters.
 */
function fractions(
  rules: Rules,
  lo: string | undefined,
  loExclusive: boolean,
  hi: string | undefined,
  hiExclusive: boolean,
): Fraction {
  const states = new Map<string, Fraction | "visiting">();
  const visit = (lo: string | undefined, hi: string | undefined): Fraction => {
    const key = `${lo ?? "*"}|${hi ?? "*"}`;
    const known = states.get(key);
    if (known === "visiting") return { empty: false, nonEmpty: undefined };
    if (known) return known;
    if (lo === undefined && hi === undefined) {
      const free = { empty: true, nonEmpty: rules.add("[0-9]+") };
      states.set(key, free);
      return free;
    }
    // A bound that has run out of digits is 0: the rest compares with zero, which needs no automaton.
    if (lo === "" && (hi === undefined || hi === "")) {
      const above: Fraction =
        loExclusive && hi === undefined
          ? { empty: false, nonEmpty: rules.add("[0]* [1-9] [0-9]*") }
          : hi === undefined
            ? { empty: true, nonEmpty: rules.add("[0-9]+") }
            : {
                empty: !loExclusive && !hiExclusive,
                nonEmpty: loExclusive || hiExclusive ? undefined : rules.add("[0]+"),
              };
      states.set(key, above);
      return above;
    }
    if (lo === undefined && hi === "") {
      const zeros: Fraction = hiExclusive
        ? { empty: false, nonEmpty: undefined }
        : { empty: true, nonEmpty: rules.add("[0]+") };
      states.set(key, zeros);
      return zeros;
    }
    states.set(key, "visiting");
    // The empty rest is 0: within bounds unless the low bound is above 0 or equal and exclusive, and so for high.
    const empty =
      (lo === undefined || (lo === "" && !loExclusive)) && (hi === undefined || hi !== "" || !hiExclusive);
    // Digits grouped by where they lead, in order.
    const groups: { from: number; to: number; next: Fraction }[] = [];
    for (let d = 0; d <= 9; d++) {
      const loDigit = lo === undefined ? undefined : Number(lo[0] ?? "0");
      const hiDigit = hi === undefined ? undefined : Number(hi[0] ?? "0");
      if (loDigit !== undefined && d < loDigit) continue;
      if (hiDigit !== undefined && d > hiDigit) continue;
      const nextLo = loDigit === undefined || d > loDigit ? undefined : lo!.slice(1);
      const nextHi = hiDigit === undefined || d < hiDigit ? undefined : hi!.slice(1);
      const next = visit(nextLo, nextHi);
      if (!next.empty && next.nonEmpty === undefined) continue;
      const last = groups.at(-1);
      if (last && last.to === d - 1 && sameFraction(last.next, next)) last.to = d;
      else groups.push({ from: d, to: d, next });
    }
    const alternatives = groups.map(({ from, to, next }) => {
      const digits = digitClass(String(from), String(to));
      if (next.nonEmpty === undefined) return digits;
      return `${digits} ${next.nonEmpty}${next.empty ? "?" : ""}`;
    });
    const result = {
      empty,
      nonEmpty: alternatives.length === 0 ? undefined : rules.add(alternatives.join(" | ")),
    };
    states.set(key, result);
    return result;
  };
  return visit(lo, hi);
}

function sameFraction(a: Fraction, b: Fraction): boolean {
  return a.empty === b.empty && a.nonEmpty === b.nonEmpty;
}
