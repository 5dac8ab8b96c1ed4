import type { FastifyInstance } from "fastify";
import { Type } from "@sinclair/typebox";
import type { TypeBoxTypeProvider } from "@fastify/type-provider-typebox";
import type { Core } from "../../core.ts";
import { publicUrl } from "../../config.ts";
import { ConduitError } from "../../errors.ts";
import {
  listOf,
  OpenAiEval,
  OpenAiEvalCreateBody,
  OpenAiEvalListQuery,
  OpenAiEvalParams,
  OpenAiEvalRun,
  OpenAiEvalRunCreateBody,
  OpenAiEvalRunParams,
  OpenAiEvalUpdateBody,
  OpenAiOutputItem,
  OpenAiOutputItemParams,
} from "../../contract/openAiEvals.ts";
import { REASON } from "../../contract/patterns.ts";
import { responses } from "../../contract/schemas.ts";
import type { Eval, ResolvedItem } from "../../domain/evals.ts";
import { questionOf } from "../../domain/evals.ts";
import {
  checkDataSourceConfig,
  gradersOfCriteria,
  openAiGraderError,
  openAiEval,
  openAiEvalRun,
  openAiOutputItem,
  OUTPUT_ITEM_ID,
  outputItemId,
  outputItemPosition,
  resolveOpenAiItems,
  runRequest,
} from "./evalsWire.ts";

/** A page of OpenAI's cursor lists: `limit` items after the cursor, and whether there are more. */
function page<T extends { id: string }>(rows: T[], limit: number) {
  const data = rows.slice(0, limit);
  return {
    object: "list" as const,
    data,
    first_id: data[0]?.id ?? null,
    last_id: data.at(-1)?.id ?? null,
    has_more: rows.length > limit,
  };
}

/** An eval run's page in the dashboard (`report_url`). */
function reportUrl(core: Core, evalId: string, runId: string): string {
  return `${publicUrl(core.config)}/ui/evals/${evalId}?run=${runId}`;
}

/** OpenAI's Evals API on Conduit's evals (see `evalsWire.ts`): every object is the user's own, else a 404. */
export default async function openAiEvalRoutes(app: FastifyInstance, { core }: { core: Core }) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { evals } = core;
  const tags = ["openai evals"];

  r.post(
    "/v1/evals",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible eval: testing criteria for items of a custom schema",
        body: OpenAiEvalCreateBody,
        response: responses({ 200: OpenAiEval }, [400, 401, 413, 415]),
      },
    },
    async (request) => {
      const body = request.body;
      checkDataSourceConfig(body.data_source_config);
      const { graders, expectedField } = gradersOfCriteria(body.testing_criteria);
      const created = await evals
        .create(request.userId, {
          name: body.name ?? "eval",
          graders,
          faceRequest: {
            face: "openai",
            dataSourceConfig: body.data_source_config,
            testingCriteria: body.testing_criteria,
            metadata: body.metadata ?? null,
            expectedField,
          },
        })
        .catch((error: unknown) => {
          throw openAiGraderError(error);
        });
      return openAiEval(created);
    },
  );

  r.get(
    "/v1/evals",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible list of your evals",
        querystring: OpenAiEvalListQuery,
        response: responses({ 200: listOf(OpenAiEval) }, [400, 401]),
      },
    },
    async (request) => {
      const { after, limit, order } = request.query;
      const rows = await evals.list(request.userId, { after, limit: limit + 1, order });
      return page(rows.map(openAiEval), limit);
    },
  );

  r.get(
    "/v1/evals/:eval_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible eval",
        params: OpenAiEvalParams,
        response: responses({ 200: OpenAiEval }),
      },
    },
    async (request) => openAiEval(await evals.get(request.userId, request.params.eval_id)),
  );

  r.post(
    "/v1/evals/:eval_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible eval update (name, metadata)",
        params: OpenAiEvalParams,
        body: OpenAiEvalUpdateBody,
        response: responses({ 200: OpenAiEval }),
      },
    },
    async (request) => {
      const found = await evals.get(request.userId, request.params.eval_id);
      return openAiEval(
        await evals.rename(request.userId, found.id, request.body.name ?? found.name, request.body.metadata),
      );
    },
  );

  r.delete(
    "/v1/evals/:eval_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible eval deletion",
        params: OpenAiEvalParams,
        response: responses({
          200: Type.Object({ object: Type.String(), deleted: Type.Boolean(), eval_id: Type.String() }),
        }),
      },
    },
    async (request) => {
      await evals.delete(request.userId, request.params.eval_id);
      return { object: "eval.deleted", deleted: true, eval_id: request.params.eval_id };
    },
  );

  openAiEvalRunRoutes(app, core);
  openAiOutputItemRoutes(app, core);
}

/** OpenAI's eval runs: created (queued), listed, read, cancelled, deleted. */
function openAiEvalRunRoutes(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { evals } = core;
  const tags = ["openai evals"];

  r.post(
    "/v1/evals/:eval_id/runs",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible eval run: one model answers the data source's items (queued)",
        description:
          "`data_source` `completions` only: `model` (a base model, run id or `ft:` name of yours), `source` " +
          "`file_content` (`[{item}]`) or `file_id` (one of your files: items `{input, output}`), `input_messages` " +
          "`template` (`{{item.<field>}}` is replaced), `sampling_params.max_completion_tokens`. Answers are greedy.",
        params: OpenAiEvalParams,
        body: OpenAiEvalRunCreateBody,
        response: responses({ 200: OpenAiEvalRun }, [400, 401, 404, 409, 413, 415]),
      },
    },
    async (request) => {
      const found = await evals.get(request.userId, request.params.eval_id);
      const asked = runRequest(request.body.data_source);
      const items = await openAiRunItems(core, request.userId, found, asked);
      const run = await evals.createRun(request.userId, found.id, {
        models: [asked.model],
        name: request.body.name || `${found.name} on ${asked.model}`,
        maxTokens: asked.maxTokens,
        items,
        faceRequest: {
          face: "openai",
          dataSource: request.body.data_source,
          metadata: request.body.metadata ?? null,
        },
      });
      return openAiEvalRun(run, reportUrl(core, found.id, run.id));
    },
  );

  r.get(
    "/v1/evals/:eval_id/runs",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible list of an eval's runs",
        params: OpenAiEvalParams,
        querystring: OpenAiEvalListQuery,
        response: responses({ 200: listOf(OpenAiEvalRun) }),
      },
    },
    async (request) => {
      const { after, limit, order } = request.query;
      const runs = await evals.listRuns(request.userId, request.params.eval_id, {
        after,
        limit: limit + 1,
        order,
      });
      return page(
        runs.map((run) => openAiEvalRun(run, reportUrl(core, run.evalId, run.id))),
        limit,
      );
    },
  );

  r.get(
    "/v1/evals/:eval_id/runs/:run_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible eval run",
        params: OpenAiEvalRunParams,
        response: responses({ 200: OpenAiEvalRun }),
      },
    },
    async (request) => {
      const run = await evals.getRun(request.userId, request.params.eval_id, request.params.run_id);
      return openAiEvalRun(run, reportUrl(core, run.evalId, run.id));
    },
  );

  r.post(
    "/v1/evals/:eval_id/runs/:run_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible eval run cancel",
        description: "A run that has ended answers 409.",
        params: OpenAiEvalRunParams,
        response: responses({ 200: OpenAiEvalRun }, [400, 401, 404, 409]),
      },
    },
    async (request) => {
      const run = await evals.cancel(request.userId, request.params.eval_id, request.params.run_id);
      return openAiEvalRun(run, reportUrl(core, run.evalId, run.id));
    },
  );

  r.delete(
    "/v1/evals/:eval_id/runs/:run_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible eval run deletion",
        params: OpenAiEvalRunParams,
        response: responses({
          200: Type.Object({ object: Type.String(), deleted: Type.Boolean(), run_id: Type.String() }),
        }),
      },
    },
    async (request) => {
      await evals.deleteRun(request.userId, request.params.eval_id, request.params.run_id);
      return { object: "eval.run.deleted", deleted: true, run_id: request.params.run_id };
    },
  );
}

/** OpenAI's output items: each answer of an eval run with its grader results. */
function openAiOutputItemRoutes(app: FastifyInstance, core: Core) {
  const r = app.withTypeProvider<TypeBoxTypeProvider>();
  const { evals } = core;
  const tags = ["openai evals"];

  r.get(
    "/v1/evals/:eval_id/runs/:run_id/output_items",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible output items: each answer with its grader results",
        params: OpenAiEvalRunParams,
        querystring: Type.Object({
          after: Type.Optional(
            Type.String({
              pattern: OUTPUT_ITEM_ID,
              [REASON]: "must be an output item id (outputitem_<model>_<item>)",
            }),
          ),
          limit: Type.Integer({ minimum: 1, maximum: 100, default: 20, description: "Defaults to `20`." }),
          order: Type.Union([Type.Literal("asc"), Type.Literal("desc")], {
            default: "asc",
            description: "Defaults to `asc`.",
          }),
          status: Type.Optional(Type.Union([Type.Literal("pass"), Type.Literal("fail")])),
        }),
        response: responses({ 200: listOf(OpenAiOutputItem) }),
      },
    },
    async (request) => {
      const { after, limit, order, status } = request.query;
      const { run, results } = await evals.results(
        request.userId,
        request.params.eval_id,
        request.params.run_id,
        {
          limit: ALL_RESULTS,
          offset: 0,
        },
      );
      let items = results.map((result) => openAiOutputItem(run, result, run.updatedAt));
      if (order === "desc") items.reverse();
      if (status !== undefined) items = items.filter((item) => item.status === status);
      if (after !== undefined) {
        const position = outputItemPosition(after, run.items.length);
        if (!position)
          throw new ConduitError("invalid_request", `"after" is not an output item id`, { param: "after" });
        const at = items.findIndex((item) => item.id === outputItemId(position));
        items = at < 0 ? [] : items.slice(at + 1);
      }
      return page(items, limit);
    },
  );

  r.get(
    "/v1/evals/:eval_id/runs/:run_id/output_items/:output_item_id",
    {
      schema: {
        tags,
        summary: "OpenAI-compatible output item",
        params: OpenAiOutputItemParams,
        response: responses({ 200: OpenAiOutputItem }),
      },
    },
    async (request) => {
      const { eval_id, run_id, output_item_id } = request.params;
      const run = await evals.getRun(request.userId, eval_id, run_id);
      const position = outputItemPosition(output_item_id, run.items.length);
      if (!position)
        throw new ConduitError("not_found", `output item ${output_item_id} not found`, {
          param: "output_item_id",
        });
      const { result } = await evals.result(
        request.userId,
        eval_id,
        run_id,
        position.modelIndex,
        position.itemIndex,
      );
      return openAiOutputItem(run, result, run.updatedAt);
    },
  );
}

/**
 * The items of an OpenAI eval run: given in its data source, or a file of the user's (through the data source's
 * template, or as its pairs when the criteria compare with `item.input` or `item.output`).
 */
async function openAiRunItems(
  core: Core,
  userId: string,
  found: Eval,
  asked: ReturnType<typeof runRequest>,
): Promise<ResolvedItem[]> {
  // `null`: no criterion compares with an item field (model graders read the items through their templates).
  const stored = found.config.faceRequest?.expectedField;
  const expectedField = stored === undefined ? "expected" : stored;
  if (asked.items) return resolveOpenAiItems(asked.items, asked.template, expectedField);
  const fromFile = await core.evals.resolveItems(
    userId,
    { type: "file", fileId: asked.fileId as string },
    "data_source.source.id",
  );
  const raw = fromFile.map((item) => ({ input: questionOf(item), output: item.expected }));
  return asked.template
    ? resolveOpenAiItems(raw, asked.template, expectedField)
    : fromFile.map((item, i) => {
        const expected = expectedField === null ? "" : raw[i]?.[expectedField as "input" | "output"];
        if (expected === undefined)
          throw new ConduitError(
            "invalid_request",
            `the testing criteria compare with item.${expectedField}, but a file's items have the fields input and output`,
            { param: "data_source.source.id" },
          );
        return { ...item, expected, raw: raw[i] };
      });
}

/** Every result of a run (at most its items × models). */
const ALL_RESULTS = 5000 * 8;
