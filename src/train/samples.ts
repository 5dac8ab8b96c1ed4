/**
 * A run's training and validation examples: each IO pair as a conversation in the base model's chat
 * template (exactly what inference will format), split into the prompt and the answer so that only
 * the answer is trained on by default. A chat example (`messages`) is one conversation whose every
 * assistant turn is an answer.
 */
import type { ChatTurn, IoPair } from "../datasets/ioPairs.ts";
import { loadChatTemplate } from "../model/chatTemplate.ts";
import type { ChatMessage, ModelRef } from "../model/types.ts";
import type { SampleSegment, TrainingSample } from "./core/trainerJob.ts";

export interface PreparedExample {
  input: string;
  /** The answer trained on; a preference example's preferred answer. */
  output: string;
  sample: TrainingSample;
  /** A preference example's non-preferred answer, with `preference` (absent otherwise). */
  rejectedOutput?: string;
  /** The conversation ending with the non-preferred answer, formatted as `sample` is. */
  rejected?: TrainingSample;
}

export interface SampleOptions {
  userId: string;
  datasetId: string;
  systemPrompt: string;
  trainOnInputs: boolean;
  /** A file whose pairs are the validation set (left out of training when it is in the dataset). */
  validationFileId: string | null;
  /** Without a validation file: the fraction held out, when the dataset has at least `minPairsForEval` pairs. */
  evalFraction: number;
  minPairsForEval: number;
  seed: number;
  /**
   * Preference tuning: every pair must be a preference example, and its non-preferred answer is formatted too
   * (`rejected`). Otherwise a preference example trains its preferred answer. Defaults to `false`.
   */
  preference?: boolean;
}

/** The system prompt (if any), the user's input, and, for training, the answer. */
export function conversation(systemPrompt: string, input: string, output?: string): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (systemPrompt) messages.push({ role: "system", content: systemPrompt });
  messages.push({ role: "user", content: input });
  if (output !== undefined) messages.push({ role: "assistant", content: output });
  return messages;
}

/**
 * One pair formatted for training (`split: false`: its answer could not be told apart from the prompt
 * in the template's text, so it is trained on in full). `exampleFiles.ts` streams a run's pairs
 * through it to the files the trainer reads.
 */
export async function prepareExample(
  base: ModelRef,
  options: Pick<SampleOptions, "systemPrompt" | "trainOnInputs" | "preference">,
  pair: Pick<IoPair, "input" | "output" | "messages" | "rejected" | "line">,
): Promise<{ example: PreparedExample; split: boolean }> {
  const format = (output: string) =>
    pair.messages
      ? formatChatExample(
          base,
          options.systemPrompt,
          [...pair.messages.slice(0, -1), { role: "assistant", content: output }],
          options.trainOnInputs,
        )
      : formatExample(base, options.systemPrompt, pair.input, output, options.trainOnInputs);
  if (!options.preference) {
    const { sample, split } = pair.messages
      ? await formatChatExample(base, options.systemPrompt, pair.messages, options.trainOnInputs)
      : await formatExample(base, options.systemPrompt, pair.input, pair.output, options.trainOnInputs);
    return { example: { input: pair.input, output: pair.output, sample }, split };
  }
  if (pair.rejected === undefined)
    throw new Error(
      `line ${pair.line} of its file is not a preference example (it has no non-preferred answer); ` +
        "preference tuning trains on preference examples only",
    );
  // A preference example's messages end with its preferred answer (`ioPairs.ts`).
  const chosen = await format(pair.output);
  const rejected = await format(pair.rejected);
  return {
    example: {
      input: pair.input,
      output: pair.output,
      sample: chosen.sample,
      rejectedOutput: pair.rejected,
      rejected: rejected.sample,
    },
    split: chosen.split && rejected.split,
  };
}

/**
 * One pair as prompt + answer segments. The prompt is the conversation up to the generation prompt,
 * the answer the rest of the full conversation (the answer text and the turn's end marker). When
 * the template renders the full conversation so that it does not start with the prompt, the answer
 * is found by its text; failing that, the whole text is trained on (`split: false`).
 */
export async function formatExample(
  base: ModelRef,
  systemPrompt: string,
  input: string,
  output: string,
  trainOnInputs: boolean,
): Promise<{ sample: TrainingSample; split: boolean }> {
  const turns: ChatTurn[] = [
    { role: "user", content: input },
    { role: "assistant", content: output },
  ];
  return formatChatExample(base, systemPrompt, turns, trainOnInputs);
}

/**
 * A conversation as segments, every assistant turn of weight 1 trained (and the rest too with
 * `trainOnInputs`). The whole conversation is rendered once, as inference renders it. Turn k's answer
 * runs from the end of the prompt inference would send for it (the turns before it and the generation
 * prompt) to the end of the conversation rendered through turn k (its text and its end marker). When
 * the whole does not start with those (a template that rewrites earlier turns), the turn's text is
 * looked up in the whole instead (the last turn's with the rest of the text); failing that, the whole
 * text is trained on (`split: false`). `systemPrompt` opens the conversation unless it has a system
 * turn of its own.
 */
export async function formatChatExample(
  base: ModelRef,
  systemPrompt: string,
  turns: readonly ChatTurn[],
  trainOnInputs: boolean,
): Promise<{ sample: TrainingSample; split: boolean }> {
  const template = await loadChatTemplate(base);
  const messages: ChatMessage[] = turns.map(({ role, content }) => ({ role, content }));
  if (systemPrompt && messages[0]?.role !== "system")
    messages.unshift({ role: "system", content: systemPrompt });
  const offset = messages.length - turns.length;
  const rendered = template.renderSegments(messages, { addGenerationPrompt: false });
  const full = rendered.segments.map((segment) => segment.text).join("");
  // The template's text and the pair's contents, so that the trainer keeps control-token text in a pair as text.
  const pieces = rendered.exact
    ? rendered.segments.map((segment) => ({ text: segment.text, special: segment.trusted }))
    : undefined;
  const whole = { sample: [{ text: full, train: true, ...(pieces ? { pieces } : {}) }], split: false };
  // [start, end) of each answer in `full`, in order.
  const answers: number[] = [];
  let cursor = 0;
  for (const [k, turn] of turns.entries()) {
    if (turn.role !== "assistant" || turn.weight === 0) continue;
    const at = k + offset;
    const last = at === messages.length - 1;
    const prompt = template.render(messages.slice(0, at), { addGenerationPrompt: true });
    const through = last ? full : template.render(messages.slice(0, at + 1), { addGenerationPrompt: false });
    let start = prompt.length;
    let end = through.length;
    if (!(
      start > 0 &&
      start >= cursor &&
      end > start &&
      full.startsWith(prompt) &&
      full.startsWith(through)
    )) {
      if (turn.content.length === 0) return whole;
      start = last ? full.lastIndexOf(turn.content) : full.indexOf(turn.content, cursor);
      if (start <= 0 || start < cursor) return whole;
      end = last ? full.length : start + turn.content.length;
    }
    answers.push(start, end);
    cursor = end;
  }
  if (answers.length === 0) return whole;
  const parts = pieces ? cutPieces(pieces, answers) : undefined;
  const sample: SampleSegment[] = [];
  let from = 0;
  for (const [i, to] of [...answers, full.length].entries()) {
    const part = parts?.[i];
    // Odd stretches are answers: [start, end).
    if (to > from)
      sample.push({
        text: full.slice(from, to),
        train: i % 2 === 1 || trainOnInputs,
        ...(part ? { pieces: part } : {}),
      });
    from = to;
  }
  return { sample, split: true };
}

type Piece = { text: string; special: boolean };

/** Cuts pieces (whose texts join to one text) at ascending offsets of that text: `cuts.length + 1` stretches. */
function cutPieces(pieces: readonly Piece[], cuts: readonly number[]): Piece[][] {
  const stretches: Piece[][] = [[]];
  let at = 0;
  let next = 0;
  for (const piece of pieces) {
    let from = 0;
    for (; next < cuts.length && (cuts[next] as number) < at + piece.text.length; next++) {
      const cut = Math.max(from, (cuts[next] as number) - at);
      if (cut > from) stretches.at(-1)?.push({ text: piece.text.slice(from, cut), special: piece.special });
      from = cut;
      stretches.push([]);
    }
    if (from < piece.text.length)
      stretches.at(-1)?.push({ text: piece.text.slice(from), special: piece.special });
    at += piece.text.length;
  }
  while (stretches.length < cuts.length + 1) stretches.push([]);
  return stretches;
}
