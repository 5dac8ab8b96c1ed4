/**
 * A run's training and validation examples: each IO pair as a conversation in the base model's chat
 * template (exactly what inference will format), split into the prompt and the answer so that only
 * the answer is trained on by default.
 */
import type { DatasetService } from "../datasets/DatasetService.ts";
import { loadChatTemplate } from "../model/chatTemplate.ts";
import type { ChatMessage, ModelRef } from "../model/types.ts";
import type { TrainingSample } from "./protocol.ts";
import { seededRandom, shuffledOrder } from "./random.ts";

export interface PreparedExample {
  input: string;
  output: string;
  sample: TrainingSample;
}

export interface PreparedExamples {
  train: PreparedExample[];
  validation: PreparedExample[];
  /** Where the validation examples came from, for the run's log. */
  validationSource: "file" | "held out" | "none";
  /** Examples whose answer could not be told apart from the prompt in the template's text (trained in full). */
  unsplit: number;
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
}

/** The system prompt (if any), the user's input, and, for training, the answer. */
export function conversation(systemPrompt: string, input: string, output?: string): ChatMessage[] {
  const messages: ChatMessage[] = [];
  if (systemPrompt) messages.push({ role: "system", content: systemPrompt });
  messages.push({ role: "user", content: input });
  if (output !== undefined) messages.push({ role: "assistant", content: output });
  return messages;
}

/** Reads and formats a run's examples; the training examples keep their upload order. */
export async function prepareExamples(
  datasets: DatasetService,
  base: ModelRef,
  options: SampleOptions,
): Promise<PreparedExamples> {
  let unsplit = 0;
  const prepare = async (input: string, output: string): Promise<PreparedExample> => {
    const { sample, split } = await formatExample(
      base,
      options.systemPrompt,
      input,
      output,
      options.trainOnInputs,
    );
    if (!split) unsplit += 1;
    return { input, output, sample };
  };
  const train: PreparedExample[] = [];
  for await (const pair of datasets.pairs(
    options.userId,
    options.datasetId,
    options.validationFileId ?? undefined,
  ))
    train.push(await prepare(pair.input, pair.output));
  if (options.validationFileId !== null) {
    const validation: PreparedExample[] = [];
    for await (const pair of datasets.filePairs(options.userId, options.validationFileId))
      validation.push(await prepare(pair.input, pair.output));
    return { train, validation, validationSource: "file", unsplit };
  }
  if (train.length < options.minPairsForEval || options.evalFraction <= 0)
    return { train, validation: [], validationSource: "none", unsplit };
  // The same seed holds out the same pairs on every attempt.
  const held = new Set(
    shuffledOrder(train.length, seededRandom(options.seed)).slice(
      0,
      Math.max(1, Math.floor(train.length * options.evalFraction)),
    ),
  );
  return {
    train: train.filter((_, i) => !held.has(i)),
    validation: train.filter((_, i) => held.has(i)),
    validationSource: "held out",
    unsplit,
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
  const template = await loadChatTemplate(base);
  const rendered = template.renderSegments(conversation(systemPrompt, input, output), {
    addGenerationPrompt: false,
  });
  const full = rendered.segments.map((segment) => segment.text).join("");
  const prompt = template.render(conversation(systemPrompt, input), { addGenerationPrompt: true });
  // The template's text and the pair's contents, so that the trainer keeps control-token text in a pair as text.
  const pieces = rendered.exact
    ? rendered.segments.map((segment) => ({ text: segment.text, special: segment.trusted }))
    : undefined;
  let cut = full.startsWith(prompt) ? prompt.length : -1;
  if (cut < 0 && output.length > 0) cut = full.lastIndexOf(output);
  if (cut <= 0) return { sample: [{ text: full, train: true, ...(pieces ? { pieces } : {}) }], split: false };
  const [before, after] = pieces ? splitPieces(pieces, cut) : [undefined, undefined];
  return {
    sample: [
      { text: full.slice(0, cut), train: trainOnInputs, ...(before ? { pieces: before } : {}) },
      { text: full.slice(cut), train: true, ...(after ? { pieces: after } : {}) },
    ],
    split: true,
  };
}

type Piece = { text: string; special: boolean };

/** Splits pieces (whose texts join to one text) at a character offset of that text. */
function splitPieces(pieces: readonly Piece[], cut: number): [Piece[], Piece[]] {
  const before: Piece[] = [];
  const after: Piece[] = [];
  let at = 0;
  for (const piece of pieces) {
    const end = at + piece.text.length;
    if (end <= cut) before.push(piece);
    else if (at >= cut) after.push(piece);
    else {
      before.push({ text: piece.text.slice(0, cut - at), special: piece.special });
      after.push({ text: piece.text.slice(cut - at), special: piece.special });
    }
    at = end;
  }
  return [before, after];
}
