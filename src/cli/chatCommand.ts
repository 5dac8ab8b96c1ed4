import readline from "node:readline/promises";
import type { Command } from "commander";
import { CliError, exitCodes, type CliContext } from "./context.ts";

interface ChatOptions {
  model?: string;
  system?: string;
  prompt?: string;
  maxTokens: string;
  temperature: string;
}

/** Streams one answer to stdout and returns its text. */
async function ask(ctx: CliContext, body: Record<string, unknown>): Promise<string> {
  let text = "";
  for await (const event of ctx.client().events("POST", "/conduit/v1/chat", { ...body, stream: true })) {
    if (event.data === "[DONE]") break;
    const chunk = JSON.parse(event.data) as {
      error?: { message: string };
      choices?: { delta?: { content?: string } }[];
    };
    if (chunk.error) throw new CliError(chunk.error.message);
    const piece = chunk.choices?.[0]?.delta?.content ?? "";
    text += piece;
    process.stdout.write(piece);
  }
  process.stdout.write("\n");
  return text;
}

export function chatCommand(program: Command, ctx: CliContext): void {
  program
    .command("chat")
    .description("chat with a model or a READY run, streaming (interactive unless --prompt is given)")
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
        if (ctx.json) {
          const result = await ctx
            .client()
            .request("POST", "/conduit/v1/chat", { ...base, prompt: opts.prompt });
          console.log(JSON.stringify(result, null, 2));
        } else await ask(ctx, { ...base, prompt: opts.prompt });
        return;
      }
      const history: string[] = [];
      const rl = readline.createInterface({ input: process.stdin, output: process.stdout });
      console.error("Type a message; an empty line or Ctrl-D ends the chat.");
      try {
        for (;;) {
          let prompt: string;
          try {
            prompt = await rl.question("> ");
          } catch {
            break;
          }
          if (prompt.trim() === "") break;
          const answer = await ask(ctx, { ...base, prompt, history });
          history.push(prompt, answer);
        }
      } finally {
        rl.close();
      }
    });
}
