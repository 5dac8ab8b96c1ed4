/**
 * A `multi` grader's formula (OpenAI's `calculate_output`): numbers, its graders' names, `+ - * / ^`, parentheses
 * and the functions `min max abs floor ceil exp sqrt log`, read by hand (no regular expression, no `eval`) in one
 * pass over at most `formulaLimits.maxChars` characters, nested at most `formulaLimits.maxDepth` deep.
 */

export const formulaLimits = {
  /** Characters of a formula. */
  maxChars: 1000,
  /** Parentheses and calls inside one another. */
  maxDepth: 32,
} as const;

const FUNCTIONS: Record<string, (...args: number[]) => number> = {
  min: Math.min,
  max: Math.max,
  abs: Math.abs,
  floor: Math.floor,
  ceil: Math.ceil,
  exp: Math.exp,
  sqrt: Math.sqrt,
  log: Math.log,
};

/** A formula read into a tree: evaluate it with each name's value. */
export type Formula =
  | { kind: "number"; value: number }
  | { kind: "name"; name: string }
  | { kind: "negate"; operand: Formula }
  | { kind: "binary"; operator: "+" | "-" | "*" | "/" | "^"; left: Formula; right: Formula }
  | { kind: "call"; name: string; args: Formula[] };

/** Why a formula cannot be read, and where (0-based character offset). */
export class FormulaError extends Error {
  constructor(
    message: string,
    readonly at: number,
  ) {
    super(message);
  }
}

const isDigit = (c: string) => c >= "0" && c <= "9";
const isNameStart = (c: string) => (c >= "a" && c <= "z") || (c >= "A" && c <= "Z") || c === "_";
const isNameChar = (c: string) => isNameStart(c) || isDigit(c);

/** Whether `name` can stand for a grader in a formula: a letter or `_`, then letters, digits or `_`, at most 64. */
export function isFormulaName(name: string): boolean {
  if (name.length === 0 || name.length > 64 || !isNameStart(name[0]!)) return false;
  for (const c of name) if (!isNameChar(c)) return false;
  return !(name in FUNCTIONS);
}

/** Reads `text`; every name it uses must be one of `names`. */
export function parseFormula(text: string, names: ReadonlySet<string>): Formula {
  if (text.length > formulaLimits.maxChars)
    throw new FormulaError(`is longer than ${formulaLimits.maxChars} characters`, formulaLimits.maxChars);
  let at = 0;
  const skip = () => {
    while (at < text.length && (text[at] === " " || text[at] === "\t" || text[at] === "\n")) at++;
  };
  const peek = () => {
    skip();
    return text[at] ?? "";
  };
  const expect = (c: string) => {
    if (peek() !== c) throw new FormulaError(`expected "${c}" at character ${at + 1}`, at);
    at++;
  };

  const expression = (depth: number): Formula => {
    if (depth > formulaLimits.maxDepth)
      throw new FormulaError(`nests deeper than ${formulaLimits.maxDepth} levels`, at);
    let left = term(depth);
    for (let c = peek(); c === "+" || c === "-"; c = peek()) {
      at++;
      left = { kind: "binary", operator: c, left, right: term(depth) };
    }
    return left;
  };
  const term = (depth: number): Formula => {
    let left = power(depth);
    for (let c = peek(); c === "*" || c === "/"; c = peek()) {
      at++;
      left = { kind: "binary", operator: c, left, right: power(depth) };
    }
    return left;
  };
  // `^` binds tighter than a sign on its left (`-a^2` is `-(a^2)`) and groups to the right.
  const power = (depth: number): Formula => {
    if (peek() === "-") {
      at++;
      return { kind: "negate", operand: power(depth + 1) };
    }
    const base = primary(depth);
    if (peek() !== "^") return base;
    at++;
    return { kind: "binary", operator: "^", left: base, right: power(depth + 1) };
  };
  const primary = (depth: number): Formula => {
    const c = peek();
    const start = at;
    if (c === "(") {
      at++;
      const inner = expression(depth + 1);
      expect(")");
      return inner;
    }
    if (isDigit(c) || c === ".") {
      while (at < text.length && (isDigit(text[at]!) || text[at] === ".")) at++;
      const value = Number(text.slice(start, at));
      if (!Number.isFinite(value))
        throw new FormulaError(`"${text.slice(start, at)}" is not a number`, start);
      return { kind: "number", value };
    }
    if (isNameStart(c)) {
      while (at < text.length && isNameChar(text[at]!)) at++;
      const name = text.slice(start, at);
      if (peek() === "(") {
        if (!(name in FUNCTIONS))
          throw new FormulaError(
            `"${name}" is not a function; the functions are ${Object.keys(FUNCTIONS).join(", ")}`,
            start,
          );
        at++;
        const args = [expression(depth + 1)];
        while (peek() === ",") {
          at++;
          args.push(expression(depth + 1));
        }
        expect(")");
        if (name !== "min" && name !== "max" && args.length !== 1)
          throw new FormulaError(`${name}() takes one argument`, start);
        return { kind: "call", name, args };
      }
      if (!names.has(name))
        throw new FormulaError(`"${name}" is not one of its graders (${[...names].join(", ")})`, start);
      return { kind: "name", name };
    }
    throw new FormulaError(
      c === "" ? "ends where a value is expected" : `"${c}" at character ${at + 1} is not expected`,
      at,
    );
  };

  const formula = expression(0);
  if (peek() !== "") throw new FormulaError(`"${text[at]}" at character ${at + 1} is not expected`, at);
  return formula;
}

/** The formula's value with each name's. */
export function evaluateFormula(formula: Formula, values: Readonly<Record<string, number>>): number {
  switch (formula.kind) {
    case "number":
      return formula.value;
    case "name":
      return Object.hasOwn(values, formula.name) ? (values[formula.name] ?? 0) : 0;
    case "negate":
      return -evaluateFormula(formula.operand, values);
    case "call":
      return FUNCTIONS[formula.name]!(...formula.args.map((arg) => evaluateFormula(arg, values)));
    case "binary": {
      const left = evaluateFormula(formula.left, values);
      const right = evaluateFormula(formula.right, values);
      switch (formula.operator) {
        case "+":
          return left + right;
        case "-":
          return left - right;
        case "*":
          return left * right;
        case "/":
          return left / right;
        case "^":
          return left ** right;
      }
    }
  }
}
