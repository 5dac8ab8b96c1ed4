import { MAX_GRAMMAR_COUNT, SCHEMA_BOUNDS } from "../engine/schemaBounds.ts";
import { OWN_FORMATS } from "../engine/ownRules.ts";
import { evalLimits, Grader, judgeLimits } from "../contract/evals.ts";
import { noControlCharacters, noNul } from "../contract/patterns.ts";

/**
 * Corrections to the generated OpenAPI document, so that it says what the server does.
 *
 * A field with a `default` may be left out: the validator fills the default in before it checks
 * `required` (Ajv's `useDefaults`), so the schemas list such fields as required (and the handlers'
 * types have them) while clients need not send them. The document marks them not required.
 */

type Json = Record<string, unknown>;

function isObject(value: unknown): value is Json {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** Takes defaulted properties out of `required`, in this schema and every schema inside it. */
function unrequireDefaults(node: unknown): void {
  if (Array.isArray(node)) {
    for (const item of node) unrequireDefaults(item);
    return;
  }
  if (!isObject(node)) return;
  const properties = node.properties;
  if (isObject(properties) && Array.isArray(node.required)) {
    const required = (node.required as string[]).filter((name) => {
      const property = properties[name];
      return !(isObject(property) && property.default !== undefined);
    });
    if (required.length > 0) node.required = required;
    else delete node.required;
  }
  for (const value of Object.values(node)) unrequireDefaults(value);
}

/** A query, header or cookie parameter with a default is not required. */
function unrequireDefaultedParameters(document: Json): void {
  const paths = isObject(document.paths) ? document.paths : {};
  for (const operations of Object.values(paths)) {
    if (!isObject(operations)) continue;
    for (const operation of Object.values(operations)) {
      if (!isObject(operation) || !Array.isArray(operation.parameters)) continue;
      for (const parameter of operation.parameters as Json[]) {
        if (parameter.in === "path") continue;
        if (isObject(parameter.schema) && parameter.schema.default !== undefined) parameter.required = false;
      }
    }
  }
}

/** The request body schema of `method path`, if it takes JSON. */
function jsonBody(document: Json, path: string, method: string): Json | undefined {
  const paths = isObject(document.paths) ? document.paths : {};
  const item = paths[path];
  const operation = isObject(item) ? item[method] : undefined;
  const body = isObject(operation) ? operation.requestBody : undefined;
  const content = isObject(body) ? body.content : undefined;
  const json = isObject(content) ? content["application/json"] : undefined;
  return isObject(json) && isObject(json.schema) ? json.schema : undefined;
}

/** Adds `rules` to a body schema's `allOf`. */
function addRules(schema: Json | undefined, rules: Json[]): void {
  if (schema) schema.allOf = [...(Array.isArray(schema.allOf) ? (schema.allOf as Json[]) : []), ...rules];
}

const GRAMMAR_SCHEMA_REF = "#/components/schemas/GrammarSchema";

/**
 * The JSON Schemas `response_format` takes, as a JSON Schema: the subset the sampler's grammar honours
 * (`unsupportedJsonSchema` in `src/engine/grammars.ts` refuses the rest with a 400). One keyword picks
 * the kind (`const`, `enum`, `anyOf`, `oneOf` or `type`), and only the keywords of that kind may be
 * next to it. `$ref` into the root's `$defs` is honoured too, but not stated here: JSON Schema cannot
 * say that the name must be one of `$defs`.
 */
function grammarSchema(): Json {
  const ref = { $ref: GRAMMAR_SCHEMA_REF };
  const count = { type: "integer", minimum: 0, maximum: MAX_GRAMMAR_COUNT };
  const literal = { type: ["string", "number", "boolean", "null"] };
  // Keywords that only describe, allowed next to any kind (the grammar ignores them).
  const annotations = {
    title: { type: "string" },
    description: { type: "string" },
    $comment: { type: "string" },
    $schema: { type: "string" },
    $id: { type: "string" },
    examples: { type: "array" },
  };
  const kind = (keywords: Json): Json => ({
    type: "object",
    required: [Object.keys(keywords)[0]],
    properties: { ...keywords, ...annotations },
    additionalProperties: false,
  });
  return {
    description:
      "A JSON Schema the sampler's grammar can honour: `type`, `const`, `enum`, `oneOf`/`anyOf`, `properties` " +
      "(all written, as in OpenAI's strict mode), `required`, `additionalProperties`, `items`, `prefixItems`, " +
      "`minItems`/`maxItems`, `minLength`/`maxLength`, `minProperties`/`maxProperties` (each at most " +
      `${MAX_GRAMMAR_COUNT}), \`minimum\`/\`maximum\`/\`exclusiveMinimum\`/\`exclusiveMaximum\` for numbers and integers, ` +
      `and \`format\` ${OWN_FORMATS.reduce((text, f) => `${text}, \`${f}\``, "`date-time`, `date`, `time`")} (without ` +
      "`minLength`/`maxLength` for the last six); `$ref` into the root's `$defs` or to the root (`#`) as well. " +
      "Any other keyword is a `400`. Compiling a schema is bounded (a `400` names the bound and the count): at most " +
      `${SCHEMA_BOUNDS.enumValues} \`enum\` values and ${SCHEMA_BOUNDS.alternatives} \`oneOf\`/\`anyOf\` ` +
      `alternatives in all, ${SCHEMA_BOUNDS.subschemas} subschemas, ${SCHEMA_BOUNDS.depth} levels of nested objects ` +
      `and arrays, minimum and maximum counts adding up to ${SCHEMA_BOUNDS.repetitions}, and ` +
      `${SCHEMA_BOUNDS.literalCharacters} characters of \`enum\` and \`const\` strings and property names; a ` +
      "`$ref` counts as its definition wherever it is used.",
    anyOf: [
      kind({ const: literal }),
      kind({ enum: { type: "array", minItems: 1, items: literal } }),
      kind({ anyOf: { type: "array", minItems: 1, items: ref } }),
      kind({ oneOf: { type: "array", minItems: 1, items: ref } }),
      kind({ type: { enum: ["boolean", "null"] } }),
      kind({
        type: { enum: ["number", "integer"] },
        minimum: { type: "number" },
        maximum: { type: "number" },
        exclusiveMinimum: { type: "number" },
        exclusiveMaximum: { type: "number" },
      }),
      kind({
        type: { const: "string" },
        minLength: count,
        maxLength: count,
        format: { enum: ["date-time", "date", "time", ...OWN_FORMATS] },
      }),
      kind({
        type: { const: "object" },
        properties: { type: "object", additionalProperties: ref },
        required: { type: "array", items: { type: "string" } },
        additionalProperties: { anyOf: [{ type: "boolean" }, ref] },
        minProperties: count,
        maxProperties: count,
      }),
      kind({
        type: { const: "array" },
        items: ref,
        prefixItems: { type: "array", items: ref },
        minItems: count,
        maxItems: count,
      }),
    ],
  };
}

/** Points every `response_format.json_schema.schema` at `GrammarSchema`, keeping its description. */
function describeResponseFormats(document: Json): void {
  let found = false;
  const visit = (node: unknown): void => {
    if (Array.isArray(node)) return node.forEach(visit);
    if (!isObject(node)) return;
    const jsonSchema = isObject(node.properties) ? node.properties.json_schema : undefined;
    const inner = isObject(jsonSchema) && isObject(jsonSchema.properties) ? jsonSchema.properties : undefined;
    if (inner && isObject(inner.schema)) {
      inner.schema = { $ref: GRAMMAR_SCHEMA_REF, description: inner.schema.description };
      found = true;
    }
    for (const value of Object.values(node)) visit(value);
  };
  visit(document.paths);
  if (!found) return;
  const components = isObject(document.components) ? document.components : (document.components = {});
  const schemas = isObject(components.schemas) ? components.schemas : (components.schemas = {});
  (schemas as Json).GrammarSchema = grammarSchema();
}

/**
 * Rules of request bodies that span fields. The services check them with a message that names the field
 * (`RunService.create`, `createOpenAiJob`, the chat route), so the route's validator does not; the
 * document states them for clients.
 */
function describeRunRules(document: Json): void {
  addRules(jsonBody(document, "/conduit/finetuning", "post"), [
    {
      description: "`loraRank`, `loraAlpha` and `loraTargets` are LoRA settings: not with `method: full`.",
      if: { required: ["method"], properties: { method: { const: "full" } } },
      then: {
        not: { anyOf: ["loraRank", "loraAlpha", "loraTargets"].map((name) => ({ required: [name] })) },
      },
    },
    {
      // Both `datasetID` and `datasetId` are taken when they are the same id: JSON Schema cannot compare them.
      description:
        "The dataset: `datasetID` (or `datasetId`; both only when they name the same dataset), or `datasetName`.",
      anyOf: ["datasetID", "datasetId", "datasetName"].map((name) => ({ required: [name] })),
    },
  ]);
  // `top_logprobs` asks for alternatives to the tokens `logprobs` returns (`null` is left out).
  addRules(jsonBody(document, "/v1/chat/completions", "post"), [
    {
      description: "`top_logprobs` above 0 needs `logprobs: true`.",
      if: { required: ["top_logprobs"], properties: { top_logprobs: { type: "integer", minimum: 1 } } },
      then: { required: ["logprobs"], properties: { logprobs: { const: true } } },
    },
  ]);
  // A job's metadata keys are 64 characters at most (the service counts them; the record's schema cannot).
  const jobMetadata = jsonBody(document, "/v1/fine_tuning/jobs", "post")?.properties;
  const metadata = isObject(jobMetadata) ? jobMetadata.metadata : undefined;
  for (const branch of isObject(metadata) && Array.isArray(metadata.anyOf)
    ? (metadata.anyOf as unknown[])
    : [])
    if (isObject(branch) && branch.type === "object") branch.propertyNames = { maxLength: 64 };
  addRules(jsonBody(document, "/v1/fine_tuning/jobs", "post"), [
    {
      description:
        "The hyperparameters once: in `method.supervised.hyperparameters` or the older `hyperparameters`.",
      not: {
        required: ["hyperparameters", "method"],
        properties: {
          hyperparameters: { type: "object" },
          method: {
            type: "object",
            required: ["supervised"],
            properties: {
              supervised: {
                type: "object",
                required: ["hyperparameters"],
                properties: { hyperparameters: { type: "object" } },
              },
            },
          },
        },
      },
    },
  ]);
}

/** A TypeBox schema as plain JSON Schema (its symbols dropped). */
const plain = (schema: unknown): Json => JSON.parse(JSON.stringify(schema)) as Json;

/** `{{sample.output_text}}`, the one `input` a criterion may grade. */
const SAMPLE_OUTPUT = "^\\{\\{\\s*sample\\.output_text\\s*\\}\\}$";
/** `{{item.<field>}}`: a reference to a field of each item. */
const ITEM_REFERENCE = "^\\{\\{\\s*item\\.[A-Za-z0-9_.]+\\s*\\}\\}$";

/**
 * The eval bodies as the services check them. Their schemas on the routes are loose on purpose (a grader, a
 * testing criterion or a data source is checked field by field by the service, whose 400 names the field in its
 * own words: `graders[1].pattern`); the document states the same rules, so that clients (and the fuzzer) know
 * what is accepted. What JSON Schema cannot state (a pattern the regular expression engine refuses, a JSON
 * schema Ajv cannot compile, criteria that name different item fields, an item without the field the criteria
 * compare with) stays the service's to refuse, naming it.
 */
function describeEvalBodies(document: Json): void {
  const graders = jsonBody(document, "/conduit/evals", "post");
  const graderList = isObject(graders?.properties) ? graders.properties.graders : undefined;
  if (isObject(graderList)) graderList.items = { oneOf: Grader.anyOf.map(plain) };
  // A name that is not a string, or is empty, is no name (the grader's type names it).
  const name = {
    anyOf: [{ not: { type: "string" } }, { type: "string", maxLength: 64, pattern: noControlCharacters }],
  };
  const criterion = (type: string, properties: Json, required: string[], extra: Json = {}) => ({
    type: "object",
    required: ["type", "input", "reference", ...required],
    properties: {
      type: { const: type },
      name,
      input: { type: "string", pattern: SAMPLE_OUTPUT, description: "`{{sample.output_text}}`: the answer." },
      ...properties,
    },
    ...extra,
  });
  const labelList = {
    type: "array",
    minItems: 1,
    maxItems: judgeLimits.maxLabels,
    items: { type: "string", minLength: 1, maxLength: 256, pattern: noNul },
  };
  const judgeCriterion = (type: string, properties: Json, required: string[] = []) => ({
    type: "object",
    required: ["type", "model", "input", ...required],
    properties: {
      type: { const: type },
      name,
      model: { type: "string", minLength: 1, description: "The judge: a model this server serves you." },
      input: {
        type: "array",
        minItems: 1,
        maxItems: judgeLimits.maxMessages,
        description: "The judge's prompt, templated with `{{item.<field>}}` and `{{sample.output_text}}`.",
        items: {
          type: "object",
          required: ["role", "content"],
          properties: { role: { enum: ["system", "developer", "user", "assistant"] } },
        },
      },
      sampling_params: {
        type: "object",
        properties: {
          temperature: { type: "number", minimum: 0, maximum: 2 },
          max_completions_tokens: { type: "integer", minimum: 1, maximum: judgeLimits.maxTokens },
          top_p: { const: 1 },
          seed: { type: "integer" },
        },
        additionalProperties: false,
      },
      ...properties,
    },
  });
  const openAiEval = jsonBody(document, "/v1/evals", "post");
  if (isObject(openAiEval?.properties)) {
    openAiEval.properties.data_source_config = {
      type: "object",
      required: ["type", "item_schema"],
      properties: {
        type: { const: "custom" },
        item_schema: { type: "object", description: "The JSON Schema of an item." },
      },
      description: "`custom` items of your own schema (`logs` and `stored_completions` are refused).",
    };
    openAiEval.properties.testing_criteria = {
      type: "array",
      minItems: 1,
      maxItems: evalLimits.maxGraders,
      description:
        "Every criterion that references an item field (`{{item.<field>}}`) references the same one, each item's answer.",
      items: {
        oneOf: [
          criterion(
            "string_check",
            {
              reference: {
                type: "string",
                description:
                  "`{{item.<field>}}`, or (`like`, `ilike`) a text of 1 to 10,000 characters to look for.",
              },
              operation: { enum: ["eq", "like", "ilike"] },
            },
            ["operation"],
            {
              if: { properties: { operation: { const: "eq" } } },
              then: { properties: { reference: { pattern: ITEM_REFERENCE } } },
              else: {
                properties: {
                  reference: {
                    anyOf: [{ pattern: ITEM_REFERENCE }, { minLength: 1, maxLength: 10_000, pattern: noNul }],
                  },
                },
              },
            },
          ),
          criterion(
            "text_similarity",
            {
              reference: { type: "string", pattern: ITEM_REFERENCE },
              evaluation_metric: { enum: ["fuzzy_match", "token_f1"] },
              pass_threshold: { type: "number", minimum: 0, maximum: 1 },
            },
            ["evaluation_metric", "pass_threshold"],
          ),
          judgeCriterion("score_model", {
            range: {
              type: "array",
              prefixItems: [{ type: "number" }, { type: "number" }],
              minItems: 2,
              maxItems: 2,
              description: "`[min, max]`, min below max. Defaults to `[0, 1]`.",
            },
            pass_threshold: { type: "number", description: "Within `range`. Defaults to its middle." },
          }),
          judgeCriterion(
            "label_model",
            { labels: labelList, passing_labels: { ...labelList, description: "Each one of `labels`." } },
            ["labels", "passing_labels"],
          ),
        ],
      },
    };
  }
  const openAiRun = jsonBody(document, "/v1/evals/{eval_id}/runs", "post");
  if (isObject(openAiRun?.properties)) {
    const text = { type: "string" };
    const maxTokens = { type: "integer", minimum: 1, maximum: evalLimits.maxTokens };
    const part = { anyOf: [text, { type: "object", required: ["text"], properties: { text } }] };
    openAiRun.properties.data_source = {
      type: "object",
      required: ["type", "model", "source"],
      properties: {
        type: { const: "completions" },
        model: { type: "string", minLength: 1, description: "The model that answers." },
        source: {
          oneOf: [
            {
              type: "object",
              required: ["type", "content"],
              properties: {
                type: { const: "file_content" },
                content: {
                  type: "array",
                  minItems: 1,
                  maxItems: evalLimits.maxItems,
                  items: { type: "object", required: ["item"], properties: { item: { type: "object" } } },
                },
              },
            },
            {
              type: "object",
              required: ["type", "id"],
              properties: { type: { const: "file_id" }, id: { type: "string", minLength: 1 } },
            },
          ],
        },
        input_messages: {
          anyOf: [
            { type: "null" },
            {
              type: "object",
              required: ["type", "template"],
              properties: {
                type: { const: "template" },
                template: {
                  type: "array",
                  items: {
                    type: "object",
                    required: ["role", "content"],
                    properties: {
                      role: { enum: ["system", "developer", "user", "assistant"] },
                      content: { anyOf: [part, { type: "array", items: part }] },
                    },
                  },
                },
              },
            },
          ],
        },
        sampling_params: {
          description:
            "`max_completion_tokens` (or, when it is absent or null, `max_tokens`): the most tokens of an answer.",
          // Anything but an object is no parameters.
          anyOf: [
            { not: { type: "object" } },
            {
              type: "object",
              required: ["max_completion_tokens"],
              properties: { max_completion_tokens: maxTokens },
            },
            {
              type: "object",
              properties: {
                max_completion_tokens: { type: "null" },
                max_tokens: { anyOf: [{ type: "null" }, maxTokens] },
              },
            },
          ],
        },
      },
      description: "Answers are always greedy.",
    };
  }
}

/** The generated document, corrected (a copy: the routes keep their schemas). */
export function openApiFixes<T extends object>(generated: T): T {
  const document = structuredClone(generated) as Json;
  unrequireDefaultedParameters(document);
  unrequireDefaults(document);
  describeRunRules(document);
  describeResponseFormats(document);
  describeEvalBodies(document);
  describeLinks(document);
  return document as T;
}

/** A JSON pointer to an operation of the document (`operationRef`). */
function operationRef(path: string, method: string): string {
  return `#/paths/${path.replaceAll("~", "~0").replaceAll("/", "~1")}/${method}`;
}

/**
 * OpenAPI links: how the id in one answer feeds the next operations (a dataset's to its upload and its runs, a
 * run's to everything about it; an eval's to its runs, an eval run's to everything about it). Clients read them
 * as documentation; a stateful fuzzer (bench/schemathesis.sh) follows them from creating a dataset to uploading
 * pairs, starting a short run or an eval of the file, and reaching every run and eval-run operation.
 */
function describeLinks(document: Json): void {
  const paths = isObject(document.paths) ? document.paths : {};
  const link = (
    from: readonly [string, string],
    name: string,
    to: readonly [string, string],
    fields: Json,
  ) => {
    const operation = paths[from[0]];
    const target = paths[to[0]];
    if (
      !isObject(operation) ||
      !isObject(operation[from[1]]) ||
      !isObject(target) ||
      !isObject(target[to[1]])
    )
      return;
    const responses = (operation[from[1]] as Json).responses;
    const ok = isObject(responses) ? responses["200"] : undefined;
    if (!isObject(ok)) return;
    const links = isObject(ok.links) ? ok.links : (ok.links = {});
    (links as Json)[name] = { operationRef: operationRef(to[0], to[1]), ...fields };
  };
  const dataset = "/conduit/dataset/{dataset_id}";
  const run = "/conduit/finetuning/{finetune_id}";
  const byDataset = { parameters: { "path.dataset_id": "$response.body#/id" } };
  for (const [name, to] of [
    ["GetDataset", [dataset, "get"]],
    ["RenameDataset", [dataset, "patch"]],
    ["DeleteDataset", [dataset, "delete"]],
    ["ListFiles", [`${dataset}/files`, "get"]],
  ] as const)
    link(["/conduit/dataset", "post"], name, to, byDataset);
  link(["/conduit/dataset", "post"], "UploadPairs", [`${dataset}/upload`, "post"], {
    ...byDataset,
    requestBody: { name: "pairs.jsonl", ioPairs: [{ input: "ping", output: "pong" }] },
  });
  const byFile = {
    parameters: { "path.dataset_id": "$response.body#/datasetID", "path.file_id": "$response.body#/id" },
  };
  for (const [name, to] of [
    ["GetFile", [`${dataset}/file/{file_id}`, "get"]],
    ["FilePairs", [`${dataset}/file/{file_id}/pairs`, "get"]],
    ["DeleteFile", [`${dataset}/file/{file_id}`, "delete"]],
  ] as const)
    link([`${dataset}/upload`, "post"], name, to, byFile);
  // A run of two steps on the dataset the file went into, on the server's default model.
  link([`${dataset}/upload`, "post"], "StartRun", ["/conduit/finetuning", "post"], {
    requestBody: { datasetID: "$response.body#/datasetID", steps: 2 },
  });
  const byRun = { parameters: { "path.finetune_id": "$response.body#/id" } };
  for (const [name, to] of [
    ["GetRun", [run, "get"]],
    ["RunEvents", [`${run}/events`, "get"]],
    ["RunExamples", [`${run}/examples`, "get"]],
    ["RunArtifact", [`${run}/artifact`, "get"]],
    ["RunInference", [`${run}/inference`, "post"]],
    ["CancelRun", [`${run}/cancel`, "post"]],
    ["DeleteRun", [run, "delete"]],
  ] as const)
    link(["/conduit/finetuning", "post"], name, to, byRun);
  // Evals: a new eval to its runs (the run names its models), a new eval run to everything about it. An upload's
  // file is an eval's source too.
  const evalPath = "/conduit/evals/{eval_id}";
  const byEval = { parameters: { "path.eval_id": "$response.body#/id" } };
  for (const [name, to] of [
    ["GetEval", [evalPath, "get"]],
    ["StartEvalRun", [`${evalPath}/runs`, "post"]],
    ["ListEvalRuns", [`${evalPath}/runs`, "get"]],
    ["DeleteEval", [evalPath, "delete"]],
  ] as const)
    link(["/conduit/evals", "post"], name, to, byEval);
  link([`${dataset}/upload`, "post"], "EvalOfFile", ["/conduit/evals", "post"], {
    requestBody: {
      source: { type: "file", fileId: "$response.body#/id" },
      graders: [{ type: "exact_match" }],
    },
  });
  const evalRun = `${evalPath}/runs/{run_id}`;
  const byEvalRun = {
    parameters: { "path.eval_id": "$response.body#/evalId", "path.run_id": "$response.body#/id" },
  };
  for (const [name, to] of [
    ["GetEvalRun", [evalRun, "get"]],
    ["EvalRunEvents", [`${evalRun}/events`, "get"]],
    ["EvalRunResults", [`${evalRun}/results`, "get"]],
    ["CancelEvalRun", [`${evalRun}/cancel`, "post"]],
    ["DeleteEvalRun", [evalRun, "delete"]],
  ] as const)
    link([`${evalPath}/runs`, "post"], name, to, byEvalRun);
  const openAiEval = "/v1/evals/{eval_id}";
  for (const [name, to] of [
    ["RetrieveEval", [openAiEval, "get"]],
    ["UpdateEval", [openAiEval, "post"]],
    ["CreateEvalRun", [`${openAiEval}/runs`, "post"]],
    ["ListOpenAiEvalRuns", [`${openAiEval}/runs`, "get"]],
    ["DeleteOpenAiEval", [openAiEval, "delete"]],
  ] as const)
    link(["/v1/evals", "post"], name, to, byEval);
  const openAiEvalRun = `${openAiEval}/runs/{run_id}`;
  const byOpenAiRun = {
    parameters: { "path.eval_id": "$response.body#/eval_id", "path.run_id": "$response.body#/id" },
  };
  for (const [name, to] of [
    ["RetrieveEvalRun", [openAiEvalRun, "get"]],
    ["CancelOpenAiEvalRun", [openAiEvalRun, "post"]],
    ["OutputItems", [`${openAiEvalRun}/output_items`, "get"]],
    ["DeleteOpenAiEvalRun", [openAiEvalRun, "delete"]],
  ] as const)
    link([`${openAiEval}/runs`, "post"], name, to, byOpenAiRun);
  // The OpenAI face: a job's id to what is asked of the job.
  const job = "/v1/fine_tuning/jobs/{fine_tuning_job_id}";
  const byJob = { parameters: { "path.fine_tuning_job_id": "$response.body#/id" } };
  for (const [name, to] of [
    ["RetrieveJob", [job, "get"]],
    ["JobEvents", [`${job}/events`, "get"]],
    ["CancelJob", [`${job}/cancel`, "post"]],
  ] as const)
    link(["/v1/fine_tuning/jobs", "post"], name, to, byJob);
}
