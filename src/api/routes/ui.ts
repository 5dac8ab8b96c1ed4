import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import type { FastifyInstance, FastifyReply } from "fastify";
import fastifyStatic from "@fastify/static";
import type { Core } from "../../core.ts";

export interface UiOptions {
  core?: Core;
  /** The built dashboard (`npm run build:ui`). Defaults to `ui/dist` in the project. */
  distDir?: string;
}

const defaultDistDir = fileURLToPath(new URL("../../../ui/dist/", import.meta.url));

/**
 * The page may talk to this server only: no CDN, fonts or third-party calls. Inline styles are
 * allowed because uPlot sizes its canvas with them.
 */
const contentSecurityPolicy = [
  "default-src 'self'",
  "img-src 'self' data:",
  "style-src 'self' 'unsafe-inline'",
  "object-src 'none'",
  "base-uri 'none'",
  "frame-ancestors 'none'",
  "form-action 'self'",
].join("; ");

/** A request under /ui for a file (hashed asset, icon), rather than a page of the single-page app. */
const fileRequest = /(^|\/)assets\/|\.[a-z0-9]+$/i;

/**
 * The web dashboard under `/ui`, built by Vite into `ui/dist`. The routes are public: the page's
 * own API calls carry the key. Any page path (`/ui/runs/ft_…`) answers index.html and the app
 * routes in the browser; without a build, `/ui` explains how to make one.
 */
export default async function uiRoutes(app: FastifyInstance, options: UiOptions = {}) {
  const distDir = options.distDir ?? defaultDistDir;
  const indexFile = path.join(distDir, "index.html");
  // Checked per request, so building the dashboard needs no restart.
  await app.register(fastifyStatic, { root: distDir, serve: false, suppressWarning: true });

  const page = (reply: FastifyReply) => {
    void reply
      .header("content-security-policy", contentSecurityPolicy)
      .header("x-content-type-options", "nosniff")
      .header("referrer-policy", "no-referrer");
    if (!fs.existsSync(indexFile))
      return reply
        .code(503)
        .type("text/html; charset=utf-8")
        .header("cache-control", "no-store")
        .send(notBuiltPage);
    return reply.header("cache-control", "no-cache").sendFile("index.html", { cacheControl: false });
  };

  const config = { public: true };
  const schema = { hide: true };
  // The server's root is the dashboard, for whoever opens the address the banner shows.
  app.get("/", { config, schema }, async (_request, reply) => reply.redirect("/ui", 302));
  app.get("/ui", { config, schema }, async (_request, reply) => page(reply));
  app.get<{ Params: { "*": string } }>("/ui/*", { config, schema }, async (request, reply) => {
    const file = request.params["*"];
    if (!fileRequest.test(file) || file === "index.html") return page(reply);
    void reply.header("x-content-type-options", "nosniff");
    // Vite puts a content hash in every asset name, so they never change.
    return file.startsWith("assets/")
      ? reply.sendFile(file, { immutable: true, maxAge: "365d" })
      : reply.sendFile(file, { maxAge: 0 });
  });
}

const notBuiltPage = `<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>Conduit dashboard not built</title></head>
<body style="font-family: system-ui, sans-serif; max-width: 40rem; margin: 4rem auto; padding: 0 1rem; line-height: 1.5">
<h1>The dashboard is not built</h1>
<p>This server has no built dashboard (<code>ui/dist</code> is missing). In the project folder, run</p>
<pre><code>npm run build:ui</code></pre>
<p>then reload this page. The API itself works without it.</p>
</body>
</html>
`;
