import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import {
  ConduitError,
  DATABASE_RETRY_AFTER_S,
  errorCatalog,
  inFaceNames,
  isDatabaseUnavailable,
  isOutOfSpace,
  OUT_OF_SPACE,
  type ErrorCode,
} from "../errors.ts";
import { patternReasons, REASON } from "../contract/patterns.ts";
import { conduitFields } from "./conduit/errorFields.ts";
import { openAiFields } from "./openai/errorFields.ts";

/** An error's body; `url`, the request's: its face's table names the field at fault (the Conduit API's without). */
export function errorBody(error: ConduitError, url?: string) {
  const named = inFaceNames(error, url?.startsWith("/v1/") ? openAiFields : conduitFields);
  const entry = errorCatalog[named.code];
  return { error: { message: named.message, type: entry.type, param: named.param, code: named.code } };
}

interface ValidationIssue {
  instancePath: string;
  schemaPath: string;
  keyword: string;
  message?: string;
  params: Record<string, unknown>;
}

/**
 * The allowed values when a value failed a union of constants (TypeBox's union of literals: one
 * `const` issue per branch, then `anyOf`), so the 400 lists them instead of "must be equal to constant".
 */
function unionOfConstants(issues: ValidationIssue[], instancePath: string): unknown[] | undefined {
  const at = issues.filter((i) => i.instancePath === instancePath);
  const union = at.find((i) => i.keyword === "anyOf");
  if (!union) return undefined;
  const prefix = `${union.schemaPath}/`;
  const branch = (i: ValidationIssue) =>
    i.schemaPath.startsWith(prefix) ? i.schemaPath.slice(prefix.length).split("/")[0] : undefined;
  const branches = new Set(at.map(branch).filter((b) => b !== undefined));
  const constants = at.filter((i) => i.keyword === "const");
  if (constants.length === 0 || new Set(constants.map(branch)).size !== branches.size) return undefined;
  return constants.map((i) => i.params.allowedValue);
}

/**
 * The constants a value could have been instead, when it failed a union of a type and constants
 * (a number or `"auto"`): the type's issue comes first, and "must be number" alone would hide `"auto"`.
 */
function alternativeConstants(issues: ValidationIssue[], instancePath: string): unknown[] | undefined {
  const at = issues.filter((i) => i.instancePath === instancePath);
  if (!at.some((i) => i.keyword === "anyOf")) return undefined;
  const constants = at.filter((i) => i.keyword === "const").map((i) => i.params.allowedValue);
  return constants.length > 0 ? constants : undefined;
}

function isSchema(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null;
}

/**
 * The innermost `REASON` on the failing issue's schema path, with how many segments of the
 * instance path lead to the field that has it (`properties` and `items` step into the value;
 * `anyOf` and the like do not).
 */
function schemaReason(schema: unknown, schemaPath: string): { depth: number; reason: string } | undefined {
  const steps = schemaPath
    .replace(/^#\/?/, "")
    .split("/")
    .map((s) => s.replaceAll("~1", "/").replaceAll("~0", "~"));
  let node = schema;
  let depth = 0;
  let found: { depth: number; reason: string } | undefined;
  for (let i = 0; i < steps.length && isSchema(node); i++) {
    const step = steps[i] as string;
    if (step === "properties" || step === "patternProperties") {
      node = (node[step] as Record<string, unknown> | undefined)?.[steps[++i] ?? ""];
      depth++;
    } else if (step === "items" || step === "additionalProperties") {
      node = node[step];
      depth++;
    } else if (step === "anyOf" || step === "oneOf" || step === "allOf") {
      node = (node[step] as unknown[] | undefined)?.[Number(steps[++i])];
    } else if (step === "if" || step === "then" || step === "else") {
      node = node[step];
    } else break;
    if (isSchema(node) && typeof node[REASON] === "string") found = { depth, reason: node[REASON] };
  }
  return found;
}

/**
 * The issue that says what is wrong. Ajv reports a union's branches in order, so a value of the second branch's
 * type (five `stop` strings in a list) first shows the first branch's type mismatch ("must be string"); the
 * branch whose type matched says more ("must NOT have more than 4 items"), so a type issue gives way to
 * another issue at the same place or deeper.
 */
function telling(issues: ValidationIssue[]): ValidationIssue | undefined {
  const first = issues[0];
  if (first?.keyword !== "type") return first;
  const within = (path: string) => path === first.instancePath || path.startsWith(`${first.instancePath}/`);
  return (
    issues.find((i) => within(i.instancePath) && !["type", "anyOf", "oneOf", "const"].includes(i.keyword)) ??
    issues.find((i) => i.keyword === "type" && i.instancePath.startsWith(`${first.instancePath}/`)) ??
    first
  );
}

/** The schema node at an Ajv `schemaPath` (`#/properties/source/anyOf`), if it leads to one. */
function schemaAt(schema: unknown, schemaPath: string): unknown {
  let node = schema;
  for (const step of schemaPath.replace(/^#\/?/, "").split("/").filter(Boolean)) {
    if (!isSchema(node)) return undefined;
    node = (node as Record<string, unknown>)[step.replaceAll("~1", "/").replaceAll("~0", "~")];
  }
  return node;
}

/** The value at an Ajv `instancePath` (`/source/items/3`) of the data validated. */
function valueAt(data: unknown, instancePath: string): unknown {
  let value = data;
  for (const step of instancePath.split("/").filter(Boolean)) {
    if (!isSchema(value)) return undefined;
    value = (value as Record<string, unknown>)[step.replaceAll("~1", "/").replaceAll("~0", "~")];
  }
  return value;
}

/**
 * A tagged union's issues narrowed to the branch its value's tag names. Ajv tries every branch of an `anyOf` and
 * reports each one's first issue in order, so `source: {type: "items", items: []}` would first show the `file`
 * branch's "fileId is required". When the branches are objects told apart by a property with a constant in each
 * (`type`), and the value's tag matches one of them, only that branch's issues are kept: "source.items must NOT
 * have fewer than 1 items".
 */
function taggedBranch(issues: ValidationIssue[], schema: unknown, data: unknown): ValidationIssue[] {
  for (const union of issues.filter((i) => i.keyword === "anyOf" || i.keyword === "oneOf")) {
    const branches = schemaAt(schema, union.schemaPath);
    const value = valueAt(data, union.instancePath);
    if (!Array.isArray(branches) || !isSchema(value)) continue;
    const constants = (branch: unknown) => {
      const properties = isSchema(branch) ? branch.properties : undefined;
      return isSchema(properties) ? properties : {};
    };
    const tags = Object.keys(constants(branches[0])).filter((key) =>
      branches.every((b) => {
        const property = (constants(b) as Record<string, unknown>)[key];
        return isSchema(property) && "const" in property;
      }),
    );
    for (const tag of tags) {
      const chosen = branches.findIndex(
        (b) => ((constants(b) as Record<string, unknown>)[tag] as { const: unknown }).const === value[tag],
      );
      if (chosen < 0) continue;
      const inUnion = `${union.schemaPath}/`;
      const inChosen = `${union.schemaPath}/${chosen}/`;
      const kept = issues.filter(
        (i) => i !== union && (!i.schemaPath.startsWith(inUnion) || i.schemaPath.startsWith(inChosen)),
      );
      if (kept.length > 0) return kept;
    }
  }
  return issues;
}

/** Turns an Ajv validation failure into a 400 naming the field. */
function fromValidation(
  allIssues: ValidationIssue[],
  context: string | undefined,
  schema?: unknown,
  data?: unknown,
): ConduitError {
  const issues = taggedBranch(allIssues, schema, data);
  const issue = telling(issues);
  const where = context === "querystring" ? "query" : (context ?? "body");
  if (!issue) return new ConduitError("invalid_request", `invalid ${where}`);
  const segments = issue.instancePath.split("/").filter(Boolean);
  const explained = schemaReason(schema, issue.schemaPath);
  if (explained) segments.splice(explained.depth);
  else if (issue.keyword === "required") segments.push(String(issue.params.missingProperty));
  else if (issue.keyword === "additionalProperties") segments.push(String(issue.params.additionalProperty));
  const param = segments.length > 0 ? segments.join(".") : null;
  const subject = param ? `${where === "body" ? "" : `${where} `}field "${param}"` : where;
  if (explained) return new ConduitError("invalid_request", `${subject} ${explained.reason}`, { param });
  let reason = issue.message ?? "is invalid";
  if (issue.keyword === "required") reason = "is required";
  if (issue.keyword === "additionalProperties") reason = "is not a known field";
  if (issue.keyword === "pattern") reason = patternReasons[String(issue.params.pattern)] ?? reason;
  if (issue.keyword === "type" && segments.length === 0) reason = `must be ${String(issue.params.type)}`;
  const alternatives =
    issue.keyword === "type" ? alternativeConstants(issues, issue.instancePath) : undefined;
  if (alternatives)
    reason = `must be ${String(issue.params.type)} or ${alternatives.map((v) => JSON.stringify(v)).join(" or ")}`;
  const allowed = unionOfConstants(issues, issue.instancePath);
  if (allowed) reason = `must be one of ${allowed.map((v) => JSON.stringify(v)).join(", ")}`;
  return new ConduitError("invalid_request", `${subject} ${reason}`.trim(), { param });
}

/** Fastify's own 4xx errors, mapped into the catalog. */
const fastifyCodes: Record<string, ErrorCode> = {
  FST_ERR_CTP_EMPTY_JSON_BODY: "invalid_json",
  FST_ERR_CTP_INVALID_JSON_BODY: "invalid_json",
  FST_ERR_CTP_BODY_TOO_LARGE: "payload_too_large",
  FST_ERR_CTP_INVALID_MEDIA_TYPE: "unsupported_media_type",
  FST_ERR_CTP_INVALID_CONTENT_LENGTH: "invalid_request",
  FST_REQ_FILE_TOO_LARGE: "payload_too_large",
  FST_FILES_LIMIT: "invalid_request",
  FST_INVALID_MULTIPART_CONTENT_TYPE: "unsupported_media_type",
  FST_ERR_MAX_PARAM_LENGTH: "uri_too_long",
  FST_ERR_BAD_URL: "invalid_request",
};

/** Messages of our own where Fastify's would echo the request back (a 100 KB path, say). */
const fastifyMessages: Record<string, string> = {
  FST_ERR_MAX_PARAM_LENGTH: "a path segment is longer than 1024 characters",
  FST_ERR_BAD_URL: "the path is not a valid URL (a bad percent-encoding)",
};

/**
 * A catalog error for anything thrown while serving a request, or `undefined` for an unexpected one.
 * `schemas` are the route's, so a validation failure can give the `REASON` of the field it is in.
 */
/** A body schema given per media type (an upload's): its JSON form, the only one the route validates. */
function jsonForm(schema: unknown): unknown {
  const content = (schema as { content?: Record<string, { schema?: unknown }> } | undefined)?.content;
  return content?.["application/json"]?.schema ?? schema;
}

export function toConduitError(
  error: unknown,
  schemas?: Record<string, unknown>,
  request?: FastifyRequest,
): ConduitError | undefined {
  if (error instanceof ConduitError) return error;
  if (isOutOfSpace(error)) return new ConduitError("insufficient_storage", OUT_OF_SPACE, { cause: error });
  if (isDatabaseUnavailable(error))
    return new ConduitError(
      "unavailable",
      "the database is unavailable; retry after the Retry-After seconds",
      { retryAfter: DATABASE_RETRY_AFTER_S, cause: error },
    );
  const fastifyError = error as FastifyError & { validationContext?: string };
  if (fastifyError.validation)
    return fromValidation(
      fastifyError.validation as ValidationIssue[],
      fastifyError.validationContext,
      jsonForm(fastifyError.validationContext ? schemas?.[fastifyError.validationContext] : undefined),
      validatedPart(request, fastifyError.validationContext),
    );
  const code = fastifyError.code ? fastifyCodes[fastifyError.code] : undefined;
  if (code) {
    const message =
      fastifyMessages[fastifyError.code] ??
      (code === "invalid_json"
        ? "the body is not valid JSON"
        : code === "unsupported_media_type"
          ? `unsupported Content-Type; this endpoint accepts ${fastifyError.message.includes("multipart") ? "multipart/form-data" : "application/json"}`
          : fastifyError.message);
    return new ConduitError(code, message);
  }
  if (
    typeof fastifyError.statusCode === "number" &&
    fastifyError.statusCode >= 400 &&
    fastifyError.statusCode < 500
  ) {
    const status = fastifyError.statusCode;
    const mapped = (Object.keys(errorCatalog) as ErrorCode[]).find((c) => errorCatalog[c].status === status);
    return new ConduitError(mapped ?? "invalid_request", fastifyError.message);
  }
  return undefined;
}

/** The part of a request a validation failure is about (its body, query string, params or headers). */
function validatedPart(request: FastifyRequest | undefined, context: string | undefined): unknown {
  if (request === undefined) return undefined;
  if (context === "querystring") return request.query;
  if (context === "params") return request.params;
  if (context === "headers") return request.headers;
  return request.body;
}

/** The one error handler: a catalog error becomes its JSON body; anything else is a logged 500. */
export function registerErrorHandler(app: FastifyInstance): void {
  // Every route's method and path pattern, so that a path served for other methods is a 405.
  const table: Route[] = [];
  const notFound = notFoundHandler(table);
  app.addHook("onRoute", (route) => {
    for (const method of [route.method].flat()) table.push({ method, path: pathPattern(route.url) });
  });

  app.setErrorHandler((error: unknown, request: FastifyRequest, reply: FastifyReply) => {
    // The connection is gone: the client left, or a timeout answered and closed it.
    if (reply.raw.destroyed) {
      request.log.info({ err: error }, "request ended with its connection closed");
      return;
    }
    // No route: what its body was like does not matter (a key that is missing or wrong still does).
    if (request.is404 && !(error instanceof ConduitError)) return notFound(request, reply);
    let conduitError = toConduitError(
      error,
      request.routeOptions.schema as Record<string, unknown> | undefined,
      request,
    );
    if (conduitError && isDatabaseUnavailable(error))
      request.log.warn(
        { code: (error as { code?: unknown }).code },
        `request answered 503: the database is unavailable (${(error as Error).message})`,
      );
    else if (!conduitError || conduitError.status >= 500) {
      request.log.error({ err: error }, "request failed");
      conduitError ??= new ConduitError("internal_error", "internal server error");
    }
    if (conduitError.retryAfter !== undefined)
      void reply.header("retry-after", String(conduitError.retryAfter));
    return reply.status(conduitError.status).send(errorBody(conduitError, request.url));
  });

  app.setNotFoundHandler((request, reply) => notFound(request, reply));
}

interface Route {
  method: string;
  path: RegExp;
}

function pathPattern(url: string): RegExp {
  const escaped = url.replace(/[.+?^${}()|[\]\\]/g, "\\$&");
  return new RegExp(`^${escaped.replace(/:[^/]+/g, "[^/]+").replace(/\*/g, ".*")}$`);
}

/** Answers a request no route took: a 405 naming the methods its path takes, else a 404. */
function notFoundHandler(routes: Route[]) {
  return (request: FastifyRequest, reply: FastifyReply) => {
    const path = request.url.split("?")[0] ?? "/";
    const allowed = [
      ...new Set(
        routes
          .filter((route) => route.method !== request.method && route.path.test(path))
          .map((route) => route.method),
      ),
    ];
    if (allowed.length > 0) {
      const error = new ConduitError(
        "method_not_allowed",
        `${request.method} is not allowed on ${path}; it takes ${allowed.join(", ")}`,
      );
      return reply.status(405).header("allow", allowed.join(", ")).send(errorBody(error));
    }
    const error = new ConduitError("not_found", `no route ${request.method} ${path}`);
    return reply.status(404).send(errorBody(error));
  };
}
