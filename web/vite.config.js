// Builds the web UI into dist/, served by the gateway under /ui/ (gateway/web.py). Hashed asset names under
// dist/assets/ are cached for a year; index.html is never cached.
import { defineConfig } from "vite";
import preact from "@preact/preset-vite";

export default defineConfig({
  base: "/ui/",
  plugins: [preact()],
  build: { outDir: "dist", assetsDir: "assets", sourcemap: false, target: "es2020", chunkSizeWarningLimit: 600 },
});
