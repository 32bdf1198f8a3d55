from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devices.catalog import device_prefix
from domain.slots import (
    INTRINSIC_SLOT_TYPES,
    InvalidQuantityError,
    ResourceSlots,
    SlotType,
    UnknownSlotError,
    accumulate_slot_types,
    format_amount,
    from_user_input,
    parse_quantity,
)

COUNT, BYTES = SlotType.COUNT, SlotType.BYTES
KiB, MiB, GiB, TiB, PiB = (1024**n for n in range(1, 6))

PARSE_OK = [
    ("count-string-fraction", "1.5", COUNT, "1.5"),
    ("count-int", 2, COUNT, "2"),
    ("count-quarter", "0.25", COUNT, "0.25"),
    ("count-float-via-str", 0.1, COUNT, "0.1"),
    ("count-quantized-to-milli", "0.3334", COUNT, "0.333"),
    ("count-below-milli-is-zero", "0.0004", COUNT, "0"),
    ("count-trailing-zeros", "20.000", COUNT, "20"),
    ("count-decimal", Decimal("3.5"), COUNT, "3.5"),
    ("count-whitespace", " 4 ", COUNT, "4"),
    ("bytes-plain-int", 1024, BYTES, "1024"),
    ("bytes-plain-string", "1073741824", BYTES, "1073741824"),
    ("bytes-512m", "512m", BYTES, str(512 * MiB)),
    ("bytes-2g", "2g", BYTES, str(2 * GiB)),
    ("bytes-1.5G", "1.5G", BYTES, str(3 * GiB // 2)),
    ("bytes-64Mi", "64Mi", BYTES, str(64 * MiB)),
    ("bytes-KiB-with-space", "124.32 KiB", BYTES, "127303"),
    ("bytes-fraction-floored", "1.1k", BYTES, "1126"),
    ("bytes-half-m", "0.5m", BYTES, "524288"),
    ("bytes-kb", "1KB", BYTES, "1024"),
    ("bytes-t", "1t", BYTES, str(TiB)),
    ("bytes-p-ib", "2PiB", BYTES, str(2 * PiB)),
    ("bytes-b-suffix", "100b", BYTES, "100"),
    ("bytes-whole-float", 1024.0, BYTES, "1024"),
    ("bytes-zero", "0", BYTES, "0"),
]


@pytest.mark.parametrize(("value", "slot_type", "expected"), [c[1:] for c in PARSE_OK], ids=[c[0] for c in PARSE_OK])
def test_parse_quantity(value: object, slot_type: SlotType, expected: str) -> None:
    parsed = parse_quantity("x", value, slot_type)  # type: ignore[arg-type]
    assert isinstance(parsed, Decimal)
    assert parsed == Decimal(expected)


PARSE_ERRORS = [
    ("bytes-plain-fraction", "1.1", BYTES, "whole"),
    ("bytes-fraction-with-b-only", "1.5b", BYTES, "whole"),
    ("bytes-float-fraction", 1.5, BYTES, "whole"),
    ("negative-count", "-1", COUNT, "negative"),
    ("negative-int", -3, COUNT, "negative"),
    ("negative-bytes-suffix", "-2g", BYTES, "negative"),
    ("nan-string", "nan", COUNT, "finite"),
    ("nan-float", float("nan"), COUNT, "finite"),
    ("inf-string", "inf", BYTES, "finite"),
    ("inf-float", float("inf"), BYTES, "finite"),
    ("infinity-decimal", Decimal("Infinity"), COUNT, "finite"),
    ("empty", "", COUNT, "plain number"),
    ("garbage", "lots", COUNT, "plain number"),
    ("exponent-string", "1e3", COUNT, "plain number"),
    ("unknown-unit", "3x", BYTES, "size"),
    ("exabytes-unsupported", "1e", BYTES, "size"),
    ("bool", True, COUNT, "number"),
    ("none", None, COUNT, "number"),
]


@pytest.mark.parametrize(
    ("value", "slot_type", "reason"), [c[1:] for c in PARSE_ERRORS], ids=[c[0] for c in PARSE_ERRORS]
)
def test_parse_quantity_errors(value: object, slot_type: SlotType, reason: str) -> None:
    with pytest.raises(InvalidQuantityError) as raised:
        parse_quantity("cuda.shares", value, slot_type)  # type: ignore[arg-type]
    assert raised.value.slot == "cuda.shares"
    assert raised.value.value is value or raised.value.value == value
    assert reason in raised.value.reason
    assert "cuda.shares" in str(raised.value)


A = ResourceSlots.of(a=4, b=100)
B = ResourceSlots.of(a=3, b=200)
ORDER_CASES = [
    ("incomparable", A, B, False, False),
    ("equal", A, ResourceSlots.of(b=100, a=4), True, True),
    ("missing-is-zero-le", ResourceSlots.of(a=1), ResourceSlots.of(a=1, b=1), True, False),
    ("missing-is-zero-ge", ResourceSlots.of(a=1, b=1), ResourceSlots.of(a=1), False, True),
    ("empty-le-anything", ResourceSlots(), A, True, False),
]


@pytest.mark.parametrize(("left", "right", "le", "ge"), [c[1:] for c in ORDER_CASES], ids=[c[0] for c in ORDER_CASES])
def test_partial_order(left: ResourceSlots, right: ResourceSlots, le: bool, ge: bool) -> None:
    assert (left <= right) is le
    assert (left >= right) is ge
    assert left.fits_in(right) is le


def test_arithmetic_treats_missing_as_zero_and_may_go_negative() -> None:
    assert A + ResourceSlots.of(c=1) == ResourceSlots.of(a=4, b=100, c=1)
    assert (A - B).to_json() == {"a": "1", "b": "-100"}
    assert (A - A).is_zero()
    assert A.scaled(3) == ResourceSlots.of(a=12, b=300)


def test_zeros_are_dropped_and_equality_ignores_them() -> None:
    with_zero = ResourceSlots({"a": Decimal(4), "b": Decimal(100), "c": Decimal(0)})
    assert "c" not in with_zero and len(with_zero) == 2
    assert with_zero == A == {"a": Decimal(4), "b": Decimal(100), "z": Decimal(0)}
    assert with_zero.amount("c") == 0 and with_zero.amount("never") == 0
    assert hash(with_zero) == hash(A)
    with pytest.raises(KeyError):
        _ = A["c"]


def test_json_has_no_scientific_notation_and_round_trips() -> None:
    twenty = ResourceSlots({"cpu": Decimal("2E+1"), "mem": Decimal(8 * GiB)})
    assert twenty.to_json() == {"cpu": "20", "mem": str(8 * GiB)}
    assert ResourceSlots.from_json(twenty.to_json()) == twenty
    with pytest.raises(InvalidQuantityError):
        ResourceSlots.from_json({"cpu": "NaN"})


def test_from_user_input_refuses_unknown_nonzero_slots() -> None:
    known = {**INTRINSIC_SLOT_TYPES, "cuda.shares": COUNT}
    parsed = from_user_input(
        {"cpu": "2", "mem": "4g", "cuda.shares": "0.5", "tpu.device": 0, "rocm.device": "0"}, known
    )
    assert parsed == ResourceSlots({"cpu": Decimal(2), "mem": Decimal(4 * GiB), "cuda.shares": Decimal("0.5")})
    with pytest.raises(UnknownSlotError) as raised:
        from_user_input({"cpu": 1, "tpu.device": 1}, known)
    assert raised.value.slot == "tpu.device"
    assert "tpu.device" in str(raised.value) and "cuda.shares" in str(raised.value)


def test_from_user_input_reports_bad_amount_of_known_slot() -> None:
    with pytest.raises(InvalidQuantityError) as raised:
        from_user_input({"mem": "1.5"}, INTRINSIC_SLOT_TYPES)
    assert raised.value.slot == "mem"


SLOT_TYPE_CASES = [
    ("intrinsic", [], {}, {"cpu": COUNT, "mem": BYTES}),
    (
        "mixed-agents-accumulate",
        [{"cpu": 1, "cuda.shares": 4}, {"rocm.device": 1, "cuda.mem": 1}],
        {},
        {"cpu": COUNT, "mem": BYTES, "cuda.shares": COUNT, "rocm.device": COUNT, "cuda.mem": BYTES},
    ),
    ("memory-suffix-is-bytes", [{"tpu.memory": 1, "hbm.mem": 1}], {}, {"tpu.memory": BYTES, "hbm.mem": BYTES}),
    ("configured-wins-over-guess", [{"cuda.smp": 2}], {"cuda.smp": BYTES}, {"cuda.smp": BYTES}),
    ("intrinsic-cannot-be-overridden", [], {"cpu": BYTES}, {"cpu": COUNT}),
]


@pytest.mark.parametrize(
    ("capacities", "configured", "expected"), [c[1:] for c in SLOT_TYPE_CASES], ids=[c[0] for c in SLOT_TYPE_CASES]
)
def test_accumulate_slot_types(
    capacities: list[dict[str, int]], configured: dict[str, SlotType], expected: dict[str, SlotType]
) -> None:
    types = accumulate_slot_types(capacities, configured)
    assert {slot: types[slot] for slot in expected} == expected


@pytest.mark.parametrize(
    ("slot", "prefix"), [("cuda.shares", "cuda"), ("cpu", "cpu"), ("rocm.device", "rocm"), ("a.b.c", "a")]
)
def test_device_prefix(slot: str, prefix: str) -> None:
    assert device_prefix(slot) == prefix


@pytest.mark.parametrize(
    ("slot", "amount", "text"),
    [
        ("mem", 3 * GiB // 2, "1.5 GiB"),
        ("mem", 1000, "1000"),
        ("cpu", Decimal("2.500"), "2.5"),
        ("cpu", Decimal(0), "0"),
    ],
)
def test_format_amount(slot: str, amount: int | Decimal, text: str) -> None:
    assert format_amount(slot, Decimal(amount)) == text


milli = st.integers(min_value=0, max_value=10**9).map(lambda n: Decimal(n).scaleb(-3))
slot_maps = st.dictionaries(st.sampled_from(["cpu", "mem", "cuda.shares", "rocm.device"]), milli, max_size=4)


@settings(max_examples=150, deadline=None)
@given(slot_maps, slot_maps)
def test_properties_of_slot_arithmetic(left_raw: dict[str, Decimal], right_raw: dict[str, Decimal]) -> None:
    left, right = ResourceSlots(left_raw), ResourceSlots(right_raw)
    assert (left + right) - right == left
    assert left <= left + right and left + right >= right
    assert (left <= right and right <= left) == (left == right)
    assert ResourceSlots.from_json(left.to_json()) == left
    assert all("E" not in text for text in left.to_json().values())


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "k", "m", "g", "Ki", "MiB", "G", "tb"]))
def test_bytes_suffixes_scale_by_powers_of_1024(number: int, suffix: str) -> None:
    power = "_kmgt".index(suffix[0].lower()) if suffix else 0
    assert parse_quantity("mem", f"{number}{suffix}", BYTES) == number * 1024**power
