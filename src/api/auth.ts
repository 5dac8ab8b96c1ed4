import type { FastifyInstance, FastifyRequest } from "fastify";
import { ConduitError } from "../errors.ts";
import type { KeyRepository } from "../store/KeyRepository.ts";

declare module "fastify" {
  interface FastifyRequest {
    /** The owner of the API key that authenticated this request. */
    userId: string;
  }
  interface FastifyContextConfig {
    /** Routes marked public skip the API key check (health, docs, dashboard assets). */
    public?: boolean;
  }
}

/** The key from `x-api-key`, or `Authorization: Token <key>` / `Bearer <key>`. */
export function apiKeyOf(request: FastifyRequest): string | undefined {
  const header = request.headers["x-api-key"];
  if (typeof header === "string" && header.trim() !== "") return header.trim();
  const authorization = request.headers.authorization;
  const match = authorization?.match(/^(?:Token|Bearer)\s+(\S+)\s*$/i);
  return match?.[1];
}

/** Every route needs a valid key unless its config says `public: true`. */
export function registerAuth(app: FastifyInstance, keys: KeyRepository): void {
  app.decorateRequest("userId", "");
  app.addHook("onRequest", async (request) => {
    if (request.routeOptions.config.public) return;
    // Unknown routes fall through to the 404 handler only for authenticated callers, so route
    // names are not an oracle for anonymous ones.
    const key = apiKeyOf(request);
    if (!key)
      throw new ConduitError(
        "unauthorized",
        "missing API key: send `x-api-key: <key>` or `Authorization: Token <key>`",
      );
    const found = await keys.authenticate(key);
    if (!found) throw new ConduitError("unauthorized", "invalid API key");
    request.userId = found.userId;
  });
}
