"""Policy-file durations: seconds as a number, or a string such as ``"30s"``, ``"10m"``, ``"1h30m"``, ``"1d"``."""

from __future__ import annotations

import math
import re

from core.errors import InvalidInput

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_WHOLE = re.compile(r"(?:\d+(?:\.\d+)?[smhd])+|\d+(?:\.\d+)?")


def parse_duration(value: object) -> float:
    """Seconds; ``ValueError`` (with a reason fit for an error message) for anything else or a negative value."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f'expected a duration such as "10m" or a number of seconds, got {value!r}')
    if isinstance(value, str):
        return _parse_text(value)
    if not math.isfinite(value):
        raise ValueError(f"duration must be finite, got {value!r}")
    if value < 0:
        raise ValueError(f"duration must not be negative, got {value!r}")
    return float(value)


def _parse_text(text: str) -> float:
    compact = text.strip().replace(" ", "")
    if compact.startswith("-"):
        raise ValueError(f"duration must not be negative, got {text!r}")
    if not _WHOLE.fullmatch(compact):
        raise ValueError(f'invalid duration {text!r}: use a number with a unit s, m, h or d, such as "90s" or "1h30m"')
    if not compact[-1].isalpha():
        return float(compact)
    return float(sum(float(number) * UNIT_SECONDS[unit] for number, unit in _PART.findall(compact)))


def duration_input(field: str, value: str | None, *, minimum: float = 0.0, maximum: float = math.inf) -> float | None:
    """A duration a user gave for ``field``, in seconds (``None`` stays ``None``); INVALID_INPUT naming the field when
    it does not parse or lies outside ``minimum``..``maximum``."""
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise InvalidInput(f"{field}: {exc}", field=field) from exc
    if not minimum <= seconds <= maximum:
        bound = f"at least {minimum:g}s" if math.isinf(maximum) else f"between {minimum:g}s and {maximum:g}s"
        raise InvalidInput(f"{field} must be {bound}", field=field)
    return seconds
