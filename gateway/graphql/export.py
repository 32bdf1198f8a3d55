"""Writes the schema's SDL to ``gateway/graphql/schema.graphql``, which is committed so that changes show in review.

.venv/bin/python -m gateway.graphql.export           # regenerate
.venv/bin/python -m gateway.graphql.export --check   # exit 1 if the committed file is stale
"""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.graphql.schema import schema

SCHEMA_FILE = Path(__file__).with_name("schema.graphql")
COMMAND = ".venv/bin/python -m gateway.graphql.export"


def sdl() -> str:
    return schema.as_str() + "\n"


def main(argv: list[str]) -> int:
    if "--check" in argv:
        if not SCHEMA_FILE.exists() or SCHEMA_FILE.read_text() != sdl():
            print(f"{SCHEMA_FILE} is stale; regenerate it with: {COMMAND}", file=sys.stderr)
            return 1
        return 0
    SCHEMA_FILE.write_text(sdl())
    print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
