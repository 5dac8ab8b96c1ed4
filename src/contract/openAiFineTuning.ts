import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { Nullable } from "./nullable.ts";
import { noControlCharacters, REASON } from "./patterns.ts";

/**
 * OpenAI's files and fine-tuning jobs, as Conduit speaks them (`/v1/files`, `/v1/fine_tuning/jobs`).
 * Every field OpenAI documents is honoured or refused with a 400 naming it; `null` means the default
 * (`Nullable`); a field OpenAI does not have is a 400.
 */

const Id = Type.String({ minLength: 1, maxLength: 128, pattern: noControlCharacters });
const Auto = Type.Literal("auto");
const Nullish = <T extends TSchema>(schema: T, description?: string) =>
  Type.Union([schema, Type.Null()], description === undefined ? {} : { description });

export const OpenAiFileParams = Type.Object({ file_id: Id });
export const OpenAiJobParams = Type.Object({ fine_tuning_job_id: Id });

export const OpenAiFile = Type.Object(
  {
    id: Type.String({
      description:
        "The file's id, the same as in `/conduit/dataset/{dataset_id}/files`; a job's result file is `file-{job id}`.",
    }),
    object: Type.Literal("file"),
    bytes: Type.Integer(),
    created_at: Type.Integer({ description: "Unix seconds." }),
    filename: Type.String(),
    purpose: Type.Union([Type.Literal("fine-tune"), Type.Literal("fine-tune-results")], {
      description:
        "`fine-tune` for an uploaded file; `fine-tune-results` for a succeeded job's result file (its adapter GGUF, " +
        "or a full run's model), which goes with the job's run.",
    }),
    status: Type.Literal("processed", {
      description: "Always `processed`: a file is validated as it is uploaded.",
    }),
    status_details: Type.Null(),
    expires_at: Type.Null({ description: "Files do not expire." }),
    dataset_id: Nullish(
      Type.String(),
      "Conduit: the dataset the file belongs to (`null` for a job's result file).",
    ),
  },
  { description: "An OpenAI file: one of your Conduit files." },
);

export const OpenAiFileList = Type.Object({
  object: Type.Literal("list"),
  data: Type.Array(OpenAiFile),
  has_more: Type.Boolean(),
  first_id: Nullish(Type.String()),
  last_id: Nullish(Type.String()),
});

export const OpenAiFileListQuery = Type.Object(
  {
    after: Type.Optional(Id),
    limit: Type.Integer({
      minimum: 1,
      maximum: 10_000,
      default: 10_000,
      description: "Defaults to `10000`.",
    }),
    order: Type.Union([Type.Literal("asc"), Type.Literal("desc")], {
      default: "desc",
      description: "By creation time. Defaults to `desc`.",
    }),
    purpose: Type.Optional(
      Type.String({ maxLength: 64, description: "Every file is `fine-tune`; any other purpose lists none." }),
    ),
  },
  { additionalProperties: false },
);

export const OpenAiFileDeleted = Type.Object({
  id: Type.String(),
  object: Type.Literal("file"),
  deleted: Type.Boolean(),
});

/** `POST /v1/files`: multipart, as OpenAI's clients send it. */
export const OpenAiFileUpload = {
  content: {
    "multipart/form-data": {
      schema: Type.Object(
        {
          file: Type.String({
            format: "binary",
            description:
              'JSONL of chat examples (`{"messages": [...]}`, OpenAI\'s format) or IO pairs (`{"input","output"}`), ' +
              "a JSON array of them, or CSV with `input,output` columns; for a DPO job, preference examples in " +
              'OpenAI\'s format (`{"input": {"messages"}, "preferred_output", "non_preferred_output"}`) or ' +
              "Conduit's (`input`, `preferred`, `non_preferred`).",
          }),
          purpose: Type.Literal("fine-tune", { description: 'Only `"fine-tune"`.' }),
        },
        { additionalProperties: false },
      ),
    },
  },
};

const Epochs = Type.Union([Auto, Type.Integer({ minimum: 1, maximum: 1000 })], {
  description:
    'Passes over the training file, 1–1000, or `"auto"` (chosen from the file). Defaults to `"auto"`.',
});
const Multiplier = Type.Union([Auto, Type.Number({ exclusiveMinimum: 0, maximum: 100 })], {
  description:
    'Multiplies the learning rate Conduit\'s `"auto"` picks for the base model (so `1` is that rate), in (0, 100]. ' +
    'Defaults to `"auto"` (`1`).',
});
const BatchSize = Type.Literal("auto", {
  description:
    'Only `"auto"`: conversations are packed into token windows, one optimizer step per window, so there is no batch size to set.',
  [REASON]:
    'is not settable here: conversations are packed into token windows, one optimizer step per window; only "auto" is accepted',
});

export const OpenAiHyperparameters = Type.Object(
  {
    n_epochs: Nullable(Epochs),
    learning_rate_multiplier: Nullable(Multiplier),
    batch_size: Nullable(BatchSize),
  },
  { additionalProperties: false },
);

const Beta = Type.Union([Auto, Type.Number({ exclusiveMinimum: 0, maximum: 100 })], {
  description:
    "DPO's β, in (0, 100]: how far the trained model may move from the reference (higher keeps it closer), or " +
    '`"auto"` (`0.1`). Defaults to `"auto"`.',
});

export const OpenAiDpoHyperparameters = Type.Object(
  {
    beta: Nullable(Beta),
    n_epochs: Nullable(Epochs),
    learning_rate_multiplier: Nullable(Multiplier),
    batch_size: Nullable(BatchSize),
  },
  { additionalProperties: false },
);

const Unsupported = (reason: string) => Type.Optional(Type.Null({ description: reason, [REASON]: reason }));

export const OpenAiJobCreateBody = Type.Object(
  {
    model: Type.String({
      minLength: 1,
      maxLength: 256,
      pattern: noControlCharacters,
      description:
        "A base model (see `/v1/models`); a fine-tuned model (its `ft:` name, a LoRA run of yours) only with " +
        '`method.type` `"dpo"`: preference tuning continues its adapter.',
    }),
    training_file: Id,
    validation_file: Nullable(Id),
    suffix: Nullable(
      Type.String({
        minLength: 1,
        maxLength: 64,
        pattern: "^[A-Za-z0-9._-]+$",
        description:
          "Up to 64 letters, digits, `.`, `_` or `-`; part of the model's name `ft:{model}:{suffix}:{job id}`.",
        [REASON]: 'must be 1 to 64 letters, digits, ".", "_" or "-"',
      }),
    ),
    hyperparameters: Nullable(OpenAiHyperparameters),
    method: Nullable(
      Type.Object(
        {
          type: Type.Union([Type.Literal("supervised"), Type.Literal("dpo")], {
            description:
              '`"supervised"`, or `"dpo"`: preference tuning on a file of preference examples, of the base ' +
              "`model` or on top of a fine-tuned one (`model` its `ft:` name).",
            [REASON]: 'must be "supervised" or "dpo": reinforcement fine-tuning is not supported',
          }),
          supervised: Nullable(
            Type.Object(
              { hyperparameters: Nullable(OpenAiHyperparameters) },
              { additionalProperties: false },
            ),
          ),
          dpo: Nullable(
            Type.Object(
              { hyperparameters: Nullable(OpenAiDpoHyperparameters) },
              { additionalProperties: false },
            ),
          ),
          reinforcement: Unsupported("is not supported: reinforcement fine-tuning is not implemented"),
        },
        { additionalProperties: false },
      ),
    ),
    seed: Nullable(
      Type.Integer({
        minimum: 0,
        maximum: 2_147_483_647,
        description: "Seeds the sample order, the held-out pairs and the adapter's start. Defaults to `42`.",
      }),
    ),
    metadata: Nullable(
      Type.Record(Type.String(), Type.String({ maxLength: 512 }), {
        maxProperties: 16,
        description:
          "Up to 16 keys (64 characters each) with string values (512 characters each); kept and returned.",
      }),
    ),
    integrations: Nullable(
      Type.Array(Type.Unknown(), {
        maxItems: 0,
        [REASON]: "is not supported: there are no integrations (Weights & Biases); only [] is accepted",
      }),
    ),
  },
  { additionalProperties: false },
);
export type OpenAiJobCreateBodyWire = Static<typeof OpenAiJobCreateBody>;
export type OpenAiHyperparametersWire = Static<typeof OpenAiHyperparameters>;
export type OpenAiDpoHyperparametersWire = Static<typeof OpenAiDpoHyperparameters>;

export const OpenAiJobStatus = Type.Union(
  ["queued", "running", "pausing", "paused", "succeeded", "failed", "cancelled", "validating_files"].map(
    (s) => Type.Literal(s),
  ),
  {
    description:
      "QUEUED → `queued`, RUNNING → `running`, PAUSED → `pausing` while its trainer stops and `paused` once it " +
      "has, READY → `succeeded`, FAILED → `failed`, CANCELLED → `cancelled`. " +
      "`validating_files` never shows: files are validated when uploaded and when the job is created.",
  },
);

const ResolvedHyperparameters = Type.Object({
  n_epochs: Type.Integer({ description: "The epochs the run trains (auto's choice when not given)." }),
  learning_rate_multiplier: Type.Number({ description: "The multiplier asked for, `1` when auto." }),
  batch_size: Auto,
});

export const OpenAiJob = Type.Object(
  {
    id: Type.String({ description: "The run id (also `GET /conduit/finetuning/{id}`)." }),
    object: Type.Literal("fine_tuning.job"),
    created_at: Type.Integer(),
    finished_at: Nullish(Type.Integer()),
    estimated_finish: Nullish(
      Type.Integer(),
      "Unix seconds when a queued or running job should finish: a running job's `estimate.finishAt`, a queued " +
        "job's now plus its `estimate.seconds` (the jobs ahead of it are not counted); null once it has ended.",
    ),
    error: Nullish(
      Type.Object({ code: Type.String(), message: Type.String(), param: Nullish(Type.String()) }),
      "Why the job failed, once `failed`.",
    ),
    fine_tuned_model: Nullish(
      Type.String(),
      "The model's name once `succeeded`: `ft:{model}:{suffix}:{id}`.",
    ),
    model: Type.String(),
    organization_id: Type.String({ description: "The owning user." }),
    result_files: Type.Array(Type.String(), {
      description:
        "A succeeded job's result file (`file-{job id}`): its adapter GGUF (a full run's model), read with " +
        "`GET /v1/files/{file_id}/content`.",
    }),
    seed: Type.Integer(),
    status: OpenAiJobStatus,
    trained_tokens: Nullish(Type.Integer()),
    training_file: Type.String({
      description: "The training file (a run started with the Conduit API: its dataset id).",
    }),
    validation_file: Nullish(Type.String()),
    hyperparameters: ResolvedHyperparameters,
    method: Type.Union([
      Type.Object({
        type: Type.Literal("supervised"),
        supervised: Type.Object({ hyperparameters: ResolvedHyperparameters }),
      }),
      Type.Object({
        type: Type.Literal("dpo"),
        dpo: Type.Object({
          hyperparameters: Type.Object({
            ...ResolvedHyperparameters.properties,
            beta: Type.Number({ description: "DPO's β (`0.1` when auto)." }),
          }),
        }),
      }),
    ]),
    integrations: Nullish(Type.Array(Type.Unknown())),
    metadata: Nullish(Type.Record(Type.String(), Type.String())),
    user_provided_suffix: Nullish(Type.String()),
  },
  { description: "An OpenAI fine-tuning job: one of your Conduit runs." },
);
export type OpenAiJobWire = Static<typeof OpenAiJob>;

export const OpenAiJobList = Type.Object({
  object: Type.Literal("list"),
  data: Type.Array(OpenAiJob),
  has_more: Type.Boolean(),
});

/** The most events one page of a job's events holds; a larger `limit` is taken as this (OpenAI documents no cap). */
export const MAX_EVENT_PAGE = 1000;

export const OpenAiPageQuery = Type.Object(
  {
    after: Type.Optional(Id),
    limit: Type.Integer({
      minimum: 1,
      default: 20,
      description: `At most ${MAX_EVENT_PAGE} events a page: a larger limit is taken as ${MAX_EVENT_PAGE}. Defaults to \`20\`.`,
    }),
  },
  { additionalProperties: false },
);

/** `metadata[key]=value` in a job list's query, as OpenAI's clients write a metadata filter. */
export const metadataFilterKey = /^metadata\[([^\]]{1,64})\]$/;

export const OpenAiJobListQuery = Type.Object(
  {
    after: Type.Optional(Id),
    limit: Type.Integer({ minimum: 1, maximum: 100, default: 20, description: "Defaults to `20`." }),
  },
  {
    additionalProperties: false,
    patternProperties: {
      [metadataFilterKey.source]: Type.String({
        maxLength: 512,
        description:
          "`metadata[key]=value`: only jobs whose metadata has that value (every such filter must match).",
      }),
    },
  },
);

export const OpenAiJobEvent = Type.Object({
  id: Type.String(),
  object: Type.Literal("fine_tuning.job.event"),
  created_at: Type.Integer(),
  level: Type.Union([Type.Literal("info"), Type.Literal("warn"), Type.Literal("error")]),
  message: Type.String(),
  type: Type.Literal("message"),
  data: Nullish(
    Type.Object({ status: OpenAiJobStatus }),
    "On the last event of an ended job: its final `status`.",
  ),
});
export type OpenAiJobEventWire = Static<typeof OpenAiJobEvent>;

export const OpenAiJobEventList = Type.Object({
  object: Type.Literal("list"),
  data: Type.Array(OpenAiJobEvent),
  has_more: Type.Boolean(),
});

export const OpenAiCheckpoint = Type.Object({
  id: Type.String({ description: "`ftckpt_<job id without ft_>_<step>`." }),
  object: Type.Literal("fine_tuning.job.checkpoint"),
  created_at: Type.Integer(),
  fine_tuned_model_checkpoint: Type.String({
    description: "Its model name: the job's `fine_tuned_model`, then `:ckpt-step-<step>`.",
  }),
  fine_tuning_job_id: Type.String(),
  metrics: Type.Object(
    {
      step: Type.Integer(),
      train_loss: Type.Number(),
      valid_loss: Type.Optional(Type.Number()),
      full_valid_loss: Type.Optional(Type.Number()),
    },
    {
      description:
        "`train_loss`: the epoch's mean loss per trained token; `valid_loss` and `full_valid_loss`: the eval loss " +
        "over the whole eval set, when there is one. No token accuracy is measured.",
    },
  ),
  step_number: Type.Integer(),
});

export const OpenAiCheckpointQuery = Type.Object(
  {
    after: Type.Optional(
      Type.String({ maxLength: 200, description: "A checkpoint id: the page starts after it." }),
    ),
    limit: Type.Integer({
      minimum: 1,
      default: 10,
      description: "Defaults to `10`. A run keeps at most 3 checkpoints, so one page holds them all.",
    }),
  },
  { additionalProperties: false },
);

export const OpenAiCheckpointList = Type.Object({
  object: Type.Literal("list"),
  data: Type.Array(OpenAiCheckpoint),
  first_id: Type.Union([Type.String(), Type.Null()]),
  last_id: Type.Union([Type.String(), Type.Null()]),
  has_more: Type.Boolean(),
});
export type OpenAiCheckpointListWire = Static<typeof OpenAiCheckpointList>;
