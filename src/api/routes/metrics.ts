import type { FastifyInstance } from "fastify";
import fp from "fastify-plugin";
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import type { Core } from "../../core.ts";
import { ConduitError } from "../../errors.ts";
import { responses } from "../../contract/schemas.ts";

/** A counter that mirrors a running total kept elsewhere (the engine's stats). */
function mirroredCounter(registry: Registry, name: string, help: string, read: () => number) {
  let seen = 0;
  return new Counter({
    name,
    help,
    registers: [registry],
    collect() {
      const now = read();
      if (now > seen) this.inc(now - seen);
      seen = now;
    },
  });
}

/**
 * `GET /metrics`: Prometheus text format. The counters cover every tenant, so only the keys of the
 * users in `CONDUIT_METRICS_USERS` may read them. Not encapsulated (fastify-plugin): its onResponse
 * hook must see every route registered after it.
 */
export default fp(metricsPlugin, { name: "conduit-metrics" });

async function metricsPlugin(app: FastifyInstance, { core }: { core: Core }) {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: "conduit_" });
  const requests = new Counter({
    name: "conduit_http_requests_total",
    help: "HTTP requests by method, route and status",
    labelNames: ["method", "route", "status"],
    registers: [registry],
  });
  const latency = new Histogram({
    name: "conduit_http_request_duration_seconds",
    help: "HTTP request latency (streamed responses are not counted)",
    labelNames: ["method", "route"],
    buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60],
    registers: [registry],
  });
  const stats = () => core.engine.stats();
  mirroredCounter(
    registry,
    "conduit_generated_tokens_total",
    "Completion tokens generated",
    () => stats().completionTokens,
  );
  mirroredCounter(
    registry,
    "conduit_prompt_tokens_total",
    "Prompt tokens of finished generations (cached ones included)",
    () => stats().promptTokens,
  );
  mirroredCounter(
    registry,
    "conduit_cached_prompt_tokens_total",
    "Prompt tokens reused from the KV cache (a prefix shared with an earlier request) instead of evaluated",
    () => stats().cachedPromptTokens,
  );
  mirroredCounter(
    registry,
    "conduit_generations_total",
    "Generations finished",
    () => stats().completedGenerations,
  );
  mirroredCounter(
    registry,
    "conduit_rejected_generations_total",
    "Generations refused because the queue was full",
    () => stats().rejectedRequests,
  );
  const gauge = (name: string, help: string, read: () => number) =>
    new Gauge({
      name,
      help,
      registers: [registry],
      collect() {
        this.set(read());
      },
    });
  gauge(
    "conduit_queue_depth",
    "Generations waiting for a sequence or a model load",
    () => stats().queueDepth,
  );
  gauge("conduit_active_generations", "Generations running now", () => stats().activeGenerations);
  gauge(
    "conduit_loaded_models",
    "Servable models held in memory (a base and each LoRA adapter on it count one each)",
    () => stats().loadedModels,
  );
  gauge(
    "conduit_loaded_base_models",
    "Distinct model weights held in memory (LoRA adapters share their base)",
    () => stats().loadedBases,
  );

  // A callback hook: it runs after every request and has nothing to wait for.
  app.addHook("onResponse", (request, reply, done) => {
    const route = request.routeOptions.url ?? "unmatched";
    requests.inc({ method: request.method, route, status: String(reply.statusCode) });
    latency.observe({ method: request.method, route }, reply.elapsedTime / 1000);
    done();
  });

  app.get(
    "/metrics",
    {
      schema: {
        tags: ["service"],
        summary: "Prometheus metrics",
        description: "For the keys of the users in `CONDUIT_METRICS_USERS`; any other key is a 403.",
        response: {
          ...responses({}, [401, 403]),
          200: {
            description: "Prometheus text exposition format.",
            content: { "text/plain": { schema: { type: "string" } } },
          },
        },
      },
    },
    async (request, reply) => {
      const allowed = core.config.metricsUsers;
      if (!allowed.includes("*") && !allowed.includes(request.userId))
        throw new ConduitError(
          "forbidden",
          `metrics are for operators: user "${request.userId}" is not in CONDUIT_METRICS_USERS`,
        );
      void reply.header("content-type", registry.contentType);
      return registry.metrics();
    },
  );
}
