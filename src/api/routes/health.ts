import type { FastifyInstance } from "fastify";
import { Type } from "@sinclair/typebox";
import type { Core } from "../../core.ts";

/** Liveness and readiness without auth: the database answers. */
export default async function healthRoutes(app: FastifyInstance, { core }: { core: Core }) {
  app.get(
    "/healthz",
    {
      config: { public: true },
      schema: {
        tags: ["service"],
        summary: "Health check (no auth)",
        response: { 200: Type.Object({ status: Type.Literal("ok"), database: Type.String() }) },
      },
    },
    async () => {
      await core.keys.count();
      return { status: "ok" as const, database: core.db.dialect };
    },
  );
}
