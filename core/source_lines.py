"""Where each key and block of an HCL file stands, so semantic errors can name a line.

python-hcl2 8.x ignores ``with_meta`` (issue #291), so this scans the source text itself. It only has to
be right for text python-hcl2 already parsed; on constructs it does not model (interpolations with
nested quotes, say) it degrades to an enclosing block's line, never to an exception.

A path names a place the way the policy reader walks the parsed document: block name and labels, then
keys, e.g. ``("resource_group", "gpu", "utilization", "thresholds", "cuda_util")``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

Path = tuple[str, ...]

_TOKENS = re.compile(
    r"""
    (?P<newline>\n)
  | (?P<space>[ \t\r]+)
  | (?P<comment>(?:\#|//)[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<heredoc><<-?(?P<marker>[A-Za-z_]\w*)[^\n]*\n.*?^[ \t]*(?P=marker)[ \t]*$)
  | (?P<string>"(?:[^"\\\n]|\\.)*")
  | (?P<name>[A-Za-z_][\w-]*)
  | (?P<punct>[{}\[\]=:,])
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL | re.MULTILINE,
)
_LIST_ITEM = "[]"


@dataclass
class SourceLines:
    keys: dict[Path, list[int]] = field(default_factory=dict)
    """Attribute path -> the lines it is assigned on (more than one: a duplicate)."""
    blocks: dict[Path, list[int]] = field(default_factory=dict)
    """Block path (name + labels) -> the lines of its headers."""

    def line_of(self, path: Path, occurrence: int = 0) -> int | None:
        """The line of ``path`` (its ``occurrence``-th appearance), else of the closest place that encloses it."""
        for length in range(len(path), 0, -1):
            prefix = path[:length]
            exact = self.keys.get(prefix) or self.blocks.get(prefix)
            if exact:
                return exact[min(occurrence, len(exact) - 1)]
            # a block asked for without its label: the first block of that name
            below = [lines[0] for p, lines in (*self.keys.items(), *self.blocks.items()) if p[:length] == prefix]
            if below:
                return min(below)
        return None

    def duplicate_keys(self) -> Iterator[tuple[Path, int]]:
        """Each attribute assigned twice in one body, with the line of its second assignment, in file order."""
        repeats = [(path, lines[1]) for path, lines in self.keys.items() if len(lines) > 1]
        return iter(sorted(repeats, key=lambda item: item[1]))


def scan(text: str) -> SourceLines:
    found = SourceLines()
    scopes: list[Path] = [()]
    header: list[tuple[str, int]] = []  # names and labels since the statement began
    assigned: str | None = None  # the key whose value comes next
    line = 1
    for match in _TOKENS.finditer(text):
        kind, token = match.lastgroup, match.group()
        if kind in ("name", "string"):
            if assigned is None:
                header.append((_unquote(token) if kind == "string" else token, line))
            assigned = None
        elif token in ("=", ":") and kind == "punct" and header:
            assigned = header[-1][0]
            found.keys.setdefault(scopes[-1] + (assigned,), []).append(header[-1][1])
            header = []
        elif token in ("{", "[") and kind == "punct":
            scopes.append(_opened(found, scopes[-1], token, assigned, header))
            header, assigned = [], None
        elif kind in ("newline", "punct", "other"):
            if token in ("}", "]") and len(scopes) > 1:
                scopes.pop()
            header, assigned = [], None
        line += token.count("\n")
    return found


def _opened(found: SourceLines, scope: Path, bracket: str, assigned: str | None, header: list[tuple[str, int]]) -> Path:
    if assigned is not None:  # `key = {` / `key = [`: the value of an attribute
        return scope + (assigned,)
    if bracket == "{" and header:  # `name "label" {`: a block
        path = scope + tuple(name for name, _ in header)
        found.blocks.setdefault(path, []).append(header[0][1])
        return path
    return scope + (_LIST_ITEM,)  # an element of a list


def _unquote(token: str) -> str:
    try:
        return str(json.loads(token))
    except ValueError:  # an HCL escape JSON lacks; the raw text is close enough to locate
        return token[1:-1]
