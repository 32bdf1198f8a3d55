// After `vite build`: a gzip copy of each text asset next to it (name.gz), which the gateway sends to browsers that
// accept gzip (gateway/web.py), so no response is compressed on the fly.
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { gzipSync, constants } from "node:zlib";

const dir = new URL("./dist/assets/", import.meta.url);
for (const name of readdirSync(dir)) {
  if (!/\.(js|css|svg)$/.test(name)) continue;
  const body = readFileSync(new URL(name, dir));
  writeFileSync(new URL(`${name}.gz`, dir), gzipSync(body, { level: constants.Z_BEST_COMPRESSION }));
}
