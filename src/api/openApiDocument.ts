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

/**
 * Rules of a run's body that span fields. The service checks them with a message that names the field
 * (`RunService.create`), so the route's validator does not; the document states them for clients.
 */
function describeRunRules(document: Json): void {
  const paths = isObject(document.paths) ? document.paths : {};
  const create = paths["/conduit/finetuning"];
  const post = isObject(create) ? create.post : undefined;
  const body = isObject(post) ? post.requestBody : undefined;
  const content = isObject(body) ? body.content : undefined;
  const json = isObject(content) ? content["application/json"] : undefined;
  const schema = isObject(json) ? json.schema : undefined;
  if (!isObject(schema)) return;
  schema.allOf = [
    {
      description: "`loraRank`, `loraAlpha` and `loraTargets` are LoRA settings: not with `method: full`.",
      if: { required: ["method"], properties: { method: { const: "full" } } },
      then: {
        not: { anyOf: ["loraRank", "loraAlpha", "loraTargets"].map((name) => ({ required: [name] })) },
      },
    },
    {
      description: "The dataset: `datasetID` (or `datasetId`), or `datasetName`.",
      anyOf: ["datasetID", "datasetId", "datasetName"].map((name) => ({ required: [name] })),
    },
  ];
}

/** The generated document, corrected (a copy: the routes keep their schemas). */
export function openApiFixes<T extends object>(generated: T): T {
  const document = structuredClone(generated) as Json;
  unrequireDefaultedParameters(document);
  unrequireDefaults(document);
  describeRunRules(document);
  return document as T;
}
