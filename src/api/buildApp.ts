import Fastify, { type FastifyBaseLogger, type FastifyInstance } from "fastify";
import swagger from "@fastify/swagger";
import swaggerUi from "@fastify/swagger-ui";
import { Ajv } from "ajv";
import type { Core } from "../core.ts";
import { ConduitError } from "../errors.ts";
import { jsonTooLarge } from "./uploadSource.ts";
import { parseJsonBody, type ParsedJsonBody } from "./jsonBody.ts";
import { JsonParserThread } from "./JsonParserThread.ts";
import { registerAuth } from "./auth.ts";
import { ConnectionGuard } from "./connections.ts";
import { openApiFixes } from "./openApiDocument.ts";
import { registerErrorHandler } from "./errorHandler.ts";
import { sharedSchemas } from "../contract/schemas.ts";
import { registerSerializer } from "./serializer.ts";
import { registerSse } from "./sse.ts";
import { registerStreamLimit } from "./streamLimit.ts";
import datasetRoutes from "./conduit/datasets.ts";
import healthRoutes from "./routes/health.ts";
import runRoutes from "./conduit/runs.ts";
import adapterRoutes from "./conduit/adapters.ts";
import evalRoutes from "./conduit/evals.ts";
import openAiEvalRoutes from "./openai/evals.ts";
import generationRoutes from "./conduit/generation.ts";
import openAiRoutes from "./openai/generation.ts";
import openAiFileRoutes from "./openai/files.ts";
import openAiFineTuningRoutes from "./openai/fineTuning.ts";
import metricsRoutes from "./routes/metrics.ts";
import uiRoutes from "./routes/ui.ts";

/**
 * Assembles the HTTP app: plugins, the auth hook, the error handler and every route group,
 * listed here in one place. `server.ts` only listens; tests call this and `inject`.
 */
export async function buildApp(core: Core): Promise<FastifyInstance> {
  const connections = new ConnectionGuard(core.config);
  const app = Fastify({
    loggerInstance: core.log as FastifyBaseLogger,
    bodyLimit: core.config.bodyLimit,
    // Request ids in logs; users see them in the `x-request-id` header.
    genReqId: () => crypto.randomUUID(),
    ...connections.serverOptions(),
  });
  registerJsonParser(app, core.config.bodyLimit);
  registerEmptyBodies(app);
  registerValidators(app);
  registerSecurityHeaders(app);
  registerErrorHandler(app);
  connections.register(app);
  registerAuth(app, core.keys, core.config.maxKeyFailures);
  registerSse(app);
  registerStreamLimit(app, core.config.maxStreamsPerUser);
  await registerDocs(app);

  await app.register(metricsRoutes, { core });
  await app.register(healthRoutes, { core });
  await app.register(datasetRoutes, { core });
  await app.register(runRoutes, { core });
  await app.register(generationRoutes, { core });
  await app.register(adapterRoutes, { core });
  await app.register(openAiRoutes, { core });
  await app.register(openAiFileRoutes, { core });
  await app.register(openAiFineTuningRoutes, { core });
  await app.register(evalRoutes, { core });
  await app.register(openAiEvalRoutes, { core });
  await app.register(uiRoutes, { core });

  app.addHook("onClose", async () => core.close());
  return app;
}

/**
 * Bodies up to this size are parsed on the event loop (a millisecond or less); bigger ones in a worker thread
 * (`JsonParserThread`), which costs a round trip but holds the loop only to take the value back.
 */
const INLINE_JSON_BYTES = 64 * 1024;

/** JSON bodies: UTF-8 text only, within the JSON limit, no lone surrogates; an empty one is no body. */
function registerJsonParser(app: FastifyInstance, bodyLimit: number): void {
  // JSON endpoints take JSON: a text/plain body is a 415, not a string that fails the schema.
  // (The upload route accepts text/plain as a raw file with a parser of its own.)
  app.removeContentTypeParser("text/plain");
  const thread = new JsonParserThread();
  app.addHook("onClose", async () => thread.dispose());
  app.removeContentTypeParser("application/json");
  app.addContentTypeParser("application/json", { parseAs: "buffer" }, (request, body, done) => {
    // A JSON body is UTF-8 text: one that says it is in another charset would be misread, so it is refused.
    const charset = /;\s*charset\s*=\s*"?([^";\s]+)/i.exec(request.headers["content-type"] ?? "")?.[1];
    if (charset !== undefined && !/^utf-?8$/i.test(charset)) {
      done(
        new ConduitError(
          "unsupported_media_type",
          `a JSON body must be UTF-8 text; Content-Type says charset=${charset}`,
        ),
        undefined,
      );
      return;
    }
    // Parsing takes the whole body: a JSON body gets the JSON limit even where the route takes more (see limitJsonUploads).
    if ((body as Buffer).length > bodyLimit) {
      done(jsonTooLarge(bodyLimit), undefined);
      return;
    }
    // An empty body is no body (OpenAI's clients send `Content-Type: application/json` with nothing on
    // cancel and delete): the operation's schema decides whether it needs one (registerEmptyBodies).
    if ((body as Buffer).every((byte) => byte === 0x20 || byte === 0x09 || byte === 0x0a || byte === 0x0d)) {
      done(null, undefined);
      return;
    }
    const settle = (parsed: ParsedJsonBody) => {
      if ("value" in parsed) done(null, parsed.value);
      else
        done(
          new ConduitError(parsed.error.code, parsed.error.message, { param: parsed.error.param }),
          undefined,
        );
    };
    if ((body as Buffer).length <= INLINE_JSON_BYTES) settle(parseJsonBody(body as Buffer));
    else thread.parse(body as Buffer).then(settle, (error: unknown) => done(error as Error, undefined));
  });
}

/** A missing body: `{}` where every field is optional, else a 400 naming the required fields. */
function registerEmptyBodies(app: FastifyInstance): void {
  // No body where the operation's fields are all optional is the empty object, as in OpenAI's API.
  // No body where fields are required is a 400 naming them.
  app.addHook("preValidation", (request, _reply, done) => {
    const schema = request.routeOptions.schema?.body;
    if (request.body === undefined && schema !== undefined) {
      const required = requiredFields(schema);
      if (required === undefined || required.length === 0) {
        // Only an empty JSON body: a request without one keeps `undefined` (an upload's handler says how to send one).
        if (request.headers["content-type"]?.split(";")[0]?.trim().toLowerCase() === "application/json")
          request.body = {};
      } else {
        done(
          new ConduitError(
            "invalid_request",
            `the body is empty; this operation takes a JSON object with ${required.map((f) => `"${f}"`).join(", ")}`,
            { param: required[0] },
          ),
        );
        return;
      }
    }
    done();
  });
}

/** Schema validation: strict for bodies, coercing for query strings and params; the shared schemas known to both. */
function registerValidators(app: FastifyInstance): void {
  // Bodies are validated strictly (no type coercion, unknown fields are errors where a schema
  // forbids them); query strings and path params need coercion because they arrive as text.
  const bodyAjv = new Ajv({
    coerceTypes: false,
    useDefaults: true,
    removeAdditional: false,
    allErrors: false,
    strict: false,
  });
  const textAjv = new Ajv({
    coerceTypes: true,
    useDefaults: true,
    removeAdditional: false,
    allErrors: false,
    strict: false,
  });
  for (const schema of sharedSchemas) {
    bodyAjv.addSchema(schema);
    textAjv.addSchema(schema);
  }
  app.setValidatorCompiler(({ schema, httpPart, contentType }) => {
    // A body of another media type (an upload's multipart or raw file) is read and checked by its
    // handler as it streams; its schema only documents it.
    if (httpPart === "body" && contentType !== undefined && contentType !== "application/json")
      return () => true;
    return httpPart === "body" ? bodyAjv.compile(schema) : textAjv.compile(schema);
  });
  for (const schema of sharedSchemas) app.addSchema(schema);
  registerSerializer(app, sharedSchemas);
}

/** Headers every answer carries: the request id, no sniffing, no framing of our pages. */
function registerSecurityHeaders(app: FastifyInstance): void {
  // First of the hooks, so that every answer carries it (errors keep the headers set before them); the
  // framework's own errors, which come before any hook, set it in `frameworkErrors`.
  app.addHook("onRequest", (request, reply, done) => {
    void reply.header("x-request-id", request.id);
    done();
  });
  // No answer is sniffed into another type, and no page of ours is framed (clickjacking): a page without a
  // policy of its own gets one that loads nothing.
  app.addHook("onSend", (_request, reply, payload, done) => {
    void reply.header("x-content-type-options", "nosniff");
    if (String(reply.getHeader("content-type") ?? "").startsWith("text/html")) {
      void reply.header("x-frame-options", "DENY");
      if (!reply.hasHeader("content-security-policy"))
        void reply.header("content-security-policy", "default-src 'none'; frame-ancestors 'none'");
    }
    done(null, payload);
  });
}

/** The OpenAPI document (`/openapi.json`) and its docs page (`/docs`), both public. */
async function registerDocs(app: FastifyInstance): Promise<void> {
  await app.register(swagger, {
    // 3.1: its schemas are JSON Schema 2020-12, as TypeBox writes them (numeric `exclusiveMinimum`, `examples`).
    transformObject: (generated) =>
      openApiFixes("openapiObject" in generated ? generated.openapiObject : generated.swaggerObject),
    openapi: {
      openapi: "3.1.0",
      info: {
        title: "Conduit",
        version: "0.1.0",
        description:
          "Self-hosted LLM inference and fine-tuning. Authenticate with `x-api-key: <key>` or `Authorization: Token <key>` (or `Bearer`).",
      },
      components: {
        securitySchemes: {
          apiKey: { type: "apiKey", in: "header", name: "x-api-key" },
          token: {
            type: "apiKey",
            in: "header",
            name: "Authorization",
            description: "`Token <key>` or `Bearer <key>`",
          },
        },
      },
      security: [{ apiKey: [] }, { token: [] }],
    },
  });
  // The docs page is public like the OpenAPI document it renders.
  app.addHook("onRoute", (route) => {
    if (route.url.startsWith("/docs")) route.config = { ...(route.config as object), public: true };
  });
  await app.register(swaggerUi, {
    routePrefix: "/docs",
    uiConfig: { docExpansion: "list" },
    // Swagger UI's own files only: its styles are set inline, nothing else is.
    staticCSP: [
      "default-src 'self'",
      "img-src 'self' data:",
      "style-src 'self' 'unsafe-inline'",
      "script-src 'self'",
      "script-src-attr 'none'",
      "object-src 'none'",
      "base-uri 'self'",
      "frame-ancestors 'none'",
      "form-action 'self'",
    ].join("; "),
  });

  app.get("/openapi.json", { config: { public: true }, schema: { hide: true } }, async () => app.swagger());
}

/**
 * The fields an object body schema requires (empty when all are optional: then no body means `{}`), or
 * undefined for a schema that is not a plain object (its own validation speaks).
 */
function requiredFields(schema: unknown): string[] | undefined {
  if (typeof schema !== "object" || schema === null) return undefined;
  const { type, required } = schema as { type?: unknown; required?: unknown };
  if (type !== "object") return undefined;
  return Array.isArray(required) ? required.filter((f): f is string => typeof f === "string") : [];
}
