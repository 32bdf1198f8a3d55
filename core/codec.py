"""Stored documents to JSON and back: the one codec for what Caravan keeps in Redis (msgspec).

:func:`encode` writes a document, :func:`decode` reads one as a given type. The type is the schema: a dataclass
(sessions, users, templates, presets, policies, the idle checker's reports and windows, events) or a list, dict or
tuple of such values, with enums (by value), datetimes, tuples, ``X | None`` and defaults. msgspec builds the
dataclasses straight from the JSON, checking every field's type on the way, which is what makes reading many
sessions at once cheap (measured by ``bench/idle`` and ``bench/gateway``: bench/README.md).

Compatibility, both ways:

* **Older documents** read as before: a field a document lacks (written before the field existed) takes its default;
  a field without a default is required.
* **Newer documents** read too: fields the type does not know are ignored, so a rolled-back Caravan reads what a
  newer one wrote.
* **The JSON written is the JSON the models wrote before the codec** (``json.dumps`` of the same fields): the same
  keys in the same order, enums by value, tuples as arrays, moments as RFC 3339 (UTC with a trailing ``Z``,
  microseconds only when not zero). Two differences, both read by any JSON reader: it is always compact (users,
  templates, presets and policies had spaces after ``,`` and ``:``), and text outside ASCII (and DEL) is written as
  UTF-8 rather than ``\\uXXXX`` escapes. Numbers keep their value; a float far from 1 may change notation
  (``6.1e-05`` then, ``0.000061`` now). Moments are written in the zone they carry; ``core.clock`` makes every moment
  Caravan holds UTC.
* **Lone surrogates** (``"\\ud800"``: JSON allows them, so a client can send them, but UTF-8 cannot hold them) take
  the slow path both ways, as the standard library writes and reads them: a document holding one is written with
  ASCII escapes, exactly as before the codec, and read back as it was.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import msgspec

T = TypeVar("T")


class MalformedDocument(ValueError):
    """A stored document that is not JSON of the type asked for (the message names the type and the path)."""


_ENCODER = msgspec.json.Encoder()
_DECODERS: dict[Any, msgspec.json.Decoder[Any]] = {}
"""One decoder per type, made on first use (a decoder compiles its type once)."""


def encode(document: object) -> bytes:
    """``document`` as compact JSON (UTF-8)."""
    try:
        return _ENCODER.encode(document)
    except UnicodeEncodeError:  # a lone surrogate: escaped, as json.dumps always did
        return json.dumps(msgspec.to_builtins(document), separators=(",", ":")).encode()


def decode(data: str | bytes, kind: type[T]) -> T:
    """The document ``data`` as a ``kind``; :class:`MalformedDocument` if it is not one."""
    decoder: msgspec.json.Decoder[T] | None = _DECODERS.get(kind)
    if decoder is None:
        decoder = _DECODERS[kind] = msgspec.json.Decoder(kind)
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:
        try:  # msgspec refuses escaped lone surrogates, which json.dumps wrote and json.loads reads
            converted: T = msgspec.convert(json.loads(data), kind)
        except (ValueError, msgspec.ValidationError):
            raise MalformedDocument(f"malformed {_name(kind)} document: {exc}") from exc
        return converted


def _name(kind: Any) -> str:
    return getattr(kind, "__name__", None) or str(kind)
