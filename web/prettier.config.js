// The web UI's one format (checked by ops/lint: `prettier --check .`; applied with `npx prettier --write .`):
// Prettier's defaults but for the line length, 120 columns as the Python side (ruff).
export default { printWidth: 120 };
