import type { FastifyInstance } from "fastify";
import { Type } from "@sinclair/typebox";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import {
  CreateEvalBody,
  CreateEvalRunBody,
  Eval,
  EvalResult,
  EvalRun,
  type CreateEvalBodyWire,
} from "../../contract/evals.ts";
import { Message, PageQuery, responses, sseEvent } from "../../contract/schemas.ts";
import {
  evalResultWire,
  evalRunWire,
  evalWire,
  fromCreateEvalBody,
  fromCreateEvalRunBody,
} from "./evalWire.ts";
import { disconnectSignal, encodeShared, encodeSseEvent, openSse } from "../sse.ts";
import { SUCCESS } from "./wire.ts";

const Id = Type.String({ minLength: 1, maxLength: 128 });
const EvalParams = Type.Object({ eval_id: Id });
const EvalRunParams = Type.Object({ eval_id: Id, run_id: Id });

/** Evaluations under the Conduit API: evals, their runs (queued, followed, cancelled) and per-item results. */
export default async function evalRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { evals } = core;
  const tags = ["evals"];

  r.post(
    "/conduit/evals",
    {
      schema: {
        tags,
        summary: "Create an eval: graders and where its items come from",
        description:
          "`source` is a dataset file of yours (`{type: file, fileId}`: IO pairs or chat examples, the last assistant " +
          "turn is the answer expected), a READY run of yours (`{type: run, runId}`: its validation file or the pairs it " +
          "held out), or items given here (`{type: items, items: [{input | messages, expected}]}`). Without a source " +
          "each run names its items.",
        body: CreateEvalBody,
        response: responses({ 200: Eval }, [400, 401, 404, 409, 413, 415]),
      },
    },
    async (request) =>
      evalWire(await evals.create(request.userId, fromCreateEvalBody(request.body as CreateEvalBodyWire))),
  );

  r.get(
    "/conduit/evals",
    {
      schema: {
        tags,
        summary: "List your evals, newest first",
        querystring: PageQuery,
        response: responses({ 200: Type.Array(Eval) }, [400, 401]),
      },
    },
    async (request) => (await evals.list(request.userId, request.query)).map(evalWire),
  );

  r.get(
    "/conduit/evals/:eval_id",
    { schema: { tags, summary: "Read an eval", params: EvalParams, response: responses({ 200: Eval }) } },
    async (request) => evalWire(await evals.get(request.userId, request.params.eval_id)),
  );

  r.delete(
    "/conduit/evals/:eval_id",
    {
      schema: {
        tags,
        summary: "Delete an eval with its runs and results",
        description: "Its runs in progress are cancelled first.",
        params: EvalParams,
        response: responses({ 200: Message }),
      },
    },
    async (request) => {
      await evals.delete(request.userId, request.params.eval_id);
      return SUCCESS;
    },
  );

  evalRunRoutes(app, core);
  evalResultRoutes(app, core);
}

/** An eval's runs: queued, listed, read, cancelled, deleted. */
function evalRunRoutes(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { evals } = core;
  const tags = ["evals"];

  r.post(
    "/conduit/evals/:eval_id/runs",
    {
      schema: {
        tags,
        summary: "Score models on every item of an eval (queued)",
        description:
          "Each model (a base model name, a run id or an `ft:` name of yours; anything else is a 404) answers every " +
          "item greedily through the engine, `parallel` answers in flight at once; each answer is scored by every " +
          "grader. Follow it with `GET .../events`; read the answers with `GET .../results`.",
        params: EvalParams,
        body: CreateEvalRunBody,
        response: responses({ 200: EvalRun }, [400, 401, 404, 409, 413, 415]),
      },
    },
    async (request) =>
      evalRunWire(
        await evals.createRun(request.userId, request.params.eval_id, fromCreateEvalRunBody(request.body)),
      ),
  );

  r.get(
    "/conduit/evals/:eval_id/runs",
    {
      schema: {
        tags,
        summary: "List an eval's runs, newest first",
        params: EvalParams,
        querystring: Type.Object({
          limit: Type.Integer({ minimum: 1, maximum: 1000, default: 100, description: "Defaults to `100`." }),
        }),
        response: responses({ 200: Type.Array(EvalRun) }),
      },
    },
    async (request) =>
      (await evals.listRuns(request.userId, request.params.eval_id, { limit: request.query.limit })).map(
        evalRunWire,
      ),
  );

  r.get(
    "/conduit/evals/:eval_id/runs/:run_id",
    {
      schema: {
        tags,
        summary: "Read an eval run: its status, progress and each model's totals",
        params: EvalRunParams,
        response: responses({ 200: EvalRun }),
      },
    },
    async (request) =>
      evalRunWire(await evals.getRun(request.userId, request.params.eval_id, request.params.run_id)),
  );

  r.post(
    "/conduit/evals/:eval_id/runs/:run_id/cancel",
    {
      schema: {
        tags,
        summary: "Cancel a queued or running eval run",
        description: "The answers scored so far stay. A run that has ended answers 409.",
        params: EvalRunParams,
        response: responses({ 200: EvalRun }, [400, 401, 404, 409]),
      },
    },
    async (request) =>
      evalRunWire(await evals.cancel(request.userId, request.params.eval_id, request.params.run_id)),
  );

  r.delete(
    "/conduit/evals/:eval_id/runs/:run_id",
    {
      schema: {
        tags,
        summary: "Delete an eval run and its results",
        params: EvalRunParams,
        response: responses({ 200: Message }),
      },
    },
    async (request) => {
      await evals.deleteRun(request.userId, request.params.eval_id, request.params.run_id);
      return SUCCESS;
    },
  );
}

/** An eval run's per-item results, and its live events. */
function evalResultRoutes(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { evals } = core;
  const tags = ["evals"];

  r.get(
    "/conduit/evals/:eval_id/runs/:run_id/results",
    {
      schema: {
        tags,
        summary: "Per-item results: each model's answer, scores, latency and tokens",
        description:
          "By model (in the run's order), then item. `model` keeps one model's. The `x-total-count` header counts " +
          "the results there are so far (the answers scored; of `model` when given).",
        params: EvalRunParams,
        querystring: Type.Object({
          model: Type.Optional(Type.String({ minLength: 1, maxLength: 256 })),
          limit: Type.Integer({
            minimum: 1,
            maximum: 10_000,
            default: 1000,
            description: "Defaults to `1000`.",
          }),
          offset: Type.Integer({ minimum: 0, default: 0, description: "Defaults to `0`." }),
        }),
        response: responses({ 200: Type.Array(EvalResult) }),
      },
    },
    async (request, reply) => {
      const { run, results, total } = await evals.results(
        request.userId,
        request.params.eval_id,
        request.params.run_id,
        request.query,
      );
      void reply.header("x-total-count", String(total));
      return results.map((result) => evalResultWire(run, result));
    },
  );

  r.get(
    "/conduit/evals/:eval_id/runs/:run_id/events",
    {
      schema: {
        tags,
        summary: "Follow an eval run live (Server-Sent Events)",
        description:
          "Events: `progress` (`{progress: {completed, total, model}, results}`) as answers are scored, `status` " +
          "(`{status, error}`) when the status changes. The stream ends once the run is COMPLETED, FAILED or CANCELLED.",
        params: EvalRunParams,
        response: {
          ...responses({}, [400, 401, 404, 429]),
          200: {
            description: "Server-Sent Events (`event: progress|status`, `data: {json}`).",
            content: {
              "text/event-stream": { schema: sseEvent("`progress` or `status`, with its JSON in `data`.") },
            },
          },
        },
      },
    },
    async (request, reply) => {
      app.eventStreams.hold(request.userId, reply);
      const controller = disconnectSignal(reply);
      const events = await evals.follow(
        request.userId,
        request.params.eval_id,
        request.params.run_id,
        controller.signal,
      );
      const sse = openSse(request, reply, controller, { heartbeat: true });
      try {
        // The followers of a run share its events: each is encoded once.
        for await (const event of events) {
          const bytes = encodeShared(event, () => {
            const { type, ...data } = event;
            return encodeSseEvent(data, type);
          });
          if (!sse.sendEncoded(bytes)) await sse.drained();
        }
        sse.close();
      } catch (error) {
        sse.fail(error);
      }
      return reply;
    },
  );
}
