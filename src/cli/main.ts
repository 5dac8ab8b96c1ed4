import { Command, CommanderError } from "commander";
import { ConfigError } from "../config.ts";
import { ConduitError } from "../errors.ts";
import { chatCommand } from "./chatCommand.ts";
import { ApiError } from "../client/ApiError.ts";
import { CliContext, CliError, exitCodes } from "./context.ts";
import { datasetsCommand } from "./datasetsCommand.ts";
import { evalsCommand } from "./evalsCommand.ts";
import { keysCommand } from "./keysCommand.ts";
import { modelsCommand } from "./modelsCommand.ts";
import { runsCommand } from "./runsCommand.ts";

/**
 * The `conduit` command. `serve`, `keys` and the local `models` commands work on the data dir
 * and database directly; every other command talks to a server over HTTP.
 */
// A reader that stopped reading (`conduit runs show … | head -1`) is not an error: stop quietly.
for (const stream of [process.stdout, process.stderr])
  stream.on("error", (error: NodeJS.ErrnoException) => {
    if (error.code === "EPIPE") process.exit(process.exitCode ?? 0);
    throw error;
  });

const program = new Command()
  .name("conduit")
  .description("Self-hosted LLM inference and fine-tuning service")
  .option(
    "--url <url>",
    "server URL (CONDUIT_URL; default http://$CONDUIT_HOST:$CONDUIT_PORT, i.e. 127.0.0.1:8080)",
  )
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
  .description("run the HTTP service (settings: CONDUIT_* environment variables, see docs/settings.md)")
  .action(async () => {
    // Loaded here, not above: a client command starts in a tenth of the time without the server's modules.
    const { startServer } = await import("../server.ts");
    await startServer(ctx.config);
  });
keysCommand(program, ctx);
modelsCommand(program, ctx);
datasetsCommand(program, ctx);
runsCommand(program, ctx);
evalsCommand(program, ctx);
chatCommand(program, ctx);

function exitCodeOf(status: number): number {
  if (status === 401) return exitCodes.unauthorized;
  if (status === 404) return exitCodes.notFound;
  if (status === 409) return exitCodes.conflict;
  if (status >= 400 && status < 500) return exitCodes.usage;
  return exitCodes.failure;
}

/** The string code `--json` errors carry: the API's code, or the CLI's own for what never reached it. */
const cliCodes: Record<number, string> = {
  [exitCodes.failure]: "failed",
  [exitCodes.usage]: "invalid_request",
  [exitCodes.notFound]: "not_found",
  [exitCodes.unauthorized]: "unauthorized",
  [exitCodes.conflict]: "conflict",
};

try {
  await program.parseAsync(process.argv);
} catch (error) {
  if (error instanceof CommanderError) process.exit(error.exitCode === 0 ? 0 : exitCodes.usage);
  let exitCode: number = exitCodes.failure;
  let message = error instanceof Error ? error.message : String(error);
  let code: string | undefined;
  let param: string | null = null;
  if (error instanceof ApiError || error instanceof ConduitError) {
    // An answer of the server, or the same errors met locally (`models pull`).
    exitCode = exitCodeOf(error.status);
    code = error.code;
    param = error.param;
    message = `${message}${error.param ? ` (field: ${error.param})` : ""}`;
  } else if (error instanceof CliError) {
    exitCode = error.exitCode;
    code = error.code;
  } else if (error instanceof ConfigError) {
    exitCode = exitCodes.usage;
    code = "invalid_config";
  }
  code ??= cliCodes[exitCode] ?? "failed";
  if (program.opts<{ json?: boolean }>().json)
    console.error(JSON.stringify({ error: { message, code, param, exitCode } }));
  else console.error(`error: ${message}`);
  process.exit(exitCode);
}
