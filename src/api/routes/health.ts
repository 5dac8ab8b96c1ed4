import type { FastifyInstance } from "fastify";
import { Type, type TObject } from "@sinclair/typebox";
import type { Core } from "../../core.ts";
import { TRAINER_SETTINGS } from "../../domain/runs.ts";
import { GPU_SETTINGS } from "../../contract/accelerator.ts";
import { trainersInOrder } from "../../train/trainers.ts";
import { responses } from "../../contract/schemas.ts";

const Health = Type.Object({
  status: Type.Union([Type.Literal("ok"), Type.Literal("degraded")], {
    description:
      "`degraded`: the service answers, but something needs an operator's attention (see `warnings`), e.g. the disk is nearly full.",
  }),
  database: Type.String({ description: "`sqlite` or `postgres`." }),
  disk: Type.Object(
    {
      freeBytes: Type.Integer({
        description: "Bytes still free for the server on the data directory's disk.",
      }),
      totalBytes: Type.Integer(),
      minFreeBytes: Type.Integer({
        description: "`CONDUIT_MIN_FREE_BYTES`: below it the status is `degraded`.",
      }),
    },
    { description: "The disk of the data directory (database, uploads, run artifacts)." },
  ),
  accelerator: Type.Object(
    {
      setting: Type.Union(
        GPU_SETTINGS.map((s) => Type.Literal(s)),
        { description: "`CONDUIT_GPU` as set." },
      ),
      backend: Type.Union(
        [Type.Literal("cpu"), Type.Literal("cuda"), Type.Literal("vulkan"), Type.Literal("metal")],
        {
          description: "What generation runs on: `cpu` when no GPU is used.",
        },
      ),
      devices: Type.Array(Type.String(), { description: "GPU device names (empty on the CPU)." }),
      gpuLayers: Type.Union([Type.Literal("all"), Type.Integer({ minimum: 0 })], {
        description: "Layers each model offloads to the GPU (`0` on the CPU).",
      }),
      gpuMemory: Type.Optional(
        Type.Object(
          { totalBytes: Type.Integer(), usedBytes: Type.Integer(), freeBytes: Type.Integer() },
          { description: "The GPUs' memory, summed over devices (absent on the CPU)." },
        ),
      ),
      adapters: Type.Optional(
        Type.Union(
          [
            Type.Object({
              batching: Type.Literal("per-sequence"),
              build: Type.String({
                description: "The mixed-adapter build in use, its node-llama-cpp and llama.cpp.",
              }),
            }),
            Type.Object({
              batching: Type.Literal("grouped"),
              reason: Type.String({ description: "Why the mixed-adapter build is not in use." }),
            }),
          ],
          {
            description:
              "How generations of different LoRA adapters share a decode (`CONDUIT_ADAPTER_BATCHING`): `per-sequence`, " +
              "one decode for any mix (the mixed-adapter build, `npm run setup:adapters`), or `grouped`, one decode per " +
              "adapter in use each token step.",
          },
        ),
      ),
    },
    { description: "The compute backend of generation and training (`CONDUIT_GPU`)." },
  ),
  trainers: Type.Object(
    {
      setting: Type.Union(
        TRAINER_SETTINGS.map((s) => Type.Literal(s)),
        { description: "`CONDUIT_TRAINER` as set." },
      ),
      ...trainerHealthSchemas(),
    },
    {
      description:
        "Which trainers this server can fine-tune with; a run's `config.trainer` says which one it got.",
    },
  ),
  warnings: Type.Optional(Type.Array(Type.String(), { description: "Why the status is `degraded`." })),
});

function mib(bytes: number): string {
  return `${Math.floor(bytes / 2 ** 20)} MiB`;
}

/** Each trainer's block of `/healthz` under its name, from the trainers' registry. */
function trainerHealthSchemas(): Record<string, TObject> {
  return Object.fromEntries(trainersInOrder().map((trainer) => [trainer.name, trainer.health.schema]));
}

/** Liveness and readiness without auth: the database answers, and the data directory's disk has room. */
export default async function healthRoutes(app: FastifyInstance, { core }: { core: Core }) {
  app.get(
    "/healthz",
    {
      config: { public: true },
      schema: {
        tags: ["service"],
        summary: "Health check (no auth)",
        security: [],
        description:
          "200 while the service answers: `ok`, or `degraded` with `warnings` when the data directory's disk has less " +
          "than `CONDUIT_MIN_FREE_BYTES` free (writes may soon answer 507). 503 with `Retry-After` while the database does not " +
          "answer (a restart, a lost connection): the server keeps running and answers again once it is back.",
        response: responses({ 200: Health }, []),
      },
    },
    async () => {
      await core.keys.count();
      const { freeBytes, totalBytes } = await core.disk();
      const minFreeBytes = core.config.minFreeBytes;
      const warnings =
        freeBytes < minFreeBytes
          ? [
              `the data directory's disk has ${mib(freeBytes)} free, less than CONDUIT_MIN_FREE_BYTES ` +
                `(${mib(minFreeBytes)}): uploads and training may soon fail with 507 insufficient_storage`,
            ]
          : [];
      const accelerator = await core.engine.accelerator();
      return {
        status: warnings.length > 0 ? ("degraded" as const) : ("ok" as const),
        database: core.db.dialect,
        disk: { freeBytes, totalBytes, minFreeBytes },
        accelerator,
        trainers: {
          setting: core.config.trainer,
          ...Object.fromEntries(
            trainersInOrder().map((trainer) => [trainer.name, trainer.health.now(core.trainerHost)]),
          ),
        },
        ...(warnings.length > 0 ? { warnings } : {}),
      };
    },
  );
}
