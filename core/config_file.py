"""The one reader of Caravan's HCL configuration files: the scheduler configuration (``domain.scheduling_config``) and
the idle policy (``domain.idle.policy_file``) are read, checked and refused alike.

A refused file is a :class:`ConfigFileError` that reads ``file:line: key.path: reason`` (``-`` for the line when no
line is to blame): a syntax error gives lark's line and column, any other error the line of the key it names
(:mod:`core.source_lines`), a key assigned twice the line of its second assignment. Interpolation (``${…}``,
``%{…}``) is refused everywhere: a configuration file holds values, not expressions.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path as FilePath
from typing import Any

import hcl2
from hcl2 import SerializationOptions
from lark.exceptions import LarkError, UnexpectedInput

from core.source_lines import Path, scan


class ConfigFileError(ValueError):
    """A configuration file that cannot be used; ``line`` is 1-based, or None when no line is to blame."""

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        super().__init__(f"{path}:{line if line is not None else '-'}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


def read_text(path: str | os.PathLike[str], error: type[ConfigFileError] = ConfigFileError) -> str:
    """The file's text; ``error`` when it cannot be read or is not UTF-8."""
    name = os.fspath(path)
    try:
        return FilePath(name).read_text(encoding="utf-8")
    except OSError as exc:
        raise error(name, None, f"cannot read the file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise error(name, None, f"not UTF-8 text: {exc.reason}") from exc


def parse_hcl(
    text: str, path: str, error: type[ConfigFileError] = ConfigFileError, *, strip_quotes: bool = False
) -> dict[str, Any]:
    """python-hcl2's reading of ``text`` (``strip_quotes``: strings without their quotes), syntax errors refused with
    their line and column."""
    options = SerializationOptions(with_comments=False, strip_string_quotes=strip_quotes)
    try:
        doc: dict[str, Any] = hcl2.loads(text, serialization_options=options)
    except UnexpectedInput as exc:
        line = exc.line if exc.line > 0 else text.count("\n") + 1  # lark says -1 at the end of input
        raise error(path, line, f"syntax error at column {exc.column}: {first_line(exc)}") from exc
    except (LarkError, ValueError) as exc:
        raise error(path, None, f"syntax error: {first_line(exc)}") from exc
    return doc


def first_line(exc: Exception) -> str:
    """An error's first line, without the position lark repeats there (the error carries it already)."""
    text = str(exc).strip()
    return re.sub(r" at line \d+, column \d+\.?$", "", text.splitlines()[0]) if text else type(exc).__name__


def attributes(body: Mapping[str, Any]) -> dict[str, Any]:
    """A block's keys without python-hcl2's markers (``__is_block__``, ``__comments__`` …): the operator's keys."""
    return {key: value for key, value in body.items() if not (key.startswith("__") and key.endswith("__"))}


def shown(value: object) -> str:
    """A value as an error message shows it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, Mapping):
        return "a block or object"
    return "null" if value is None else str(value)


def has_interpolation(value: object) -> bool:
    return isinstance(value, str) and ("${" in value or "%{" in value)


class ConfigReader:
    """The base of a file's reader: walks python-hcl2's (or JSON's) document and names the line of what is wrong."""

    error: type[ConfigFileError] = ConfigFileError

    def __init__(self, path: str, text: str | None) -> None:
        """``text``: the HCL source, for line numbers (None: a JSON file or a decoded mapping, no lines)."""
        self.path = path
        self.lines = scan(text) if text is not None else None

    def fail(self, where: Path, reason: str, occurrence: int = 0) -> ConfigFileError:
        line = self.lines.line_of(where, occurrence) if self.lines is not None else None
        return self.error(self.path, line, f"{'.'.join(where)}: {reason}" if where else reason)

    def duplicates(self) -> Iterator[ConfigFileError]:
        """A key assigned more than once (python-hcl2 keeps the last silently): one error per such key."""
        if self.lines is not None:
            for where, line in self.lines.duplicate_keys():
                yield self.error(self.path, line, f"{'.'.join(where)}: assigned more than once")

    def known_keys(self, body: Mapping[str, Any], where: Path, allowed: tuple[str, ...]) -> None:
        for key in attributes(body):
            if key not in allowed:
                raise self.fail((*where, key), f"unknown key (expected one of: {', '.join(allowed)})")

    def mapping(self, value: Any, where: Path) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected a block or object, got {shown(value)}")
        return value
