"""The one encoder through which every string reaches a rendered job, and the HCL writer around it.

python-hcl2 8.x writes string values verbatim (quotes, ``${``, ``%{``, backslashes and newlines
included), so a user string written raw could close its quotes and add blocks to the job.
:func:`literal` makes any Python string into an HCL string literal that reads back as exactly
that string and can carry no interpolation or directive; :func:`to_hcl` applies it to every
string in a value tree, so no caller can forget.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import hcl2

# '"' is written as \u0022, not \": python-hcl2 8.1.4's writer strips a '"' at the edge of the
# text it splits around "$${...}", which would turn \" into a dangling backslash.
_ESCAPES = {"\\": "\\\\", '"': "\\u0022", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def literal(text: str) -> str:
    """``text`` as a quoted HCL string literal whose value is ``text``, byte for byte."""
    out: list[str] = []
    for ch in text:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    # Template sequences are escaped by doubling their lead character: "$${" reads as "${".
    return '"' + "".join(out).replace("${", "$${").replace("%{", "%%{") + '"'


def runtime_text(text: str) -> str:
    """Text for a value Nomad evaluates again as a template when the task starts (task ``config``).

    The client re-reads driver config as HCL templates, so ``${``/``%{`` must be escaped once more
    for the value to arrive as written; :func:`literal` then encodes the result for the job source.
    """
    return text.replace("${", "$${").replace("%{", "%%{")


def identifier(name: str) -> str:
    """An attribute or block name; these cannot be quoted, so only a plain identifier passes."""
    if not _IDENTIFIER.match(name):
        raise ValueError(f"not an HCL identifier: {name!r}")
    return name


def to_hcl(value: Any) -> Any:
    """A Python value as python-hcl2 Builder input, every string encoded by :func:`literal`."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        return literal(value)
    if isinstance(value, Mapping):
        return {literal(str(k)): to_hcl(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [to_hcl(v) for v in value]
    raise TypeError(f"cannot render {type(value).__name__} into HCL")


class Block:
    """An HCL block under construction: attributes, then nested blocks, in order."""

    def __init__(self, block_type: str, *labels: str, **attributes: Any) -> None:
        self.type = identifier(block_type)
        self.labels = labels
        self.attributes: dict[str, Any] = {}
        self.children: list[Block] = []
        self.set(**attributes)

    def set(self, **attributes: Any) -> Block:
        for name, value in attributes.items():
            if value is not None:
                self.attributes[identifier(name)] = value
        return self

    def block(self, block_type: str, *labels: str, **attributes: Any) -> Block:
        child = Block(block_type, *labels, **attributes)
        self.children.append(child)
        return child

    def _build_into(self, parent: hcl2.Builder) -> None:
        encoded = {name: to_hcl(value) for name, value in self.attributes.items()}
        builder = parent.block(self.type, labels=[literal(label) for label in self.labels], **encoded)
        for child in self.children:
            child._build_into(builder)


def render(*top_level: Block) -> str:
    """HCL text of the given top-level blocks."""
    root = hcl2.Builder()
    for block in top_level:
        block._build_into(root)
    return str(hcl2.dumps(root.build()))  # type: ignore[no-untyped-call]  # python-hcl2: Builder.build is unannotated
