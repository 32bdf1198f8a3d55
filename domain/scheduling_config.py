"""Per-resource-group scheduling configuration: the operator's file over built-in defaults, checked at startup.

The file is ``CARAVAN_SCHEDULER_CONFIG``: HCL, or JSON when its name ends in ``.json`` (same structure, with
``"resource_group": {"gpu": {...}}``). Every key is optional; the defaults are shown::

    cpu_mhz_per_core = 1000              # Nomad MHz that make one Caravan core; default: the smallest
                                         # MHz per core any node reports (CpuShares / TotalCpuCores)
    device_slots = {                     # Nomad device "vendor/type[/name]" -> Caravan slot
                                         # (more are built in: devices/catalog.py)
      "nomad/file/mock" = "mock.device"
    }
    default {
      session_strategy  = "fifo"         # fifo | lifo | drf: the order sessions of one priority are tried in
      agent_selector    = "dispersed"    # concentrated | dispersed | roundrobin | an installed plugin
      retries_to_skip   = 0              # 0 = strict FIFO: a session short of resources blocks those behind it;
                                         # N > 0: after N failed attempts it goes behind the others and stops blocking
      reserve_after     = 0              # such a pushed-back session older than this reserves an agent (0 = never)
      max_reservations  = 1              # reservations held at once per group
      resource_priority = ["cuda", "rocm", "tpu", "cpu", "mem"]   # slot order when agents are compared
      pending_timeout   = 0              # PENDING longer than this -> CANCELLED "pending-timeout" (0 = never)
      selector_options  = {}             # free-form, handed to a custom selector
      allowed_drivers   = ["docker", "exec", "qemu", "raw_exec"]  # what sessions of the group may run on; others
                                         # are refused at creation (FORBIDDEN on driver)
      default_resources = { cpu = "0.25", mem = "256m" }  # what each kernel of a session gets of a slot its
                                         # request (and preset) leaves out; merged slot by slot over the built-in
                                         # defaults and, in a group, over this block's
    }
    resource_group "gpu" {               # one block per resource group (= Nomad node pool);
      agent_selector = "concentrated"    # keys not set here are taken from `default`
    }

The built-in defaults, 0.25 cpu and 256 MiB per kernel, let a small machine (2 cores, 2-4 GiB) hold eight sessions
that ask for nothing (with 1 cpu it held two): Nomad's ``cpu`` is a share, not a cap, so a lone session still uses
the whole machine. ``mem`` is a hard limit and stays at 256 MiB: less breaks real work (the VM image ``ops/`` builds
does not boot in 144 MiB, though the qemu driver takes 128), and memory was not what filled the machine.

Durations are seconds or strings such as ``"90s"``, ``"10m"``, ``"1h30m"``. A broken file stops the scheduler from
starting with ``file:line: key: reason`` (read by ``core.config_file``, like the idle policy); a strategy or selector
name is checked, and a selector plugin named here loaded, by the scheduler at startup (``scheduler.config``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from core.config_file import ConfigFileError, ConfigReader, attributes, has_interpolation, parse_hcl, read_text
from core.durations import parse_duration
from core.source_lines import SourceLines
from devices.catalog import DeviceCatalog
from domain.model import Driver
from domain.slots import InvalidQuantityError, ResourceSlots, guess_slot_type, parse_quantity

__all__ = [
    "DEFAULT_RESOURCES",
    "MIN_MEM_BYTES",
    "SchedulingConfigError",
    "SchedulingConfig",
    "load_scheduling_config",
    "parse_scheduling_config",
]

DEFAULT_RESOURCES: Mapping[str, str] = MappingProxyType({"cpu": "0.25", "mem": str(256 * 1024 * 1024)})
"""Built-in: what each kernel gets of a slot its request leaves out, unless the configuration says otherwise."""
MIN_MEM_BYTES = 16 * 1024 * 1024
"""The least ``mem`` a kernel may have (asked for, or by default)."""


GROUP_KEYS = (
    "session_strategy",
    "agent_selector",
    "retries_to_skip",
    "reserve_after",
    "max_reservations",
    "resource_priority",
    "pending_timeout",
    "selector_options",
    "allowed_drivers",
    "default_resources",
)
TOP_LEVEL_KEYS = ("cpu_mhz_per_core", "device_slots", "default", "resource_group")
Where = tuple[str, ...]


DEFAULT_RESOURCE_PRIORITY = ("cuda", "rocm", "tpu", "cpu", "mem")


@dataclass(frozen=True, kw_only=True)
class GroupConfig:
    """How one resource group schedules. Names are checked against the registries when a pass starts."""

    session_strategy: str = "fifo"
    """``fifo``, ``lifo`` or ``drf`` (see ``scheduler.selection``)."""
    agent_selector: str = "dispersed"
    """``concentrated``, ``dispersed``, ``roundrobin`` or a plugin of ``caravan.agent_selectors``."""
    retries_to_skip: int = 0
    """0 = strict: a session short of resources blocks everything behind it. N > 0: after N failed attempts it is
    pushed behind the others of its band and stops blocking."""
    reserve_after: timedelta | None = None
    """A pushed-back session older than this reserves the agent it fits best; None = never reserve."""
    max_reservations: int = 1
    """Overdue sessions holding a reservation at once, oldest first (1 = EASY backfill: the oldest overdue session
    gets an agent held, the rest wait their turn; more holds keep more agents idle)."""
    resource_priority: tuple[str, ...] = DEFAULT_RESOURCE_PRIORITY
    """Slot order used to compare agents' remaining amounts; ``cuda.shares`` ranks with ``cuda``."""
    selector_options: Mapping[str, object] = field(default_factory=dict)
    """Free-form options handed to a custom agent selector."""

    def __post_init__(self) -> None:
        if self.retries_to_skip < 0:
            raise ValueError(f"retries_to_skip must be >= 0, got {self.retries_to_skip}")
        if self.max_reservations < 0:
            raise ValueError(f"max_reservations must be >= 0, got {self.max_reservations}")
        if self.reserve_after is not None and self.reserve_after < timedelta(0):
            raise ValueError(f"reserve_after must not be negative, got {self.reserve_after}")


class SchedulingConfigError(ConfigFileError):
    """A scheduler configuration file that cannot be used (``file:line: key.path: reason``)."""


@dataclass(frozen=True)
class SchedulingConfig:
    """The file's configuration: each group's scheduling (``GroupConfig``: the scheduler resolves its strategy and
    selector names, ``scheduler.config``) and what the platform's edges read (drivers, default resources, pending
    timeouts, device names)."""

    default_group: GroupConfig = field(default_factory=GroupConfig)
    groups: Mapping[str, GroupConfig] = field(default_factory=dict)
    """Per resource group overrides of ``default_group`` (whole configs: keys a group leaves out come from the
    ``default`` block)."""
    pending_timeouts: Mapping[str, timedelta | None] = field(default_factory=dict)
    """Resource group -> its pending timeout; groups not listed use ``default_pending_timeout``."""
    default_pending_timeout: timedelta | None = None
    device_slots: Mapping[str, str] = field(default_factory=dict)
    """The file's device names; they win over the built-in ones (``devices.catalog.BUILTIN_SLOTS``)."""
    cpu_mhz_per_core: int | None = None
    source: str = "built-in"
    allowed_drivers: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Resource group -> the drivers its sessions may use; groups not listed use ``default_allowed_drivers``."""
    default_allowed_drivers: frozenset[str] = frozenset(d.value for d in Driver)
    group_default_resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Resource group -> what its sessions' kernels get of a slot they leave out (normalized amounts); groups not
    listed use ``default_default_resources``."""
    default_default_resources: Mapping[str, str] = field(default_factory=lambda: DEFAULT_RESOURCES)

    def for_group(self, group: str) -> GroupConfig:
        return self.groups.get(group, self.default_group)

    def pending_timeout(self, group: str) -> timedelta | None:
        return self.pending_timeouts.get(group, self.default_pending_timeout)

    def drivers_allowed(self, group: str) -> frozenset[str]:
        return self.allowed_drivers.get(group, self.default_allowed_drivers)

    def default_resources(self, group: str) -> Mapping[str, str]:
        """What a kernel of a session in ``group`` gets of each slot its request leaves out."""
        return self.group_default_resources.get(group, self.default_default_resources)

    lines: SourceLines | None = field(default=None, compare=False, repr=False)
    """Where each key is in the file (HCL only), for errors found after reading it (``refuse``)."""

    def refuse(self, where: Where, reason: str) -> SchedulingConfigError:
        """An error about a key of this file (a strategy or selector the scheduler does not know), with its line."""
        line = self.lines.line_of(where) if self.lines is not None else None
        return SchedulingConfigError(self.source, line, f"{'.'.join(where)}: {reason}")

    def group_sites(self) -> list[tuple[Where, GroupConfig]]:
        """Each group's configuration with where it is in the file: ``default``, then ``resource_group.<name>``."""
        return [
            (("default",), self.default_group),
            *((("resource_group", name), group) for name, group in sorted(self.groups.items())),
        ]

    @property
    def devices(self) -> DeviceCatalog:
        """Which Nomad device is which slot: the file's ``device_slots``, then the built-in names."""
        return DeviceCatalog(self.device_slots)


def load_scheduling_config(path: str | os.PathLike[str] | None) -> SchedulingConfig:
    """The configuration in force: the defaults when ``path`` is None, else the file's (``SchedulingConfigError``)."""
    if path is None:
        return parse_scheduling_config({}, "built-in")
    return parse_scheduling_config(read_text(path, SchedulingConfigError), os.fspath(path))


def parse_scheduling_config(text: str | Mapping[str, Any], source: str = "<config>") -> SchedulingConfig:
    """Parse HCL text, JSON text (``source`` ending in ``.json``) or an already decoded mapping."""
    if not isinstance(text, str):
        return _Reader(source, None).config(text)
    if source.endswith(".json"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise SchedulingConfigError(source, getattr(exc, "lineno", None), f"not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise SchedulingConfigError(source, 1, "expected a JSON object")
        return _Reader(source, None).config(doc)
    reader = _Reader(source, text)
    return reader.config(reader.from_hcl(parse_hcl(text, source, SchedulingConfigError, strip_quotes=True)))


class _Reader(ConfigReader):
    """Checks every value, naming the key path (and, for HCL, the line) of whatever is wrong."""

    error = SchedulingConfigError

    # -- HCL -> the plain structure JSON gives directly --

    def from_hcl(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        for duplicate in self.duplicates():
            raise duplicate
        plain: dict[str, Any] = {}
        for key, value in attributes(doc).items():
            if key == "default":
                bodies = value if isinstance(value, list) else [value]
                if len(bodies) > 1:
                    raise self.fail((key,), "given more than once", occurrence=1)
                if not isinstance(bodies[0], Mapping) or "__is_block__" not in bodies[0]:
                    raise self.fail((key,), "takes no name: write default { ... }")
                plain[key] = self.value(bodies[0], (key,))
            elif key == "resource_group":
                plain[key] = self.labeled(value)
            else:
                plain[key] = self.value(value, (key,))
        return plain

    def labeled(self, value: Any) -> dict[str, Any]:
        groups: dict[str, Any] = {}
        for block in value if isinstance(value, list) else [value]:
            if not isinstance(block, Mapping) or "__is_block__" in block or len(block) != 1:
                raise self.fail(("resource_group",), 'needs one name, as in resource_group "gpu" { ... }')
            ((name, body),) = block.items()
            if not isinstance(body, Mapping) or "__is_block__" not in body:
                raise self.fail(("resource_group", name), 'takes exactly one name, as in resource_group "gpu" { ... }')
            if name in groups:
                raise self.fail(("resource_group", name), "defined more than once", occurrence=1)
            groups[name] = self.value(body, ("resource_group", name))
        return groups

    def value(self, value: Any, where: Where) -> Any:
        """Plain values out of python-hcl2's (block markers dropped); no interpolation."""
        if has_interpolation(value):
            raise self.fail(where, "interpolation is not allowed in the scheduler configuration")
        if isinstance(value, Mapping):
            return {key: self.value(item, (*where, key)) for key, item in attributes(value).items()}
        if isinstance(value, list):
            return [self.value(item, where) for item in value]
        return value

    # -- the plain structure -> SchedulingConfig --

    def config(self, doc: Mapping[str, Any]) -> SchedulingConfig:
        self.known_keys(doc, (), TOP_LEVEL_KEYS)
        default_body = self.mapping(doc.get("default", {}), ("default",))
        default = self.group(default_body, ("default",), {})
        groups_doc = self.mapping(doc.get("resource_group", {}), ("resource_group",))
        groups = {
            name: self.group(self.mapping(body, ("resource_group", name)), ("resource_group", name), default)
            for name, body in groups_doc.items()
        }
        mhz = doc.get("cpu_mhz_per_core")
        if mhz is not None and (isinstance(mhz, bool) or not isinstance(mhz, int) or mhz <= 0):
            raise self.fail(("cpu_mhz_per_core",), f"expected a whole number of MHz > 0, got {mhz!r}")
        return SchedulingConfig(
            default_group=_group_config(default),
            groups={name: _group_config(g) for name, g in groups.items()},
            lines=self.lines,
            pending_timeouts={name: g["pending_timeout"] for name, g in groups.items()},
            default_pending_timeout=default["pending_timeout"],
            device_slots=MappingProxyType(self.device_slots(doc.get("device_slots", {}))),
            cpu_mhz_per_core=mhz,
            source=self.path,
            allowed_drivers={name: g["allowed_drivers"] for name, g in groups.items()},
            default_allowed_drivers=default["allowed_drivers"],
            group_default_resources={name: g["default_resources"] for name, g in groups.items()},
            default_default_resources=default["default_resources"],
        )

    def group(self, body: Mapping[str, Any], where: Where, inherited: Mapping[str, Any]) -> dict[str, Any]:
        self.known_keys(body, where, GROUP_KEYS)
        found = dict(
            inherited
            or {
                **{f.name: getattr(GroupConfig(), f.name) for f in fields(GroupConfig)},
                "pending_timeout": None,
                "allowed_drivers": frozenset(d.value for d in Driver),
                "default_resources": DEFAULT_RESOURCES,
            }
        )
        for key in ("session_strategy", "agent_selector"):
            if key in body:
                found[key] = self.string(body[key], (*where, key))
        for key in ("retries_to_skip", "max_reservations"):
            if key in body:
                found[key] = self.count(body[key], (*where, key))
        for key in ("reserve_after", "pending_timeout"):
            if key in body:
                found[key] = self.duration(body[key], (*where, key))
        if "resource_priority" in body:
            value = body["resource_priority"]
            if not isinstance(value, list):
                raise self.fail((*where, "resource_priority"), "expected a list of slot names")
            found["resource_priority"] = tuple(self.string(item, (*where, "resource_priority")) for item in value)
        if "allowed_drivers" in body:
            found["allowed_drivers"] = self.drivers(body["allowed_drivers"], (*where, "allowed_drivers"))
        if "default_resources" in body:
            found["default_resources"] = self.resources(
                body["default_resources"], (*where, "default_resources"), found["default_resources"]
            )
        if "selector_options" in body:
            found["selector_options"] = MappingProxyType(
                dict(self.mapping(body["selector_options"], (*where, "selector_options")))
            )
        return found

    def device_slots(self, value: Any) -> dict[str, str]:
        found = {}
        for device, slot in self.mapping(value, ("device_slots",)).items():
            where = ("device_slots", device)
            if not device or device.count("/") > 2:
                raise self.fail(where, 'expected a device id such as "nvidia/gpu" or "nomad/file/mock"')
            found[device] = self.string(slot, where)
            if not found[device] or found[device] in ("cpu", "mem"):
                raise self.fail(where, f"cannot count a device as {found[device]!r}")
        return found

    def drivers(self, value: Any, where: Where) -> frozenset[str]:
        known = sorted(d.value for d in Driver)
        if not isinstance(value, list):
            raise self.fail(where, f"expected a list of drivers ({', '.join(known)})")
        for item in value:
            if self.string(item, where) not in known:
                raise self.fail(where, f"unknown driver {item!r} (valid: {', '.join(known)})")
        return frozenset(value)

    def resources(self, value: Any, where: Where, under: Mapping[str, str]) -> Mapping[str, str]:
        """Default amounts per slot, over ``under`` slot by slot; each a number or a string such as "0.5" or "512m"
        (a slot's type as a request's: memory-like names are bytes, the others counts)."""
        amounts = dict(under)
        for slot, raw in self.mapping(value, where).items():
            if isinstance(raw, bool) or not isinstance(raw, str | int | float):
                raise self.fail((*where, slot), f'expected an amount such as 0.5 or "512m", got {raw!r}')
            try:
                amount = parse_quantity(slot, raw, guess_slot_type(slot))
            except InvalidQuantityError as exc:
                raise self.fail((*where, slot), exc.reason) from None
            amounts[slot] = format(amount, "f")
        checked = ResourceSlots({slot: Decimal(amount) for slot, amount in amounts.items()})
        if checked.amount("cpu") <= 0:
            raise self.fail((*where, "cpu"), "must be more than 0")
        if checked.amount("mem") < MIN_MEM_BYTES:
            raise self.fail((*where, "mem"), "must be at least 16m")
        return MappingProxyType(amounts)

    def string(self, value: Any, where: Where) -> str:
        if not isinstance(value, str):
            raise self.fail(where, f"expected a string, got {value!r}")
        return value

    def count(self, value: Any, where: Where) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.fail(where, f"expected a whole number >= 0, got {value!r}")
        return value

    def duration(self, value: Any, where: Where) -> timedelta | None:
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise self.fail(where, str(exc)) from None
        return timedelta(seconds=seconds) if seconds else None


def _group_config(found: Mapping[str, Any]) -> GroupConfig:
    edge_only = ("pending_timeout", "allowed_drivers", "default_resources")  # read by the edges, not the core
    return GroupConfig(**{key: value for key, value in found.items() if key not in edge_only})
