import type { FastifyInstance } from "fastify";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import { dropNulls } from "../nullable.ts";
import { checkpointPage, createOpenAiJob, eventPage, toOpenAiJob } from "./fineTuningWire.ts";
import {
  OpenAiCheckpointList,
  OpenAiCheckpointQuery,
  OpenAiJob,
  OpenAiJobCreateBody,
  OpenAiJobEventList,
  OpenAiJobList,
  OpenAiJobListQuery,
  metadataFilterKey,
  OpenAiJobParams,
  MAX_EVENT_PAGE,
  OpenAiPageQuery,
} from "../../contract/openAiFineTuning.ts";
import { responses } from "../../contract/schemas.ts";

/**
 * OpenAI's fine-tuning jobs on Conduit's runs (see `fineTuningWire.ts`): a job is a run, its id the
 * run id, its status OpenAI's name for the run's, its events the run's log.
 */
export default async function openAiFineTuningRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { runs } = core;
  const tags = ["openai fine-tuning"];

  r.post(
    "/v1/fine_tuning/jobs",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible fine-tuning job: a run on the training file",
        description:
          "Starts a run (LoRA, Conduit's defaults) on the training file's dataset, which holds only that file (and maybe " +
          'the validation file). `n_epochs` and `learning_rate_multiplier` (× the learning rate `"auto"` picks) are ' +
          'honoured; `batch_size` takes only `"auto"`; `method` only `supervised`. Once `succeeded`, the model is ' +
          "`ft:{model}:{suffix}:{job id}` on `/v1/chat/completions` and `/v1/completions`.",
        body: OpenAiJobCreateBody,
        response: responses({ 200: OpenAiJob }, [400, 401, 404, 413, 415, 507]),
      },
      preValidation: dropNulls(OpenAiJobCreateBody),
    },
    async (request) => toOpenAiJob(await createOpenAiJob(core, request.userId, request.body)),
  );

  r.get(
    "/v1/fine_tuning/jobs",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible job list: your runs, newest first",
        querystring: OpenAiJobListQuery,
        response: responses({ 200: OpenAiJobList }, [400, 401]),
      },
    },
    async (request) => {
      const { after, limit } = request.query;
      const filter = Object.entries(request.query as Record<string, unknown>).flatMap(([key, value]) => {
        const name = metadataFilterKey.exec(key)?.[1];
        return name === undefined ? [] : [[name, String(value)] as const];
      });
      const jobs = await core.runs.listAfter(request.userId, { after, limit: limit + 1 }, filter);
      return {
        object: "list" as const,
        data: jobs.slice(0, limit).map(toOpenAiJob),
        has_more: jobs.length > limit,
      };
    },
  );

  r.get(
    "/v1/fine_tuning/jobs/:fine_tuning_job_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible job",
        params: OpenAiJobParams,
        response: responses({ 200: OpenAiJob }),
      },
    },
    async (request) => toOpenAiJob(await runs.get(request.userId, request.params.fine_tuning_job_id)),
  );

  r.post(
    "/v1/fine_tuning/jobs/:fine_tuning_job_id/cancel",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible job cancel",
        description: "A job that already ended answers 409.",
        params: OpenAiJobParams,
        response: responses({ 200: OpenAiJob }, [400, 401, 404, 409]),
      },
    },
    async (request) => {
      await runs.cancel(request.userId, request.params.fine_tuning_job_id);
      return toOpenAiJob(await runs.get(request.userId, request.params.fine_tuning_job_id));
    },
  );

  r.post(
    "/v1/fine_tuning/jobs/:fine_tuning_job_id/pause",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible job pause",
        description:
          "A queued job is `paused` at once; a running one is `pausing` until its trainer stops at a step boundary " +
          "(its checkpoint kept), then `paused`. Any other job answers 409.",
        params: OpenAiJobParams,
        response: responses({ 200: OpenAiJob }, [400, 401, 404, 409]),
      },
    },
    async (request) => toOpenAiJob(await runs.pause(request.userId, request.params.fine_tuning_job_id)),
  );

  r.post(
    "/v1/fine_tuning/jobs/:fine_tuning_job_id/resume",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible job resume",
        description:
          "A `paused` job is `queued` again and goes on from its checkpoint. A job still `pausing`, or not paused, " +
          "answers 409.",
        params: OpenAiJobParams,
        response: responses({ 200: OpenAiJob }, [400, 401, 404, 409]),
      },
    },
    async (request) => toOpenAiJob(await runs.resume(request.userId, request.params.fine_tuning_job_id)),
  );

  r.get(
    "/v1/fine_tuning/jobs/:fine_tuning_job_id/checkpoints",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible job checkpoints, newest first",
        description:
          "A succeeded LoRA job on the llama.cpp trainer keeps its adapter at its last 3 epochs' ends; each " +
          "`fine_tuned_model_checkpoint` works as a model. Empty for any other job. Paged with `after` (a checkpoint id) " +
          "and `limit` (a limit over 100 is taken as 100).",
        params: OpenAiJobParams,
        querystring: OpenAiCheckpointQuery,
        response: responses({ 200: OpenAiCheckpointList }),
      },
    },
    async (request) => {
      const { run, checkpoints } = await runs.checkpoints(request.userId, request.params.fine_tuning_job_id);
      return checkpointPage(run, checkpoints, request.query.after, Math.min(request.query.limit, 100));
    },
  );

  r.get(
    "/v1/fine_tuning/jobs/:fine_tuning_job_id/events",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible job events, newest first",
        description:
          "One event per line of the run's log, and a last one once the job has ended, whose `data.status` says how. " +
          "Paged with `after` (an event id) and `limit`.",
        params: OpenAiJobParams,
        querystring: OpenAiPageQuery,
        response: responses({ 200: OpenAiJobEventList }),
      },
    },
    async (request) => {
      const run = await runs.get(request.userId, request.params.fine_tuning_job_id);
      return eventPage(run, request.query.after, Math.min(request.query.limit, MAX_EVENT_PAGE));
    },
  );
}
