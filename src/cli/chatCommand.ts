import readline from "node:readline/promises";
import type { Command } from "commander";
import { ApiError } from "../client/ApiError.ts";
import type { ChatRequest } from "../contract/client.ts";
import { CliError, exitCodes, type CliContext } from "./context.ts";

interface ChatOptions {
  model?: string;
  system?: string;
  prompt?: string;
  maxTokens: string;
  temperature: string;
}

/**
 * Prints one answer and returns its text: streamed as it is generated, or with `--json` the whole
 * `chat.completion` document on one line.
 */
async function ask(ctx: CliContext, body: ChatRequest): Promise<string> {
  if (ctx.json) {
    const result = await ctx.client().chat(body);
    console.log(JSON.stringify(result));
    return result.choices[0]?.text ?? "";
  }
  let text = "";
  for await (const piece of ctx.client().chatStream(body)) {
    text += piece;
    process.stdout.write(piece);
  }
  process.stdout.write("\n");
  return text;
}

/** The server's answer to a conversation longer than the model's context (a 400 naming the token counts). */
function outgrewContext(error: unknown): boolean {
  return (
    error instanceof ApiError &&
    error.status === 400 &&
    (error.param === "history" || error.param === "messages" || error.param === "prompt") &&
    /context holds/.test(error.message)
  );
}

/**
 * Asks with as much of `history` as fits the model's context: while the server says the conversation is too
 * long, the oldest turn (a question and its answer) is dropped, saying so in a line on stderr. The system
 * prompt is always kept. Returns the answer; `history` is left holding the turns that were sent.
 */
async function askWithin(
  ctx: CliContext,
  body: Omit<ChatRequest, "prompt">,
  prompt: string,
  history: string[],
): Promise<string> {
  for (;;) {
    try {
      return await ask(ctx, { ...body, prompt, history });
    } catch (error) {
      if (!outgrewContext(error) || history.length === 0) throw error;
      history.splice(0, 2);
      const kept = history.length / 2;
      console.error(
        `(The conversation outgrew the model's context: dropped the oldest turn, ${kept} earlier turn${kept === 1 ? "" : "s"} kept.)`,
      );
    }
  }
}

export function chatCommand(program: Command, ctx: CliContext): void {
  program
    .command("chat")
    .description(
      "chat with a model or a READY run, streaming (interactive unless --prompt is given; --json: one answer per line)",
    )
    .option("-m, --model <id>", "model id or run id (default: the server's default model)")
    .option("-s, --system <text>", "system prompt")
    .option("-p, --prompt <text>", "ask once and exit")
    .option("--max-tokens <n>", "most tokens per answer", "256")
    .option("--temperature <t>", "0 is greedy", "1")
    .action(async (opts: ChatOptions) => {
      const sampling = { max_tokens: Number(opts.maxTokens), temperature: Number(opts.temperature) };
      if (!Number.isInteger(sampling.max_tokens) || !Number.isFinite(sampling.temperature))
        throw new CliError("--max-tokens must be an integer and --temperature a number", exitCodes.usage);
      const base = {
        ...(opts.model ? { model: opts.model } : {}),
        ...(opts.system ? { system_prompt: opts.system } : {}),
        ...sampling,
      };
      if (opts.prompt !== undefined) {
        await ask(ctx, { ...base, prompt: opts.prompt });
        return;
      }
      const history: string[] = [];
      // With --json, stdout carries only the answers (one JSON document per line): prompts go to stderr.
      const rl = readline.createInterface({
        input: process.stdin,
        output: ctx.json ? process.stderr : process.stdout,
      });
      console.error("Type a message; an empty line or Ctrl-D ends the chat.");
      // Piped input closes the interface once it is read, while its lines are still being answered; a prompt
      // then throws on Node 24 ("readline was closed"; Node 20 ignored it).
      let closed = false;
      rl.once("close", () => (closed = true));
      try {
        // Iterating the lines (not `question()`) queues what arrives while an answer streams, so
        // piped input is read in full.
        rl.setPrompt("> ");
        rl.prompt();
        for await (const prompt of rl) {
          if (prompt.trim() === "") break;
          const answer = await askWithin(ctx, base, prompt, history);
          history.push(prompt, answer);
          if (!closed) rl.prompt();
        }
      } finally {
        rl.close();
      }
    });
}
