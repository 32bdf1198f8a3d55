"""One way user-given durations become seconds or INVALID_INPUT naming their field."""

from __future__ import annotations

import pytest

from core.durations import duration_input
from core.errors import InvalidInput


@pytest.mark.parametrize(
    ("value", "minimum", "maximum", "seconds"),
    [(None, 1, 10, None), ("90s", 0, float("inf"), 90.0), ("1m", 60, 60, 60.0), ("1h30m", 1, 86400, 5400.0)],
)
def test_accepted(value: str | None, minimum: float, maximum: float, seconds: float | None) -> None:
    assert duration_input("f", value, minimum=minimum, maximum=maximum) == seconds


@pytest.mark.parametrize(
    ("value", "minimum", "maximum", "message"),
    [
        ("soon", 0, float("inf"), "f: "),
        ("-5s", 0, float("inf"), "f: "),
        ("0s", 1, float("inf"), "at least 1s"),
        ("2h", 1, 3600, "between 1s and 3600s"),
    ],
)
def test_refused_naming_the_field(value: str, minimum: float, maximum: float, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as refused:
        duration_input("f", value, minimum=minimum, maximum=maximum)
    assert refused.value.field == "f"
