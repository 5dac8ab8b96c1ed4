import type { FastifyInstance } from "fastify";
import { Type } from "@sinclair/typebox";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import { CreateRunBody, Message, PageQuery, Run, RunParams, responses } from "../schemas.ts";
import { runWire, SUCCESS } from "../wire.ts";

/** Seed 4.3: fine-tuning runs (plus `POST /conduit/finetuning`, which the seed does not show). */
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
        response: responses({ 200: Run }),
      },
    },
    async (request) => runWire(await runs.create(request.userId, request.body)),
  );

  r.get(
    "/conduit/finetuning",
    {
      schema: {
        tags,
        summary: "List your runs, newest first",
        querystring: PageQuery,
        response: responses({ 200: Type.Array(Run) }),
      },
    },
    async (request) => (await runs.list(request.userId, request.query)).map(runWire),
  );

  r.get(
    "/conduit/finetuning/:finetune_id",
    { schema: { tags, summary: "Read a run", params: RunParams, response: responses({ 200: Run }) } },
    async (request) => runWire(await runs.get(request.userId, request.params.finetune_id)),
  );

  r.post(
    "/conduit/finetuning/:finetune_id/cancel",
    {
      schema: {
        tags,
        summary: "Cancel a queued or running run",
        description: "A run that already ended (READY, FAILED, CANCELLED) answers 409.",
        params: RunParams,
        response: responses({ 200: Message }, [401, 404, 409]),
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
}
