import { Command, CommanderError } from "commander";
import { ConfigError } from "../config.ts";
import { startServer } from "../server.ts";
import { chatCommand } from "./chatCommand.ts";
import { ApiError } from "./client.ts";
import { CliContext, CliError, exitCodes } from "./context.ts";
import { datasetsCommand } from "./datasetsCommand.ts";
import { keysCommand } from "./keysCommand.ts";
import { modelsCommand } from "./modelsCommand.ts";
import { runsCommand } from "./runsCommand.ts";

/**
 * The `conduit` command. `serve`, `keys` and the local `models` commands work on the data dir
 * and database directly; every other command talks to a server over HTTP.
 */
const program = new Command()
  .name("conduit")
  .description("Self-hosted LLM inference and fine-tuning service")
  .option("--url <url>", "server URL (CONDUIT_URL; default http://127.0.0.1:8080)")
  .option("--key <key>", "API key (CONDUIT_API_KEY)")
  .option("--json", "print JSON for scripts (one document per line)")
  .showHelpAfterError()
  .exitOverride();

let ctx: CliContext;
try {
  ctx = new CliContext(program);
} catch (error) {
  console.error(`error: ${(error as Error).message}`);
  process.exit(exitCodes.usage);
}

program
  .command("serve")
  .description("run the HTTP service (settings: CONDUIT_* environment variables, see README)")
  .action(async () => {
    await startServer(ctx.config);
  });
keysCommand(program, ctx);
modelsCommand(program, ctx);
datasetsCommand(program, ctx);
runsCommand(program, ctx);
chatCommand(program, ctx);

function exitCodeOf(error: ApiError): number {
  if (error.status === 401) return exitCodes.unauthorized;
  if (error.status === 404) return exitCodes.notFound;
  if (error.status === 409) return exitCodes.conflict;
  if (error.status >= 400 && error.status < 500) return exitCodes.usage;
  return exitCodes.failure;
}

try {
  await program.parseAsync(process.argv);
} catch (error) {
  if (error instanceof CommanderError) process.exit(error.exitCode === 0 ? 0 : exitCodes.usage);
  let code: number = exitCodes.failure;
  let message = error instanceof Error ? error.message : String(error);
  if (error instanceof ApiError) {
    code = exitCodeOf(error);
    message = `${message}${error.param ? ` (field: ${error.param})` : ""}`;
  } else if (error instanceof CliError) code = error.exitCode;
  else if (error instanceof ConfigError) code = exitCodes.usage;
  if (program.opts<{ json?: boolean }>().json) console.error(JSON.stringify({ error: { message, code } }));
  else console.error(`error: ${message}`);
  process.exit(code);
}
