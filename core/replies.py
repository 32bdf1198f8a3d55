"""Redis replies as the types Caravan reads them: text, not ``bytes | str``.

Every client Caravan makes (``core.redis.client``) decodes responses, so Redis answers in ``str``; redis-py types its
replies for either setting (``bytes | str``, and stream and pipeline replies loosely). The typing is done here, once:
a store passes a reply through one of these functions instead of casting at the call site. Each checks what it is
given and decodes bytes as UTF-8 (as the client would), so a client made without ``decode_responses`` still reads
right rather than comparing bytes with text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from redis.asyncio.client import Pipeline
from redis.typing import StreamRangeResponse, XReadResponse, ZSetRangeResponse

__all__ = [
    "StreamEntries",
    "begin",
    "optional_text",
    "optional_texts",
    "ranked",
    "stream_entries",
    "stream_reads",
    "text",
    "text_hash",
    "text_set",
    "texts",
]

StreamEntries = list[tuple[str, dict[str, str]]]
"""A stream's entries in order: ``(entry id, fields)``."""


def text(reply: bytes | str) -> str:
    """One string reply (a member, a field, a value)."""
    return reply if isinstance(reply, str) else reply.decode()


def optional_text(reply: bytes | str | None) -> str | None:
    """A reply that is missing (``None``) when the key or field does not exist (GET, HGET)."""
    return None if reply is None else text(reply)


def texts(reply: Iterable[bytes | str]) -> list[str]:
    """A list reply, in order (LRANGE)."""
    return [text(item) for item in reply]


def ranked(reply: ZSetRangeResponse) -> list[str]:
    """A sorted-set range asked without scores, in rank order (ZRANGE, ZREVRANGE, ZRANGEBYSCORE)."""
    return [_member(item) for item in reply]


def _member(item: bytes | str | tuple[bytes | str, Any] | list[Any]) -> str:
    if isinstance(item, (bytes, str)):
        return text(item)
    raise TypeError("a sorted-set range with scores: read it without WITHSCORES")


def optional_texts(reply: Iterable[bytes | str | None]) -> list[str | None]:
    """A list reply with a ``None`` per missing key or field, in the order asked (MGET, HMGET)."""
    return [optional_text(item) for item in reply]


def text_set(reply: Iterable[bytes | str]) -> set[str]:
    """A set reply (SMEMBERS, SUNION, SINTER)."""
    return {text(item) for item in reply}


def text_hash(reply: Mapping[bytes | str, bytes | str]) -> dict[str, str]:
    """A hash reply (HGETALL): empty when the key does not exist."""
    return {text(field): text(value) for field, value in reply.items()}


def stream_entries(reply: StreamRangeResponse | None) -> StreamEntries:
    """An XRANGE reply (``None`` or empty when there are no entries)."""
    return [(_entry_id(entry_id), text_hash(fields or {})) for entry_id, fields in reply or ()]


def stream_reads(reply: XReadResponse | None) -> list[tuple[str, StreamEntries]]:
    """An XREAD reply: per stream that had new entries, ``(stream, entries)``, in the order Redis gave them.

    In RESP2, which Caravan's clients speak, the reply is ``[[stream, entries], ...]``."""
    if isinstance(reply, Mapping):
        raise TypeError("an XREAD reply in RESP3 form: Caravan's Redis clients speak RESP2")
    return [(text(stream), stream_entries(entries)) for stream, entries in reply or ()]


def _entry_id(reply: bytes | str | None) -> str:
    if reply is None:  # only XCLAIM-like replies have entries without an id; XRANGE and XREAD never do
        raise ValueError("a stream entry without an id")
    return text(reply)


def begin(pipe: Pipeline) -> None:
    """Start the MULTI of a WATCHed pipeline: the commands queued from here run as one transaction on ``execute``."""
    pipe.multi()  # type: ignore[no-untyped-call]  # redis-py: redis.asyncio.client.Pipeline.multi is unannotated
