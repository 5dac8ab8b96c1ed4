import type { FastifyInstance } from "fastify";
import fp from "fastify-plugin";
import { Counter, Gauge, Registry, collectDefaultMetrics } from "prom-client";
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

/** Upper bounds of the request latency histogram's buckets, in seconds. */
const LATENCY_BUCKETS = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60];

interface RouteCounts {
  labels: { method: string; route: string };
  byStatus: Map<number, number>;
  /** Requests per latency bucket (not cumulative); the last one is above every bound. */
  buckets: number[];
  sum: number;
  count: number;
}

/**
 * HTTP requests by method, route and status, and their latency, counted in plain maps and turned into
 * Prometheus metrics only when scraped: prom-client's labelled counter and histogram cost a small GET
 * about 3 µs of its ~50 (bench/api.ts), on every request. Registers duck-typed metrics that prom-client's
 * registry renders like its own.
 */
class HttpStats {
  private readonly routes = new Map<string, RouteCounts>();

  constructor(registry: Registry) {
    // What prom-client's registry calls on a metric: `get` (scrapes) and `reset` (`registry.resetMetrics()`).
    const reset = () => this.routes.clear();
    registry.registerMetric({
      name: "conduit_http_requests_total",
      reset,
      get: () => ({
        name: "conduit_http_requests_total",
        help: "HTTP requests by method, route and status",
        type: "counter",
        aggregator: "sum",
        values: [...this.routes.values()].flatMap((r) =>
          [...r.byStatus].map(([status, value]) => ({ labels: { ...r.labels, status }, value })),
        ),
      }),
    } as never);
    registry.registerMetric({
      name: "conduit_http_request_duration_seconds",
      reset,
      get: () => ({
        name: "conduit_http_request_duration_seconds",
        help: "HTTP request latency (streamed responses are not counted)",
        type: "histogram",
        aggregator: "sum",
        values: [...this.routes.values()].flatMap((r) => {
          let below = 0;
          const name = "conduit_http_request_duration_seconds";
          return [
            ...r.buckets.map((n, i) => ({
              metricName: `${name}_bucket`,
              labels: { le: LATENCY_BUCKETS[i] ?? "+Inf", ...r.labels },
              value: (below += n),
            })),
            { metricName: `${name}_sum`, labels: r.labels, value: r.sum },
            { metricName: `${name}_count`, labels: r.labels, value: r.count },
          ];
        }),
      }),
    } as never);
  }

  record(method: string, route: string, status: number, seconds: number): void {
    const key = `${method} ${route}`;
    let counts = this.routes.get(key);
    if (!counts) {
      counts = {
        labels: { method, route },
        byStatus: new Map(),
        buckets: new Array<number>(LATENCY_BUCKETS.length + 1).fill(0),
        sum: 0,
        count: 0,
      };
      this.routes.set(key, counts);
    }
    counts.byStatus.set(status, (counts.byStatus.get(status) ?? 0) + 1);
    let bucket = 0;
    while (bucket < LATENCY_BUCKETS.length && seconds > LATENCY_BUCKETS[bucket]!) bucket++;
    counts.buckets[bucket]!++;
    counts.sum += seconds;
    counts.count++;
  }
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
  const http = new HttpStats(registry);
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
    "conduit_embedding_tokens_total",
    "Tokens evaluated by finished embedding requests",
    () => stats().embeddingTokens,
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
    http.record(
      request.method,
      request.routeOptions.url ?? "unmatched",
      reply.statusCode,
      reply.elapsedTime / 1000,
    );
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
