import fs from "node:fs";
import type { FastifyInstance } from "fastify";
import { Type } from "@sinclair/typebox";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import type { CreateRun } from "../../train/commands.ts";
import { ConduitError } from "../../errors.ts";
import { respondWithGeneration } from "../generation/respond.ts";
import { RunInferenceBody } from "../../contract/generation.ts";
import type { RunFollowEvent } from "../../train/FollowCursor.ts";
import {
  CreateRunBody,
  type CreateRunBodyWire,
  ExamplesQuery,
  jsonOrEvents,
  Message,
  PageQuery,
  Run,
  RunCheckpointList,
  RunCheckpointParams,
  RunExample,
  RunParams,
  RunSummary,
  responses,
  sseEvent,
} from "../../contract/schemas.ts";
import { REASON } from "../../contract/patterns.ts";
import { checkLoraTargets, RUN_EVENT_ID_PATTERN } from "../../contract/runs.ts";
import { disconnectSignal, encodeShared, encodeSseEvent, openSse } from "../sse.ts";
import { toRunSummaryWire, toRunWire, SUCCESS } from "./wire.ts";
import { checkpointModelName } from "../../domain/modelNames.ts";
import { chatMessages, conduitChatShape, conduitSampling } from "./generationWire.ts";
import { chatEvents, responseFormat } from "../generation/common.ts";

/**
 * The body of `POST /conduit/finetuning` as the run service's command: `datasetId` is an alias of
 * `datasetID` (the two may not disagree); every other field has the command's name, so the service's
 * errors name the body's fields as they are.
 */
function createRunCommand(body: CreateRunBodyWire): CreateRun {
  const { datasetId, ...rest } = body;
  if (body.datasetID !== undefined && datasetId !== undefined && body.datasetID !== datasetId)
    throw new ConduitError(
      "invalid_request",
      `"datasetID" (${body.datasetID}) and "datasetId" (${datasetId}) name different datasets; send one of them`,
      { param: "datasetId" },
    );
  return { ...rest, datasetID: body.datasetID ?? datasetId };
}

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
    // A new run has no evaluation yet.
    async (request) => toRunWire(await runs.create(request.userId, createRunCommand(request.body)), null),
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
    async (request) => {
      const list = await runs.list(request.userId, request.query);
      const evaluations = await core.evals.evaluationsOf(
        request.userId,
        list.map((run) => run.id),
      );
      return list.map((run) => toRunSummaryWire(run, evaluations.get(run.id) ?? null));
    },
  );

  r.get(
    "/conduit/finetuning/:finetune_id",
    { schema: { tags, summary: "Read a run", params: RunParams, response: responses({ 200: Run }) } },
    async (request) => {
      const run = await runs.get(request.userId, request.params.finetune_id);
      return toRunWire(run, await core.evals.evaluationOf(request.userId, run.id));
    },
  );

  runFileRoutes(app, core);

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

  r.post(
    "/conduit/finetuning/:finetune_id/pause",
    {
      schema: {
        tags,
        summary: "Pause a queued or running run",
        description:
          "The run is PAUSED: a running run's trainer stops at a step boundary and frees its worker for the next run; " +
          "its checkpoint is kept. Any other status answers 409.",
        params: RunParams,
        response: responses({ 200: Run }, [400, 401, 404, 409]),
      },
    },
    async (request) => {
      const run = await runs.pause(request.userId, request.params.finetune_id);
      return toRunWire(run, await core.evals.evaluationOf(request.userId, run.id));
    },
  );

  r.post(
    "/conduit/finetuning/:finetune_id/resume",
    {
      schema: {
        tags,
        summary: "Resume a paused run",
        description:
          "The run is QUEUED again and goes on from its checkpoint, with the optimizer's state where its trainer keeps " +
          "it (docs/fine-tuning.md). A run whose trainer is still stopping, or that is not PAUSED, answers 409.",
        params: RunParams,
        response: responses({ 200: Run }, [400, 401, 404, 409]),
      },
    },
    async (request) => {
      const run = await runs.resume(request.userId, request.params.finetune_id);
      return toRunWire(run, await core.evals.evaluationOf(request.userId, run.id));
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

  runInferenceRoute(app, core);
  runEventsRoute(app, core);
}

/** What a READY run produced: its file and its examples with their losses. */
function runFileRoutes(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { runs } = core;
  const tags = ["fine-tuning"];
  r.get(
    "/conduit/finetuning/:finetune_id/artifact",
    {
      schema: {
        tags,
        summary: "Download what a READY run produced",
        description:
          "Streams the run's GGUF file: for `method` `lora` its adapter (`<run id>-lora.gguf`, use it with the base " +
          "model: `llama-server -m base.gguf --lora adapter.gguf`), for `full` the whole model (`<run id>.gguf`). " +
          "With `format=merged`, a LoRA run's adapter merged into its base (`<run id>-merged.gguf`: float weights in " +
          "their types, quantized adapted weights in F16; loads without `--lora`), built on the first request and " +
          "kept with the run; a full run's model as it is. A run that is not READY answers 409; a READY run whose " +
          "file is not on this server's disk, 404; a base whose adapted weights are of a type ggml cannot decode, 400.",
        params: RunParams,
        querystring: Type.Object({
          format: Type.Optional(
            Type.Union([Type.Literal("adapter"), Type.Literal("merged")], {
              description: "`adapter` (the run's own file) or `merged` (one GGUF). Defaults to `adapter`.",
            }),
          ),
        }),
        response: {
          200: {
            description: "The GGUF file, as an attachment.",
            headers: {
              "content-disposition": {
                type: "string",
                description:
                  '`attachment; filename="<run id>-lora.gguf"` (LoRA), `"<run id>-merged.gguf"` (LoRA, merged) or `"<run id>.gguf"` (full).',
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
      const artifact = await runs.artifact(request.userId, request.params.finetune_id, request.query.format);
      return reply
        .header("content-type", "application/octet-stream")
        .header("content-length", String(artifact.sizeBytes))
        .header("content-disposition", `attachment; filename="${artifact.fileName}"`)
        .send(fs.createReadStream(artifact.path));
    },
  );

  r.get(
    "/conduit/finetuning/:finetune_id/checkpoints",
    {
      schema: {
        tags,
        summary: "A READY run's kept checkpoints, newest first",
        description:
          "A LoRA run on the llama.cpp trainer keeps its adapter at its last 3 epochs' ends; each is served under its " +
          "`model` name and downloadable. Empty for a run that is not READY or kept none.",
        params: RunParams,
        response: responses({ 200: RunCheckpointList }),
      },
    },
    async (request) => {
      const { run, checkpoints } = await runs.checkpoints(request.userId, request.params.finetune_id);
      return checkpoints.map((c) => ({
        step: c.step,
        epoch: c.epoch,
        trainLoss: c.trainLoss,
        evalLoss: c.evalLoss ?? null,
        model: checkpointModelName(run, c.step),
        createdAt: c.createdAt,
      }));
    },
  );

  r.get(
    "/conduit/finetuning/:finetune_id/checkpoints/:step/artifact",
    {
      schema: {
        tags,
        summary: "Download a kept checkpoint's LoRA adapter",
        description:
          "Streams the checkpoint's adapter (`<run id>-step-<step>-lora.gguf`). A run that is not READY answers 409, " +
          "a step it did not keep 404.",
        params: RunCheckpointParams,
        response: {
          200: {
            description: "The GGUF file, as an attachment.",
            content: {
              "application/octet-stream": { schema: Type.Unsafe({ type: "string", format: "binary" }) },
            },
          },
          ...responses({}, [400, 401, 404, 409]),
        },
      },
    },
    async (request, reply) => {
      const { finetune_id, step } = request.params;
      const artifact = await runs.checkpointArtifact(request.userId, finetune_id, step);
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
}

/** Generation with a READY run's model. */
function runInferenceRoute(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { runs } = core;
  const tags = ["fine-tuning"];
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
}

/** A run followed live, as Server-Sent Events. */
function runEventsRoute(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { runs } = core;
  const tags = ["fine-tuning"];
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
          "started over) means they replace what the client has.\n\n" +
          "Every event has an `id:`. To resume after a lost connection, send the last id received as the " +
          "`Last-Event-ID` header (EventSource does this by itself) or the `lastEventId` query parameter: the " +
          "stream then sends exactly what came after that event (no line twice, no loss point twice). Ids are " +
          "opaque: send them back as received. A `: keep-alive` comment comes after 15 s without events.\n\n" +
          "A user may hold `CONDUIT_MAX_STREAMS_PER_USER` (32) of these streams open at once; one more is a 429 " +
          "with `Retry-After`, until one of them closes.",
        params: RunParams,
        querystring: Type.Object({
          lastEventId: Type.Optional(
            Type.String({
              maxLength: 200,
              pattern: RUN_EVENT_ID_PATTERN,
              [REASON]: "is not an event id of this stream; send the id of the last event received",
              description: "The id of the last event received, for clients that cannot send `Last-Event-ID`.",
            }),
          ),
        }),
        headers: Type.Object({
          "last-event-id": Type.Optional(
            Type.String({
              maxLength: 200,
              pattern: RUN_EVENT_ID_PATTERN,
              [REASON]: "is not an event id of this stream; send the id of the last event received",
              description:
                "The id of the last event received: the stream goes on after it. Wins over `lastEventId`.",
            }),
          ),
        }),
        response: {
          ...responses({}, [400, 401, 404, 429]),
          200: {
            description: "Server-Sent Events (`event: log|stats|status`, `id: <opaque>`, `data: {json}`).",
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
      app.eventStreams.hold(request.userId, reply);
      const controller = disconnectSignal(reply);
      // EventSource sends the header when it reconnects by itself, so it is newer than the query's.
      const after = request.headers["last-event-id"] ?? request.query.lastEventId;
      const events = await runs.follow(request.userId, request.params.finetune_id, {
        after,
        signal: controller.signal,
      });
      const sse = openSse(request, reply, controller, { heartbeat: true });
      try {
        for await (const event of events) if (!sse.sendEncoded(encoded(event))) await sse.drained();
        sse.close();
      } catch (error) {
        sse.fail(error);
      }
      return reply;
    },
  );
}

/** Each event as written on the wire, made once however many follow the run (one feed per run). */
function encoded(event: RunFollowEvent): Buffer {
  return encodeShared(event, () => encodeSseEvent(eventData(event), event.type, event.id));
}

/** An event's `data`, as the stream has always sent it. */
function eventData(event: RunFollowEvent): unknown {
  if (event.type === "log") return { line: event.line };
  if (event.type === "stats") return event.stats;
  return { status: event.status, error: event.error };
}
