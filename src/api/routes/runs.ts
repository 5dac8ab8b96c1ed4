import fs from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
import type { FastifyInstance } from "fastify";
import { Type } from "@sinclair/typebox";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import { checkLoraTargets } from "../../train/RunService.ts";
import { respondWithGeneration } from "../generate.ts";
import { RunInferenceBody } from "../../contract/generation.ts";
import type { RunStats } from "../../contract/runs.ts";
import {
  CreateRunBody,
  ExamplesQuery,
  jsonOrEvents,
  Message,
  PageQuery,
  Run,
  RunExample,
  RunParams,
  RunSummary,
  responses,
  sseEvent,
} from "../../contract/schemas.ts";
import { openSse } from "../sse.ts";
import { runSummaryWire, runWire, SUCCESS } from "../wire.ts";
import { chatEvents, chatMessages, responseFormat, conduitChatShape, conduitSampling } from "./generation.ts";

/** API document 4.3: fine-tuning runs (plus `POST /conduit/finetuning`, which the API document does not show). */
export default async function runRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { runs } = core;
  const tags = ["fine-tuning"];

  r.post(
    "/conduit/finetuning",
    {
      schema: {
        tags,
        summary: "Start a fine-tuning run",
        description:
          "Validates the configuration and queues the run. `config` on the result shows every effective value.",
        body: CreateRunBody,
        response: responses({ 200: Run }, [400, 401, 404, 409, 413, 415, 507]),
      },
      // Before the schema, so that a target like `attn_k` is refused with its reason.
      preValidation: async (request) =>
        checkLoraTargets((request.body as { loraTargets?: unknown } | null)?.loraTargets),
    },
    async (request) => runWire(await runs.create(request.userId, request.body)),
  );

  r.get(
    "/conduit/finetuning",
    {
      schema: {
        tags,
        summary: "List your runs, newest first",
        description:
          "Each run as a summary: no `logs`, and `stats` without `lossSeries` and `evalLossSeries`; " +
          "`GET /conduit/finetuning/{finetune_id}` has the whole run.",
        querystring: PageQuery,
        response: responses({ 200: Type.Array(RunSummary) }, [400, 401]),
      },
    },
    async (request) => (await runs.list(request.userId, request.query)).map(runSummaryWire),
  );

  r.get(
    "/conduit/finetuning/:finetune_id",
    { schema: { tags, summary: "Read a run", params: RunParams, response: responses({ 200: Run }) } },
    async (request) => runWire(await runs.get(request.userId, request.params.finetune_id)),
  );

  r.get(
    "/conduit/finetuning/:finetune_id/artifact",
    {
      schema: {
        tags,
        summary: "Download what a READY run produced",
        description:
          "Streams the run's GGUF file: for `method` `lora` its adapter (`<run id>-lora.gguf`, use it with the base " +
          "model: `llama-server -m base.gguf --lora adapter.gguf`), for `full` the whole model (`<run id>.gguf`). " +
          "A run that is not READY answers 409; a READY run whose file is not on this server's disk, 404.",
        params: RunParams,
        response: {
          200: {
            description: "The GGUF file, as an attachment.",
            headers: {
              "content-disposition": {
                type: "string",
                description:
                  '`attachment; filename="<run id>-lora.gguf"` (LoRA) or `"<run id>.gguf"` (full).',
              },
              "content-length": { type: "integer", description: "The file's size in bytes." },
            },
            content: {
              "application/octet-stream": { schema: Type.Unsafe({ type: "string", format: "binary" }) },
            },
          },
          ...responses({}, [400, 401, 404, 409]),
        },
      },
    },
    async (request, reply) => {
      const artifact = await runs.artifact(request.userId, request.params.finetune_id);
      return reply
        .header("content-type", "application/octet-stream")
        .header("content-length", String(artifact.sizeBytes))
        .header("content-disposition", `attachment; filename="${artifact.fileName}"`)
        .send(fs.createReadStream(artifact.path));
    },
  );

  r.get(
    "/conduit/finetuning/:finetune_id/examples",
    {
      schema: {
        tags,
        summary: "A READY run's examples, each with its loss",
        description:
          "Every training and validation pair of a READY run with its loss after training (mean nats per " +
          "trained token), to find what the model did not learn: by default the worst first. A JSON array like " +
          "the other lists, paged with `limit` and `offset`; the `x-total-count` header counts the examples of the " +
          "asked split in all. A run that is not READY, or has no per-example losses, answers 409.",
        params: RunParams,
        querystring: ExamplesQuery,
        response: {
          200: {
            ...Type.Array(RunExample),
            headers: {
              "x-total-count": {
                type: "integer",
                description: "Examples of the asked split (or both) in all, whatever the page.",
              },
            },
          },
          ...responses({}, [400, 401, 404, 409]),
        },
      },
    },
    async (request, reply) => {
      const page = await runs.examples(request.userId, request.params.finetune_id, request.query);
      void reply.header("x-total-count", String(page.total));
      return page.examples;
    },
  );

  r.post(
    "/conduit/finetuning/:finetune_id/cancel",
    {
      schema: {
        tags,
        summary: "Cancel a queued or running run",
        description: "A run that already ended (READY, FAILED, CANCELLED) answers 409.",
        params: RunParams,
        response: responses({ 200: Message }, [400, 401, 404, 409]),
      },
    },
    async (request) => {
      await runs.cancel(request.userId, request.params.finetune_id);
      return SUCCESS;
    },
  );

  r.delete(
    "/conduit/finetuning/:finetune_id",
    {
      schema: {
        tags,
        summary: "Delete a run and its model",
        description: "A queued or running run is cancelled first.",
        params: RunParams,
        response: responses({ 200: Message }),
      },
    },
    async (request) => {
      await runs.delete(request.userId, request.params.finetune_id);
      return SUCCESS;
    },
  );

  r.post(
    "/conduit/finetuning/:finetune_id/inference",
    {
      schema: {
        tags,
        summary: "Generate with a READY run's fine-tuned model",
        description:
          "Takes the chat fields (`prompt`, `system_prompt`, `history`, sampling parameters; the system prompt defaults to " +
          "the run's `systemPrompt`). The Conduit API's run fields (`datasetID`, `lr`, ...) are accepted and ignored. " +
          "A run that is not READY answers 409.",
        params: RunParams,
        body: RunInferenceBody,
        response: responses(
          { 200: jsonOrEvents(Type.Object({ response: Type.String() }), chatEvents) },
          [400, 401, 404, 409, 413, 415, 429, 503],
        ),
      },
    },
    async (request, reply) => {
      const run = await runs.get(request.userId, request.params.finetune_id);
      // The one resolver: a LoRA run is its base model plus its adapter, not a model file of its own.
      const model = core.inference.refOfRun(run);
      const body = request.body;
      const systemPrompt = body.system_prompt ?? String(run.config.systemPrompt ?? "");
      const messages = chatMessages({
        prompt: body.prompt,
        system_prompt: systemPrompt,
        history: body.history,
      });
      const input = {
        messages,
        sampling: conduitSampling(body),
        responseFormat: responseFormat(body.response_format),
      };
      if (body.stream)
        return respondWithGeneration(core, request, reply, input, {
          stream: true,
          shape: conduitChatShape,
          model,
        });
      const result = await core.inference.generate(request.userId, input, model);
      return { response: result.choices[0]?.text ?? "" };
    },
  );

  r.get(
    "/conduit/finetuning/:finetune_id/events",
    {
      schema: {
        tags,
        summary: "Follow a run live (Server-Sent Events)",
        description:
          "Events: `log` (`{line}`) for each log line (earlier lines first), `stats` (the run's `stats`) when they change, " +
          "`status` (`{status, error}`) when the status changes. The stream ends after the run reaches READY, FAILED or CANCELLED. " +
          "A `stats` event's `lossSeries` and `evalLossSeries` hold only the points after those of the stream's previous " +
          "`stats` event (the first event: all so far), so a client appends them; `seriesReset: true` (a run that " +
          "started over) means they replace what the client has.",
        params: RunParams,
        response: {
          ...responses({}),
          200: {
            description: "Server-Sent Events (`event: log|stats|status`, `data: {json}`).",
            content: {
              "text/event-stream": {
                schema: sseEvent("`log`, `stats` or `status`, with its JSON in `data`."),
              },
            },
          },
        },
      },
    },
    async (request, reply) => {
      const first = await runs.get(request.userId, request.params.finetune_id);
      const sse = openSse(request, reply);
      let seq = -1;
      let lastStats = "";
      const series = new SeriesDelta();
      let lastStatus = "";
      // Polls the database, so it follows a run trained by any worker sharing it.
      while (!sse.signal.aborted) {
        const run = await core.runRepository.get(request.userId, first.id);
        if (!run) {
          sse.send({ status: "DELETED", error: null }, "status");
          break;
        }
        for (const log of await core.runRepository.logsSince(run.id, seq)) {
          seq = log.seq;
          sse.send({ line: log.line }, "log");
        }
        const stats = JSON.stringify(run.stats);
        if (stats !== lastStats) {
          lastStats = stats;
          sse.send(series.next(run.stats), "stats");
        }
        if (run.status !== lastStatus) {
          lastStatus = run.status;
          sse.send({ status: run.status, error: run.error }, "status");
        }
        if (run.status === "READY" || run.status === "FAILED" || run.status === "CANCELLED") break;
        // Wakes early when the client leaves or the server shuts down.
        await sleep(eventsPollMs, undefined, { signal: sse.signal }).catch(() => undefined);
      }
      sse.close();
      return reply;
    },
  );
}

/** The loss series of successive `stats` events, cut to the points a client has not had yet. */
class SeriesDelta {
  private lastTrain = Number.NEGATIVE_INFINITY;
  private lastEval = Number.NEGATIVE_INFINITY;

  next(stats: RunStats): RunStats {
    const train = stats.lossSeries ?? [];
    const evals = stats.evalLossSeries ?? [];
    const lastTrain = train.at(-1)?.step ?? Number.NEGATIVE_INFINITY;
    const lastEval = evals.at(-1)?.step ?? Number.NEGATIVE_INFINITY;
    // A run that started over (a worker lost it, another trains it from the start) has fewer steps.
    const reset = lastTrain < this.lastTrain || lastEval < this.lastEval;
    const out: RunStats = { ...stats, ...(reset ? { seriesReset: true } : {}) };
    if (stats.lossSeries) out.lossSeries = reset ? train : train.filter((p) => p.step > this.lastTrain);
    if (stats.evalLossSeries)
      out.evalLossSeries = reset ? evals : evals.filter((p) => p.step > this.lastEval);
    this.lastTrain = lastTrain;
    this.lastEval = lastEval;
    return out;
  }
}

/** How often the events stream looks for news. */
const eventsPollMs = 500;
