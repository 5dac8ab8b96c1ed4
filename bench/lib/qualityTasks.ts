// The tasks of bench/quality.ts: deterministic IO pairs, a system prompt, and how an answer is scored.
import type { GraderSpec } from "../../src/contract/evals.ts";

export interface Pair {
  input: string;
  output: string;
}

/** How held-out pairs differ from training pairs: new pairs of the same kind, or (classify) new templates. */
export type HoldOut = "random" | "unseen";

export interface QualityTask {
  name: "dates" | "classify";
  /** One line for the report: what the model learns. */
  description: string;
  system: string;
  /** Tokens the greedy answer may use. */
  maxTokens: number;
  /**
   * `count` distinct pairs, the same on every run, split into pairs to train on and a fifth held out.
   * `unseen`: the held-out pairs are built from templates the training pairs never use (classify only).
   */
  split(count: number, holdOut: HoldOut): { train: Pair[]; heldOut: Pair[] };
  /** `count` distinct pairs, the same on every run: the random split holds out the first fifth. */
  pairs(count: number): Pair[];
  /** Whether `answer` (the model's, untrimmed) is right for `pair`. */
  correct(answer: string, pair: Pair): boolean;
  /** The same rule as the product's grader: what `bench/quality.ts` scores held-out answers with. */
  grader: GraderSpec;
  defaultPairs: number;
}

/**
 * A linear congruential generator: the same numbers on every machine and Node version. Its low bits
 * repeat quickly (`% 8` has period 8); the dates task keeps it so that its pairs stay those of earlier
 * results, the classify task uses `mulberry32`.
 */
function lcg(seed: number): (n: number) => number {
  let state = seed;
  return (n: number) => {
    state = (state * 1103515245 + 12345) % 2 ** 31;
    return state % n;
  };
}

/** mulberry32: a small generator whose every bit is usable; an integer in [0, n). */
function mulberry32(seed: number): (n: number) => number {
  let state = seed >>> 0;
  return (n: number) => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return Math.floor((((t ^ (t >>> 14)) >>> 0) / 2 ** 32) * n);
  };
}

const MONTHS = [
  "January",
  "February",
  "March",
  "April",
  "May",
  "June",
  "July",
  "August",
  "September",
  "October",
  "November",
  "December",
];

/** ISO date → "4 July 2023": distinct dates, 1950–2049; memorising a format. */
export const datesTask: QualityTask = {
  name: "dates",
  description: "ISO date → words",
  system: "Write the date in words.",
  maxTokens: 16,
  defaultPairs: 200,
  split(count, holdOut) {
    if (holdOut !== "random") throw new Error("the dates task has no templates to hold out");
    const pairs = this.pairs(count);
    const held = Math.round(count / 5);
    return { train: pairs.slice(held), heldOut: pairs.slice(0, held) };
  },
  pairs: (count) => datePairs(count),
  correct: (answer, pair) => answer.trim() === pair.output,
  grader: { type: "exact_match", normalize: ["whitespace"] },
};

function datePairs(count: number): Pair[] {
  const next = lcg(7);
  const seen = new Set<string>();
  const pairs: Pair[] = [];
  while (pairs.length < count) {
    const year = 1950 + next(100);
    const month = next(12);
    const day = 1 + next(28);
    const input = `${year}-${String(month + 1).padStart(2, "0")}-${String(day).padStart(2, "0")}`;
    if (seen.has(input)) continue;
    seen.add(input);
    pairs.push({ input, output: `${day} ${MONTHS[month]} ${year}` });
  }
  return pairs;
}

export const LABELS = ["billing", "shipping", "refund", "technical", "account"] as const;
type Label = (typeof LABELS)[number];

/**
 * One sentence each, with slots: {product}, {amount}, {order}, {day}, {code}. Words such as "order",
 * "account", "charge" and product names occur under several labels, so no single word gives the label.
 */
const TEMPLATES: Record<Label, string[]> = {
  billing: [
    "I was charged {amount} twice for {product}.",
    "Why does my invoice for {order} say {amount}?",
    "My card was billed {amount} {day} but I did not buy anything.",
    "Can you send me a receipt for {order}?",
    "My statement shows {amount} for {product}, more than the price on your site.",
    "How do I change the card you charge for {order}?",
    "There is a charge of {amount} from you {day} that I don't recognise.",
    "Can I pay for {product} in two instalments?",
  ],
  shipping: [
    "{order} still hasn't arrived and I ordered it {day}.",
    "Where is {product}? I ordered it {day} and the tracking page has not moved.",
    "Can you ship {product} to a different address?",
    "The courier left {product} at the wrong house {day}.",
    "How long does delivery to Canada take for {order}?",
    "The tracking says {order} was delivered {day} but nothing is here.",
    "Can I upgrade {order} to express delivery?",
    "The tracking number for {product} doesn't work.",
  ],
  refund: [
    "I returned {product} {day} and still haven't got my {amount} back.",
    "{product} broke after two days, I want my money back.",
    "How do I return {product} for a full refund?",
    "Please refund {order}, I cancelled it {day}.",
    "I'd like to send back {product}, it's not what I expected.",
    "You promised a refund of {amount} for {order}, where is it?",
    "{product} arrived damaged, can I get my money back instead of a replacement?",
    "Can I return {product} without the original box?",
  ],
  technical: [
    "{product} won't turn on after the update {day}.",
    "The app crashes every time I open {order} in it.",
    "{product} keeps disconnecting from the wifi.",
    "How do I reset {product} to factory settings?",
    "I get error {code} when I pair {product} with my phone.",
    "{product} makes a loud noise and then shuts off.",
    "The firmware update for {product} fails with error {code}.",
    "The screen of {product} started flickering {day}.",
  ],
  account: [
    "I could not log in to my account {day}.",
    "How do I change the email address on my account? I used it for {order}.",
    "Please delete my account and all my data, including {order}.",
    "I never got the password reset email {day}.",
    "My account is locked after too many login attempts {day}.",
    "How do I add a second user to my account to manage {product}?",
    "Can I change the username on my account? I registered {product} with it.",
    "Someone changed the password of my account {day}.",
  ],
};

const SLOTS: Record<string, string[] | ((next: (n: number) => number) => string)> = {
  product: [
    "the blender",
    "my headphones",
    "the standing desk",
    "the coffee grinder",
    "the router",
    "the backpack",
    "my e-reader",
    "the smart watch",
    "the air purifier",
    "the electric kettle",
    "my new laptop",
    "the baby monitor",
    "the robot vacuum",
    "the printer",
    "the camera",
    "the desk lamp",
  ],
  amount: ["$12.99", "$45", "$199", "€30", "£18.50", "$7.49", "$320", "€64.90"],
  day: [
    "yesterday",
    "on Monday",
    "last week",
    "two weeks ago",
    "this morning",
    "on Friday",
    "on the 3rd",
    "last month",
  ],
  order: (next) => `order ${10000 + next(90000)}`,
  code: (next) => `E${100 + next(900)}`,
};

const OPENERS = ["", "Hi, ", "Hello, ", "Hi there! ", "Good morning, ", "Hey team, ", "Dear support, "];
const CLOSERS = [
  "",
  " Thanks.",
  " Thank you!",
  " Please help.",
  " Regards, Maria",
  " Cheers, Tom",
  " This is urgent.",
];

/** Templates of each label that only held-out messages use, with `--hold-out unseen`: the last two of eight. */
const UNSEEN_TEMPLATES = 2;

/**
 * Short customer messages → one of five labels. Each message is an opener, one filled-in template
 * sentence and a closer; no filled-in sentence occurs twice in the whole set, so every held-out
 * message says something the training pairs never did. With `random` the templates and words are
 * shared between training and held-out messages (new combinations); with `unseen` the held-out
 * messages come from two templates per label that no training message uses (new sentence shapes:
 * the model has to have learned what the words mean for the label).
 */
export const classifyTask: QualityTask = {
  name: "classify",
  description: "customer message → billing/shipping/refund/technical/account",
  system:
    "Classify the customer message as billing, shipping, refund, technical or account. Answer with the label only.",
  maxTokens: 6,
  defaultPairs: 300,
  split(count, holdOut) {
    const held = Math.round(count / 5);
    if (holdOut === "random") {
      const pairs = this.pairs(count);
      return { train: pairs.slice(held), heldOut: pairs.slice(0, held) };
    }
    const seen = (label: Label) => TEMPLATES[label].slice(0, -UNSEEN_TEMPLATES);
    const unseen = (label: Label) => TEMPLATES[label].slice(-UNSEEN_TEMPLATES);
    return { train: messagePairs(count - held, 11, seen), heldOut: messagePairs(held, 12, unseen) };
  },
  pairs: (count) => messagePairs(count, 11, (label) => TEMPLATES[label]),
  grader: { type: "exact_match", normalize: ["case", "whitespace", "punctuation"] },
  /** The label, ignoring case, surrounding spaces and punctuation ("Billing." is billing). */
  correct: (answer, pair) =>
    answer
      .trim()
      .toLowerCase()
      .replace(/^[^a-z]+|[^a-z]+$/g, "") === pair.output,
};

/** `count` messages, labels in turn, each from one of `templates(label)`, then shuffled. */
function messagePairs(count: number, seed: number, templates: (label: Label) => readonly string[]): Pair[] {
  const next = mulberry32(seed);
  const pick = <T>(list: readonly T[]): T => list[next(list.length)]!;
  const seenCores = new Set<string>();
  const pairs: Pair[] = [];
  for (let attempts = 0; pairs.length < count; attempts++) {
    if (attempts > count * 100) throw new Error(`only ${pairs.length} distinct messages of ${count}`);
    const label = LABELS[pairs.length % LABELS.length]!;
    const core = pick(templates(label)).replace(/\{(\w+)\}/g, (_, slot: string) => {
      const fill = SLOTS[slot];
      if (fill === undefined) throw new Error(`no slot ${slot}`);
      return typeof fill === "function" ? fill(next) : pick(fill);
    });
    if (seenCores.has(core)) continue;
    seenCores.add(core);
    const opener = pick(OPENERS);
    // "Hi, The router ..." → "Hi, the router ...": the sentence starts lower case after an opener.
    const sentence =
      opener === "" || opener.endsWith("! ") ? core[0]!.toUpperCase() + core.slice(1) : lowerFirst(core);
    pairs.push({ input: `${opener}${sentence}${pick(CLOSERS)}`, output: label });
  }
  // Labels cycle as generated; shuffle (Fisher–Yates, same generator) so any slice is mixed.
  for (let i = pairs.length - 1; i > 0; i--) {
    const j = next(i + 1);
    [pairs[i], pairs[j]] = [pairs[j]!, pairs[i]!];
  }
  return pairs;
}

function lowerFirst(sentence: string): string {
  // Keep "I" and names of the product list as they are; lower "The", "Where", "Can", "My", ...
  return /^I\b/.test(sentence) ? sentence : sentence[0]!.toLowerCase() + sentence.slice(1);
}

export const TASKS = { dates: datesTask, classify: classifyTask } as const;
