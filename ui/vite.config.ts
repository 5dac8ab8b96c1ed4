import { fileURLToPath } from "node:url";
import { defineConfig } from "vite";
import preact from "@preact/preset-vite";

/**
 * The dashboard, served by the Conduit server under `/ui/` (src/api/routes/ui.ts). Built into
 * `ui/dist` by `npm run build:ui`; `vite ui` serves it with hot reload and forwards API calls.
 */
export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  base: "/ui/",
  plugins: [preact()],
  build: {
    outDir: "dist",
    emptyOutDir: true,
    // Served by our own server only: no CDN, no external fonts, nothing else to reach.
    assetsInlineLimit: 0,
    chunkSizeWarningLimit: 200,
  },
  server: {
    // `vite ui` during development: API calls go to a local `npm start`.
    proxy: { "/conduit": "http://127.0.0.1:8080", "/healthz": "http://127.0.0.1:8080" },
  },
});
