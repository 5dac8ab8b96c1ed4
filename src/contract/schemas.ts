import { Type, type Static, type TSchema } from "@sinclair/typebox";
import { errorCatalog } from "../errors.ts";
import { ESTIMATE_BASES } from "./estimate.ts";
import type { RunEvaluation } from "./evals.ts";
import { noControlCharacters, noNul, REASON } from "./patterns.ts";
import { LORA_TARGETS, loraLimits, RUN_METHODS, runStatuses, TRAINERS, type RunStats } from "./runs.ts";

/**
 * One schema per wire type. Routes validate with these, the OpenAPI document is generated
 * from them, and the CLI and dashboard share the static types.
 */

const Timestamp = Type.String({
  description: "UTC time, `YYYY-MM-DD HH:MM:SS.mmm`",
  examples: ["2026-11-22 18:30:00.000"],
});

const Id = Type.String({ minLength: 1, maxLength: 128, pattern: noControlCharacters });
export const Name = Type.String({
  minLength: 1,
  maxLength: 256,
  pattern: noControlCharacters,
  description: "1 to 256 characters, no control characters",
});

/** IO-pair file formats. */
export const FileFormat = Type.Union([Type.Literal("jsonl"), Type.Literal("json"), Type.Literal("csv")]);

export const ErrorBody = Type.Object(
  {
    error: Type.Object({
      message: Type.String(),
      type: Type.String(),
      param: Type.Union([Type.String(), Type.Null()]),
      code: Type.String(),
    }),
  },
  { $id: "Error", description: "Every error, on every endpoint." },
);

export const Message = Type.Object(
  { message: Type.Literal("SUCCESS") },
  { $id: "Message", description: "Returned by rename, cancel and every DELETE." },
);

export const Dataset = Type.Object(
  {
    id: Type.String(),
    userId: Type.String(),
    name: Type.String(),
    ioPairsCount: Type.Integer({ description: "Sum of the IO pairs of the dataset's files." }),
    status: Type.Literal("READY", { description: "Datasets are READY as soon as they are created." }),
    createdAt: Timestamp,
    updatedAt: Timestamp,
  },
  { $id: "Dataset" },
);

export const DatasetFile = Type.Object(
  {
    id: Type.String(),
    datasetId: Type.String(),
    datasetID: Type.String({ description: "Same as `datasetId` (the API spells it both ways)." }),
    name: Type.String(),
    size: Type.Integer({ description: "Bytes." }),
    type: Type.Literal("IO"),
    format: FileFormat,
    ioPairsCount: Type.Integer(),
    createdAt: Timestamp,
    updatedAt: Timestamp,
  },
  { $id: "File" },
);

export const IoPairPreview = Type.Object({
  input: Type.String({ description: "A chat example's last user turn before its last trained answer." }),
  output: Type.String({ description: "A chat example's last trained assistant turn." }),
  line: Type.Integer(),
  messages: Type.Optional(
    Type.Array(
      Type.Object({
        role: Type.String(),
        content: Type.String(),
        weight: Type.Optional(Type.Integer({ description: "0: context only, not trained." })),
      }),
      {
        description:
          "A chat example's whole conversation (`developer` turns shown as `system`); absent for an IO pair. " +
          "A preference example's prompt, when it is a conversation, closed by its preferred answer.",
      },
    ),
  ),
  rejected: Type.Optional(
    Type.String({
      description:
        "A preference example's non-preferred answer (`output` is its preferred one); absent otherwise.",
    }),
  ),
});

export const RunStatus = Type.Union(
  runStatuses.map((s) => Type.Literal(s)),
  {
    description:
      "QUEUED → RUNNING → READY | FAILED | CANCELLED (QUEUED can be CANCELLED too). QUEUED or RUNNING → PAUSED " +
      "(`pause`), PAUSED → QUEUED (`resume`: it goes on from its checkpoint) or CANCELLED.",
  },
);

const EstimateSeconds = (description: string) => Type.Number({ minimum: 0, description });

/** The estimate made when a run was created (`RunPlan`). */
const RunPlanSchema = Type.Object(
  {
    basis: Type.Union([Type.Literal("prior"), Type.Literal("measured")], {
      description:
        "`measured`: the training rate of this server's latest READY runs of the same trainer, base model and " +
        "method; `prior`: none yet, a rate scaled from the trainer's benchmarks by the model's size and the threads.",
    }),
    seconds: EstimateSeconds(
      "The run's expected time from its start on a worker to READY: preparing its examples, the trainer, the " +
        "per-example losses.",
    ),
    tokens: Type.Integer({ description: "Training tokens planned: window positions, padding included." }),
    sampleTokens: Type.Integer({ description: "Tokens of the examples planned, padding excluded." }),
    tokenRatio: Type.Number({
      description:
        "Tokens the earlier runs trained per token their plans counted from their files' bytes; `sampleTokens` " +
        "includes it. 1 with a prior.",
    }),
    steps: Type.Integer({ description: "Optimizer steps planned (one per window)." }),
    windowSize: Type.Integer({ description: "The training window planned, in tokens." }),
    tokensPerSecond: Type.Number({
      description: "Training tokens per second assumed for the training loop.",
    }),
    overheadSeconds: EstimateSeconds(
      "Seconds assumed outside the training loop: preparing the examples, starting the trainer, loading the base " +
        "model, tokenizing, per-example losses, saving.",
    ),
    measuredRuns: Type.Integer({ description: "Earlier runs the rate was measured on; 0 with a prior." }),
    cpuShare: Type.Optional(
      Type.Number({
        description:
          "The share of a core each trainer thread was expected to get when the run was created, from the load " +
          "average (1: a core each); the rate and the overhead are scaled by it. Absent in older plans.",
      }),
    ),
  },
  { description: "The estimate made when the run was created." },
);

/** `run.estimate`: see src/contract/estimate.ts. */
const RunEstimateSchema = Type.Union(
  [
    Type.Object({
      basis: Type.Union(
        ESTIMATE_BASES.map((basis) => Type.Literal(basis)),
        {
          description:
            "`prior` or `measured`: the plan made at creation (the run has not trained a step yet); `training`: " +
            "the trainer's own pace (seconds elapsed plus `stats.etaSeconds`); `final`: a READY run's actual time.",
        },
      ),
      seconds: EstimateSeconds(
        "The run's whole time from its start on a worker to READY (while it trains: the trainer's part, " +
          "elapsed plus to go; once READY: `stats.final.runSeconds`).",
      ),
      remainingSeconds: EstimateSeconds(
        "Seconds still to go when the run was last updated (`updatedAt`); 0 once READY.",
      ),
      finishAt: Type.Union([Timestamp, Type.Null()], {
        description:
          "When a RUNNING run should be READY: its `updatedAt` plus `remainingSeconds`. Null otherwise: a QUEUED " +
          "run's seconds count from its start (the runs ahead of it in the queue are not counted).",
      }),
      measuredRuns: Type.Integer({
        description: "Earlier runs the plan's rate was measured on; 0 with a prior.",
      }),
      planned: Type.Union([RunPlanSchema, Type.Null()], {
        description: "The plan made at creation; null for runs created before Conduit planned them.",
      }),
    }),
    Type.Null(),
  ],
  {
    description:
      "How long the run takes, from creation: planned from the dataset, the settings and the rate of its trainer " +
      "on its base model, refined from the trainer's pace as it trains, the actual time once READY; null for a " +
      "FAILED or CANCELLED run, and where none can be made.",
  },
);

export const Run = Type.Object(
  {
    id: Type.String(),
    userId: Type.String(),
    datasetId: Type.String(),
    datasetID: Type.String({ description: "Same as `datasetId`." }),
    datasetName: Type.String(),
    name: Type.String(),
    ioPairsCount: Type.Integer(),
    status: RunStatus,
    trackerURL: Type.String(),
    createdAt: Timestamp,
    updatedAt: Timestamp,
    logs: Type.Array(Type.String()),
    stats: Type.Unsafe<RunStats>(
      Type.Record(Type.String(), Type.Unknown(), { description: "What the run reports as it trains." }),
    ),
    config: Type.Record(Type.String(), Type.Unknown(), { description: "The run's effective settings." }),
    error: Type.Union([Type.String(), Type.Null()], { description: "Why the run FAILED; null otherwise." }),
    estimate: RunEstimateSchema,
    evaluation: Type.Unsafe<RunEvaluation | null>(
      Type.Union([Type.Record(Type.String(), Type.Unknown()), Type.Null()], {
        description:
          "The automatic before/after (`CONDUIT_EVAL_AFTER_RUN`) of a READY run with an eval split: `{evalId, " +
          "evalRunId, status, base: {model, items, exact, similarity}, fineTuned: {...}, improved, summary}`, " +
          'summary such as "base 0/20 → fine-tune 20/20 exact match (similarity 0.05 → 0.98): improved"; null when ' +
          "none was made (yet). Every run on the Conduit face has it: created, listed or read.",
      }),
    ),
  },
  { $id: "Run" },
);

/** Lists of runs: each run without its log and loss series, which only `GET /conduit/finetuning/{id}` carries. */
const { logs: _logs, ...summaryFields } = Run.properties;
export const RunSummary = Type.Object(
  {
    ...summaryFields,
    stats: Type.Unsafe<Omit<RunStats, "lossSeries" | "evalLossSeries">>(
      Type.Record(Type.String(), Type.Unknown(), {
        description: "The run's `stats` without `lossSeries` and `evalLossSeries` (read the run for those).",
      }),
    ),
  },
  {
    $id: "RunSummary",
    description:
      "A run as lists show it: every field of a run but `logs`, and `stats` without the loss series.",
  },
);

export const PageQuery = Type.Object(
  {
    limit: Type.Integer({
      minimum: 1,
      maximum: 1000,
      default: 100,
      description: "Items per page. Defaults to `100`.",
    }),
    offset: Type.Integer({
      minimum: 0,
      maximum: 1_000_000_000,
      default: 0,
      description: "Items to skip, up to 1e9. Defaults to `0`.",
    }),
  },
  { additionalProperties: false },
);

export const DatasetParams = Type.Object({ dataset_id: Id });
export const FileParams = Type.Object({ dataset_id: Id, file_id: Id });
export const RunParams = Type.Object({ finetune_id: Id });
export const RunCheckpointParams = Type.Object({
  finetune_id: Id,
  step: Type.Integer({ minimum: 1, maximum: 999_999_999, description: "The checkpoint's step." }),
});

export const RunCheckpoint = Type.Object({
  step: Type.Integer({ description: "The optimizer step it was written at (an epoch's end)." }),
  epoch: Type.Integer({ description: "The epoch that ended there (1-based)." }),
  trainLoss: Type.Number({ description: "Mean loss per trained token over that epoch." }),
  evalLoss: Type.Union([Type.Number(), Type.Null()], {
    description: "The eval loss there; null without an eval set.",
  }),
  model: Type.String({ description: "Its model name: the run's, then `:ckpt-step-<step>`." }),
  createdAt: Type.String(),
});
export const RunCheckpointList = Type.Array(RunCheckpoint);

export const CreateDatasetBody = Type.Object({ name: Name }, { additionalProperties: false });
export const RenameDatasetBody = Type.Object({ name: Name }, { additionalProperties: false });

export const IoPairInput = Type.Object(
  { input: Type.String({ minLength: 1 }), output: Type.String({ minLength: 1 }) },
  { additionalProperties: true },
);

/** JSON form of an upload (multipart and raw bodies are the streaming forms). */
export const UploadJsonBody = Type.Object(
  {
    name: Name,
    content: Type.Optional(Type.String({ description: "The file's text (JSONL, JSON array or CSV)." })),
    ioPairs: Type.Optional(
      Type.Array(IoPairInput, { description: "Pairs given directly; stored as JSONL." }),
    ),
    format: Type.Optional(FileFormat),
  },
  {
    additionalProperties: false,
    allOf: [
      {
        oneOf: [{ required: ["content"] }, { required: ["ioPairs"] }],
        [REASON]: 'needs exactly one of "content" and "ioPairs"',
      },
    ],
  },
);

/** Raw-body uploads: the request body is the file. */
export const rawContentTypes = [
  "application/jsonl",
  "application/x-ndjson",
  "text/csv",
  "text/plain",
  "application/octet-stream",
];

/**
 * An upload's body, by media type. Only the JSON form is validated by the route; the multipart
 * and raw forms are read and checked by the handler as they stream to disk.
 */
export const UploadBody = {
  content: {
    "multipart/form-data": {
      schema: Type.Object(
        {
          file: Type.String({ format: "binary", description: "The file (JSONL, JSON array or CSV)." }),
          name: Type.Optional(Name),
          format: Type.Optional(FileFormat),
        },
        { additionalProperties: false },
      ),
    },
    "application/json": { schema: UploadJsonBody },
    ...Object.fromEntries(
      rawContentTypes.map((type) => [
        type,
        { schema: Type.String({ format: "binary", description: "The file itself; its name in `?name=`." }) },
      ]),
    ),
  },
};

export const UploadQuery = Type.Object(
  {
    name: Type.Optional(
      Type.String({
        minLength: 1,
        maxLength: 256,
        pattern: noControlCharacters,
        description:
          "The file's name (a multipart `name` field wins over it). A raw upload without it is named after its " +
          "media type: `upload.jsonl`, `upload.csv`, else `upload`.",
      }),
    ),
    format: Type.Optional(FileFormat),
  },
  { additionalProperties: false },
);

/**
 * A setting that takes a number or `"auto"` (chosen from the dataset and the model by
 * `src/train/autoSettings.ts`).
 */
function orAuto<T extends TSchema>(schema: T, description: string) {
  return Type.Union([schema, Type.Literal("auto")], { description });
}

/** Run configuration (API document 4.3's inference fields); every field is optional with a documented default. */
export const RunConfigFields = {
  datasetID: Type.Optional(Id),
  datasetId: Type.Optional(Id),
  datasetName: Type.Optional(Name),
  baseModelName: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 256,
      pattern: noControlCharacters,
      description: "A model id (see GET /v1/models). Defaults to `CONDUIT_DEFAULT_MODEL`.",
    }),
  ),
  lr: Type.Optional(
    orAuto(
      Type.Number({ exclusiveMinimum: 0, maximum: 1 }),
      "Learning rate, in (0, 1], or `auto`: chosen from the model's width and the method (`lora` trains at a " +
        "higher rate than `full`). Defaults to `auto`.",
    ),
  ),
  method: Type.Optional(
    Type.Union(
      RUN_METHODS.map((m) => Type.Literal(m)),
      {
        description:
          "`lora` trains a LoRA adapter on the frozen base model; `full` trains the model's weights themselves; " +
          "`dpo` trains a LoRA adapter by preference tuning (Direct Preference Optimization) on a dataset of " +
          "preference examples, on the torch trainer only (`config.method` is `lora`, with `config.dpo`). " +
          "Defaults to `lora`.",
      },
    ),
  ),
  beta: Type.Optional(
    Type.Number({
      exclusiveMinimum: 0,
      maximum: 100,
      description:
        "DPO's β, in (0, 100]: how far the trained model may move from the reference model (higher keeps it " +
        "closer); `dpo` only. Defaults to `0.1`.",
    }),
  ),
  fromRunID: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 128,
      pattern: noControlCharacters,
      description:
        "A READY supervised LoRA run of yours, by id or `ft:` name, whose adapter a `dpo` run starts from: " +
        "its base model, rank, alpha, targets and blocks are taken, and its model is the reference. `dpo` only. " +
        "Defaults to none: a new adapter on `baseModelName`, the base model being the reference.",
    }),
  ),
  trainer: Type.Optional(
    Type.Union(
      TRAINERS.map((t) => Type.Literal(t)),
      {
        description:
          "The trainer that trains the run: `torch` (PyTorch + PEFT, `npm run setup:torch`; LoRA only) or `llama.cpp` " +
          "(ships with Conduit). A trainer that is not installed here, or cannot train the run, is a 400 naming this " +
          "field. Defaults to the server's choice (`CONDUIT_TRAINER`). `config.trainer` shows the one it got.",
      },
    ),
  ),
  loraRank: Type.Optional(
    orAuto(
      Type.Integer({ minimum: loraLimits.minRank, maximum: loraLimits.maxRank }),
      `LoRA rank, ${loraLimits.minRank} to ${loraLimits.maxRank}, or \`auto\`: chosen from the amount of text in the ` +
        "dataset and the model's width; `lora` only. Defaults to `auto`.",
    ),
  ),
  loraAlpha: Type.Optional(
    Type.Number({
      exclusiveMinimum: 0,
      maximum: loraLimits.maxAlpha,
      description:
        `LoRA alpha, in (0, ${loraLimits.maxAlpha}]; the adapter's output is scaled by alpha / rank; \`lora\` only. ` +
        "Defaults to `2` × the effective `loraRank`.",
    }),
  ),
  loraTargets: Type.Optional(
    Type.Array(Type.Union(LORA_TARGETS.map((t) => Type.Literal(t))), {
      minItems: 1,
      uniqueItems: true,
      description:
        "The weights that get adapters, by llama.cpp tensor name, each at most once; `lora` only. " +
        "`attn_k` and `attn_v` train on the torch trainer only: this " +
        "llama.cpp release gives them no gradient (K and V pass through the KV cache), so with the llama.cpp " +
        "trainer they are a 400. Defaults to every target the run's trainer can train (`config.trainer`): " +
        `${LORA_TARGETS.map((t) => `\`${t}\``).join(", ")} on torch, the same without ` +
        "`attn_k` and `attn_v` on llama.cpp.",
    }),
  ),
  complexity: Type.Optional(
    Type.Number({
      exclusiveMinimum: 0,
      maximum: 1,
      description:
        "Fraction of the top transformer blocks that get adapters (`lora`) or train (`full`), in (0, 1]. Defaults to `1`.",
    }),
  ),
  steps: Type.Optional(
    Type.Integer({
      minimum: 1,
      maximum: 1_000_000,
      description: "Cap on optimizer steps, up to 1e6. Defaults to no cap.",
    }),
  ),
  epochs: Type.Optional(
    orAuto(
      Type.Integer({ minimum: 1, maximum: 1000 }),
      "Passes over the data, 1 to 1000, or `auto`: chosen from the number of training pairs (many passes over " +
        "a small dataset, fewer over a large one). Defaults to `auto`.",
    ),
  ),
  trainOnInputs: Type.Optional(
    Type.Boolean({
      description:
        "`false`: the loss counts only the assistant's answers (the `output` of each pair); `true`: the whole " +
        "conversation, system prompt, `input` and chat template included. Defaults to `false`.",
    }),
  ),
  validationFileID: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 128,
      pattern: noControlCharacters,
      description:
        "A file of this dataset or of another of your datasets whose pairs are the validation set: their loss " +
        "is reported after every epoch (and per example, `GET /conduit/finetuning/{id}/examples`). A file of the " +
        "training dataset is left out of training. Defaults to none: with at least 50 pairs, a random " +
        "`evalFraction` of them is held out instead.",
    }),
  ),
  earlyStoppingPatience: Type.Optional(
    Type.Integer({
      minimum: 1,
      maximum: 100,
      description:
        "Stop training after this many evaluations of the validation set in a row without a new best " +
        "validation loss, 1 to 100; needs a validation set (a `validationFileID`, or at least 50 pairs). " +
        "Defaults to none: every epoch trains.",
    }),
  ),
  systemPrompt: Type.Optional(
    Type.String({
      maxLength: 100_000,
      pattern: noNul,
      description: "System prompt trained with and served with. Defaults to none.",
    }),
  ),
  judgeModel: Type.Optional(
    Type.String({
      minLength: 1,
      maxLength: 256,
      pattern: noControlCharacters,
      description:
        "A model this server serves you (a base model, a run id or an `ft:` name) that also grades the automatic " +
        "before/after: a `score_model` grader named `judge` scores each answer from 0 to 1 against the expected " +
        "one (docs/evals.md). One that does not exist is a 400. Defaults to none: exact match and similarity only.",
    }),
  ),
  name: Type.Optional(Name),
  trackerProject: Type.Optional(Type.String({ maxLength: 256, pattern: noControlCharacters })),
  trackerEntity: Type.Optional(Type.String({ maxLength: 256, pattern: noControlCharacters })),
};

export const CreateRunBody = Type.Object(RunConfigFields, { additionalProperties: false });

/** Which pairs an example belongs to: the training set or the validation set. */
export const ExampleSplit = Type.Union([Type.Literal("train"), Type.Literal("validation")]);

export const RunExample = Type.Object(
  {
    split: ExampleSplit,
    index: Type.Integer({ description: "Position in its split, in upload order, from 0." }),
    input: Type.String(),
    output: Type.String(),
    loss: Type.Union([Type.Number(), Type.Null()], {
      description:
        "Mean loss in nats per trained token (the answer's; the whole conversation's with `trainOnInputs`) " +
        "after training: lower means the model gives this answer more readily. Null when none of its tokens " +
        "was trained (cut off by the training window, say).",
    }),
    tokens: Type.Integer({ description: "The trained tokens the loss averages." }),
  },
  { $id: "RunExample", description: "One training or validation pair of a READY run, with its loss." },
);

export const ExamplesQuery = Type.Object(
  {
    sort: Type.Union([Type.Literal("loss"), Type.Literal("index")], {
      default: "loss",
      description:
        "`loss`: the worst learned first (highest loss; examples without a loss last); `index`: training " +
        "examples then validation examples, each in upload order. Defaults to `loss`.",
    }),
    split: Type.Optional(
      Type.Union([Type.Literal("train"), Type.Literal("validation")], {
        description: "Only the training or only the validation examples. Defaults to both.",
      }),
    ),
    ...PageQuery.properties,
  },
  { additionalProperties: false },
);

export type DatasetWire = Static<typeof Dataset>;
export type DatasetFileWire = Static<typeof DatasetFile>;
export type RunWire = Static<typeof Run>;
export type RunCheckpointWire = Static<typeof RunCheckpoint>;
export type RunSummaryWire = Static<typeof RunSummary>;
export type CreateRunBodyWire = Static<typeof CreateRunBody>;
export type UploadJsonBodyWire = Static<typeof UploadJsonBody>;
export type RunExampleWire = Static<typeof RunExample>;
export type ExamplesQueryWire = Static<typeof ExamplesQuery>;

/** One Server-Sent Event of a stream, as the `text/event-stream` schema of a response. */
export function sseEvent(description: string) {
  return Type.Object(
    {
      event: Type.Optional(Type.String({ description: "The event's name, when it has one." })),
      data: Type.String({ description: "JSON, or `[DONE]` at the end of a generation." }),
    },
    { description },
  );
}

/** A 200 that is JSON, or Server-Sent Events when the request asks for `"stream": true`. */
export function jsonOrEvents(schema: TSchema, events: string) {
  return {
    description: `The result; with \`"stream": true\`, ${events}`,
    content: { "application/json": { schema }, "text/event-stream": { schema: sseEvent(events) } },
  };
}

/** What an error status means, from the catalog: each code that has it, with its description. */
function errorStatusDescription(status: number): string {
  return (Object.entries(errorCatalog) as [string, { status: number; doc: string }][])
    .filter(([, entry]) => entry.status === status)
    .map(([code, entry]) => `\`${code}\`: ${entry.doc}`)
    .join(" ");
}

/**
 * Responses: the success schema, the error schema for every listed status (the ones the route
 * itself answers), and `default` for the ones any request can get from the server (405, 408, 414,
 * 431, 500, 503, 507), all in the one error shape.
 */
export function responses(
  ok: Record<number, TSchema | ReturnType<typeof jsonOrEvents>>,
  errors: number[] = [400, 401, 404],
) {
  const out: Record<number | string, TSchema | ReturnType<typeof jsonOrEvents>> = { ...ok };
  for (const status of errors)
    out[status] = Type.Ref(ErrorBody, { description: errorStatusDescription(status) });
  out.default = Type.Ref(ErrorBody, {
    description:
      "Any other error, in the same shape: a method the path does not take (405), a request that arrived too " +
      "slowly (408), a path segment over 1024 characters (414), headers over 16 KiB (431), an unexpected failure " +
      "(500), a server shutting down (503), a full disk (507).",
  });
  return out;
}

export const sharedSchemas = [ErrorBody, Message, Dataset, DatasetFile, Run, RunSummary, RunExample];
