"""Resource slots: named amounts (``cpu``, ``mem``, ``cuda.shares`` ...) with exact Decimal arithmetic.

Rules (after Backend.AI's ``ResourceSlot``, minus its mutating ``sync_keys``):

* A slot a side does not mention counts as zero, in every operator and comparison.
* A ``ResourceSlots`` is immutable and holds only non-zero entries (zeros are dropped on construction).
* ``<=`` / ``>=`` are the all-slots partial order: ``{a: 4, b: 100}`` and ``{a: 3, b: 200}`` are neither.
* Slot types are the union of the intrinsic ones, the configured ones and whatever any agent reports, because a cluster
  may mix agents with different accelerators.
"""

from __future__ import annotations

import re
from collections.abc import ItemsView, Iterable, Iterator, KeysView, Mapping
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from enum import StrEnum
from types import MappingProxyType

__all__ = [
    "INTRINSIC_SLOT_TYPES",
    "InvalidQuantityError",
    "Quantity",
    "ResourceSlots",
    "SlotError",
    "SlotType",
    "UnknownSlotError",
    "accumulate_slot_types",
    "format_amount",
    "format_slots",
    "from_user_input",
    "guess_slot_type",
    "parse_quantity",
]


class SlotType(StrEnum):
    COUNT = "count"
    """A countable or divisible amount (cores, devices, fractional device shares); kept to 0.001."""
    BYTES = "bytes"
    """A whole number of bytes; users may write binary suffixes (``512m``, ``2g``, ``64Mi``)."""


INTRINSIC_SLOT_TYPES: Mapping[str, SlotType] = MappingProxyType({"cpu": SlotType.COUNT, "mem": SlotType.BYTES})

Quantity = str | int | float | Decimal


class SlotError(ValueError):
    """A resource request a user (or a config file) got wrong."""


class UnknownSlotError(SlotError):
    def __init__(self, slot: str, *, known: Iterable[str] = ()) -> None:
        self.slot = slot
        known_names = sorted(known)
        hint = f" (known slots: {', '.join(known_names)})" if known_names else ""
        super().__init__(f"unknown resource slot {slot!r}{hint}")


class InvalidQuantityError(SlotError):
    def __init__(self, slot: str, value: object, reason: str) -> None:
        self.slot = slot
        self.value = value
        self.reason = reason
        super().__init__(f"invalid amount {value!r} for resource slot {slot!r}: {reason}")


_COUNT_STEP = Decimal("0.001")
_PLAIN_NUMBER = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*")
_BINARY_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(?:([kmgtp])(?:ib|i|b)?|b)?\s*", re.IGNORECASE)
_BINARY_MULTIPLIERS: dict[str, int] = {"k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4, "p": 1024**5}
"""Bytes per unit of each binary size suffix."""


def _non_negative_finite(slot: str, value: object, amount: Decimal) -> Decimal:
    if not amount.is_finite():
        raise InvalidQuantityError(slot, value, "must be a finite number")
    if amount < 0:
        raise InvalidQuantityError(slot, value, "must not be negative")
    return amount + 0  # folds -0 into 0


def _exact(slot: str, value: int | float | Decimal) -> Decimal:
    """A number as an exact Decimal, sign kept; the one place floats are converted."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):  # True cores is a bug, not a request
        raise InvalidQuantityError(slot, value, "expected a number")
    # floats go through str() so 0.1 means 0.1, not 0.1000000000000000055511151231257827
    amount = value if isinstance(value, Decimal) else Decimal(str(value) if isinstance(value, float) else value)
    if not amount.is_finite():
        raise InvalidQuantityError(slot, value, "must be a finite number")
    return amount


def _number_to_decimal(slot: str, value: int | float | Decimal) -> Decimal:
    return _non_negative_finite(slot, value, _exact(slot, value))


def _reject_signed_or_special(slot: str, value: str) -> None:
    # these would otherwise fall through to a vaguer "expected a number" message
    text = value.strip().lower()
    if text.startswith("-"):
        raise InvalidQuantityError(slot, value, "must not be negative")
    if text.lstrip("+") in {"nan", "snan", "inf", "infinity"}:
        raise InvalidQuantityError(slot, value, "must be a finite number")


def _parse_count(slot: str, value: Quantity) -> Decimal:
    if isinstance(value, str):
        _reject_signed_or_special(slot, value)
        match = _PLAIN_NUMBER.fullmatch(value)
        if match is None:
            raise InvalidQuantityError(slot, value, "expected a plain number such as 2 or 0.5")
        amount = Decimal(match.group(1))
    else:
        amount = _number_to_decimal(slot, value)
    try:
        return amount.quantize(_COUNT_STEP).normalize() + 0
    except InvalidOperation as exc:
        raise InvalidQuantityError(slot, value, "number too large") from exc


def _parse_bytes(slot: str, value: Quantity) -> Decimal:
    if isinstance(value, str):
        _reject_signed_or_special(slot, value)
        match = _BINARY_SIZE.fullmatch(value)
        if match is None:
            raise InvalidQuantityError(slot, value, "expected a size such as 1073741824, 512m, 2g or 64Mi")
        number, unit = Decimal(match.group(1)), match.group(2)
        if unit is not None:
            # with a binary suffix a fraction is normal ("1.5g"); a part of a byte is floored away
            return (number * _BINARY_MULTIPLIERS[unit.lower()]).to_integral_value(ROUND_FLOOR) + 0
        amount = number
    else:
        amount = _number_to_decimal(slot, value)
    if amount != amount.to_integral_value():
        raise InvalidQuantityError(slot, value, "a number of bytes must be whole (or carry a unit such as 1.5g)")
    return amount.to_integral_value() + 0


def parse_quantity(slot: str, value: Quantity, slot_type: SlotType) -> Decimal:
    """Parse one user-given amount exactly; raise ``InvalidQuantityError`` naming ``slot`` when it is not valid."""
    if slot_type is SlotType.BYTES:
        return _parse_bytes(slot, value)
    return _parse_count(slot, value)


def guess_slot_type(slot: str) -> SlotType:
    """The type of a slot nobody configured: memory-like names are bytes, everything else is a count."""
    if slot in INTRINSIC_SLOT_TYPES:
        return INTRINSIC_SLOT_TYPES[slot]
    return SlotType.BYTES if slot.endswith(("mem", "memory")) else SlotType.COUNT


_BINARY_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def format_amount(slot: str, amount: Decimal, slot_type: SlotType | None = None) -> str:
    """A human-readable amount for messages: ``2``, ``0.5``, ``1.5 GiB`` (bytes shown in binary units)."""
    if (slot_type or guess_slot_type(slot)) is SlotType.BYTES and abs(amount) >= 1024:
        power = 1
        while power < len(_BINARY_UNITS) and abs(amount) >= 1024 ** (power + 1):
            power += 1
        scaled = (amount / 1024**power).quantize(Decimal("0.01")).normalize()
        return f"{format(scaled, 'f')} {_BINARY_UNITS[power - 1]}"
    return format(amount.normalize() if amount else Decimal(0), "f")


def format_slots(slots: Mapping[str, Decimal], slot_types: Mapping[str, SlotType] | None = None) -> str:
    """``cpu 2, mem 1.5 GiB`` (slots in name order); ``nothing`` when empty."""
    types = slot_types or {}
    text = ", ".join(f"{slot} {format_amount(slot, amount, types.get(slot))}" for slot, amount in sorted(slots.items()))
    return text or "nothing"


class ResourceSlots(Mapping[str, Decimal]):
    """An immutable map slot -> amount in which a missing slot means zero; only non-zero entries are stored."""

    __slots__ = ("_amounts", "_hash")
    _amounts: dict[str, Decimal]
    _hash: int | None

    def __init__(self, amounts: Mapping[str, Decimal | int | float] | None = None) -> None:
        stored: dict[str, Decimal] = {}
        for slot, amount in (amounts or {}).items():
            exact = _exact(slot, amount)
            if exact:
                stored[slot] = exact
        self._amounts = dict(sorted(stored.items()))
        self._hash = None

    @classmethod
    def _trusted(cls, amounts: dict[str, Decimal]) -> ResourceSlots:
        # the one fast path for results of our own arithmetic: values are already exact Decimals
        made = cls.__new__(cls)
        made._amounts = dict(sorted((slot, amount) for slot, amount in amounts.items() if amount))
        made._hash = None
        return made

    @classmethod
    def of(cls, amounts: Mapping[str, Quantity] | None = None, /, **by_name: Quantity) -> ResourceSlots:
        """Convenience for tests and config: ``ResourceSlots.of({"cuda.shares": "0.5"}, cpu=2, mem="4g")``."""
        merged = {**(amounts or {}), **by_name}
        return cls._trusted({slot: parse_quantity(slot, v, guess_slot_type(slot)) for slot, v in merged.items()})

    @classmethod
    def from_json(cls, data: Mapping[str, str | int]) -> ResourceSlots:
        amounts: dict[str, Decimal] = {}
        for slot, raw in data.items():
            try:
                amounts[slot] = (
                    Decimal(raw) if isinstance(raw, (str, int)) and not isinstance(raw, bool) else Decimal("nan")
                )
            except InvalidOperation as exc:
                raise InvalidQuantityError(slot, raw, "not a number") from exc
            if not amounts[slot].is_finite():
                raise InvalidQuantityError(slot, raw, "must be a finite number")
        return cls._trusted(amounts)

    def to_json(self) -> dict[str, str]:
        return {slot: format(amount, "f") for slot, amount in self._amounts.items()}

    def amount(self, slot: str) -> Decimal:
        return self._amounts.get(slot, Decimal(0))

    def is_zero(self) -> bool:
        return not self._amounts

    def scaled(self, factor: int | Decimal) -> ResourceSlots:
        return self._trusted({slot: amount * factor for slot, amount in self._amounts.items()})

    def fits_in(self, capacity: Mapping[str, Decimal]) -> bool:
        return self <= _as_slots(capacity)

    # -- Mapping --
    def __getitem__(self, slot: str) -> Decimal:
        return self._amounts[slot]

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def keys(self) -> KeysView[str]:  # the dict's own views: iterated in C (a pass walks 100k requests)
        return self._amounts.keys()

    def items(self) -> ItemsView[str, Decimal]:
        return self._amounts.items()

    def __repr__(self) -> str:
        return f"ResourceSlots({self.to_json()!r})"

    def __hash__(self) -> int:
        if self._hash is None:  # requests are dict keys in the pass (presets repeat): hash once
            self._hash = hash(tuple(self._amounts.items()))  # kept sorted by slot: equal maps, equal tuples
        return self._hash

    # -- arithmetic and order, missing = 0 --
    def __eq__(self, other: object) -> bool:
        if type(other) is ResourceSlots:  # the common case, without the ABC check (a pass compares 100k keys)
            return self._amounts == other._amounts
        if not isinstance(other, Mapping):
            return NotImplemented
        return self._amounts == _as_slots(other)._amounts

    def __add__(self, other: Mapping[str, Decimal]) -> ResourceSlots:
        return self._combine(other, 1)

    def __sub__(self, other: Mapping[str, Decimal]) -> ResourceSlots:
        return self._combine(other, -1)

    def _combine(self, other: Mapping[str, Decimal], sign: int) -> ResourceSlots:
        result = dict(self._amounts)
        for slot, amount in _as_slots(other).items():
            result[slot] = result.get(slot, Decimal(0)) + sign * amount
        return self._trusted(result)

    def __le__(self, other: Mapping[str, Decimal]) -> bool:
        theirs = _as_slots(other)
        slots = self._amounts.keys() | theirs._amounts.keys()
        return all(self.amount(slot) <= theirs.amount(slot) for slot in slots)

    def __ge__(self, other: Mapping[str, Decimal]) -> bool:
        return _as_slots(other) <= self

    def __lt__(self, other: Mapping[str, Decimal]) -> bool:
        return self <= other and self != other

    def __gt__(self, other: Mapping[str, Decimal]) -> bool:
        return self >= other and self != other


def _as_slots(value: Mapping[str, Decimal]) -> ResourceSlots:
    return value if isinstance(value, ResourceSlots) else ResourceSlots(value)


def from_user_input(raw: Mapping[str, object], known: Mapping[str, SlotType]) -> ResourceSlots:
    """Parse a user's request; a non-zero amount of a slot no agent or config knows is refused
    (``UnknownSlotError``)."""
    amounts: dict[str, Decimal] = {}
    for slot, value in raw.items():
        if value is None:
            continue
        if not isinstance(value, (str, int, float, Decimal)):
            raise InvalidQuantityError(str(slot), value, "expected a number or a string")
        if slot in known:
            amounts[slot] = parse_quantity(slot, value, known[slot])
            continue
        try:
            is_zero = not parse_quantity(slot, value, guess_slot_type(slot))
        except InvalidQuantityError:
            is_zero = False
        if not is_zero:  # a zero of a slot we don't know asks for nothing, so it is harmless
            raise UnknownSlotError(slot, known=known)
    return ResourceSlots._trusted(amounts)


def accumulate_slot_types(
    agent_capacities: Iterable[Mapping[str, object]],
    configured: Mapping[str, SlotType] = MappingProxyType({}),
) -> dict[str, SlotType]:
    """Intrinsic ∪ configured ∪ every slot any agent reports; intrinsic types cannot be overridden."""
    slot_types: dict[str, SlotType] = {**configured, **INTRINSIC_SLOT_TYPES}
    for capacity in agent_capacities:
        for slot in capacity:
            if slot not in slot_types:
                slot_types[slot] = guess_slot_type(slot)
    return slot_types
