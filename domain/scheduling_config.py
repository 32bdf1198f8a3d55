"""Per-resource-group scheduling configuration: the operator's file over built-in defaults, checked at startup.

The file is ``CARAVAN_SCHEDULER_CONFIG``: HCL, or JSON when its name ends in ``.json`` (same structure, with
``"resource_group": {"gpu": {...}}``). Every key is optional; the defaults are shown::

    cpu_mhz_per_core = 1000              # Nomad MHz that make one Caravan core; default: the smallest
                                         # MHz per core any node reports (CpuShares / TotalCpuCores)
    device_slots = {                     # Nomad device "vendor/type[/name]" -> Caravan slot (more in DEVICE_SLOTS)
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
starting with ``file:line: key: reason``; a selector plugin named here is loaded once, at startup.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

import hcl2
from hcl2 import SerializationOptions
from lark.exceptions import LarkError, UnexpectedInput

from core.durations import parse_duration
from domain.model import Driver
from core.source_lines import scan
from scheduler.agents import BUILTIN_SELECTORS, ROUNDROBIN, UnknownSelectorError, load_plugin_selectors
from scheduler.pass_model import GroupConfig, SchedulerConfig
from scheduler.scheduling_pass import validate_config
from scheduler.selection import STRATEGIES
from domain.slots import InvalidQuantityError, ResourceSlots, guess_slot_type, parse_quantity

__all__ = ["DEFAULT_RESOURCES", "DEVICE_SLOTS", "MIN_MEM_BYTES", "SchedulerConfigError", "SchedulingConfig",
           "load_scheduler_config", "parse_scheduler_config"]

DEFAULT_RESOURCES: Mapping[str, str] = MappingProxyType({"cpu": "0.25", "mem": str(256 * 1024 * 1024)})
"""Built-in: what each kernel gets of a slot its request leaves out, unless the configuration says otherwise."""
MIN_MEM_BYTES = 16 * 1024 * 1024
"""The least ``mem`` a kernel may have (asked for, or by default)."""

DEVICE_SLOTS: Mapping[str, str] = MappingProxyType({
    "nvidia/gpu": "cuda.device",
    "amd/gpu": "rocm.device",
    "nomad/file/mock": "mock.device",  # Nomad's example device plugin: fake devices for tests and demos
})
"""Built-in names of Nomad devices as slots; any other device is ``<vendor>.<type>`` (``intel/gpu`` -> ``intel.gpu``)."""

GROUP_KEYS = ("session_strategy", "agent_selector", "retries_to_skip", "reserve_after", "max_reservations",
              "resource_priority", "pending_timeout", "selector_options", "allowed_drivers", "default_resources")
TOP_LEVEL_KEYS = ("cpu_mhz_per_core", "device_slots", "default", "resource_group")
Where = tuple[str, ...]


class SchedulerConfigError(ValueError):
    def __init__(self, source: str, line: int | None, reason: str) -> None:
        super().__init__(f"{source}:{line if line is not None else '-'}: {reason}")
        self.source = source
        self.line = line
        self.reason = reason


@dataclass(frozen=True)
class SchedulingConfig:
    """The pure core's ``SchedulerConfig`` plus what only the I/O edge uses."""

    core: SchedulerConfig = field(default_factory=SchedulerConfig)
    pending_timeouts: Mapping[str, timedelta | None] = field(default_factory=dict)
    """Resource group -> its pending timeout; groups not listed use ``default_pending_timeout``."""
    default_pending_timeout: timedelta | None = None
    device_slots: Mapping[str, str] = field(default_factory=dict)
    """The file's device names; they win over ``DEVICE_SLOTS``."""
    cpu_mhz_per_core: int | None = None
    source: str = "built-in"
    allowed_drivers: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Resource group -> the drivers its sessions may use; groups not listed use ``default_allowed_drivers``."""
    default_allowed_drivers: frozenset[str] = frozenset(d.value for d in Driver)
    group_default_resources: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Resource group -> what its sessions' kernels get of a slot they leave out (normalized amounts); groups not
    listed use ``default_default_resources``."""
    default_default_resources: Mapping[str, str] = field(default_factory=lambda: DEFAULT_RESOURCES)

    def pending_timeout(self, group: str) -> timedelta | None:
        return self.pending_timeouts.get(group, self.default_pending_timeout)

    def drivers_allowed(self, group: str) -> frozenset[str]:
        return self.allowed_drivers.get(group, self.default_allowed_drivers)

    def default_resources(self, group: str) -> Mapping[str, str]:
        """What a kernel of a session in ``group`` gets of each slot its request leaves out."""
        return self.group_default_resources.get(group, self.default_default_resources)

    def device_slot(self, vendor: str, kind: str, name: str) -> str:
        """The slot a Nomad device counts as: the configured names (most specific id first), then the built-in
        ones, else ``<vendor>.<type>``."""
        for names in (self.device_slots, DEVICE_SLOTS):
            for device_id in (f"{vendor}/{kind}/{name}", f"{vendor}/{kind}", kind):
                if device_id in names:
                    return names[device_id]
        return f"{vendor}.{kind}"


def load_scheduler_config(path: str | os.PathLike[str] | None) -> SchedulingConfig:
    """The configuration in force: the defaults when ``path`` is None, else the file's (``SchedulerConfigError``)."""
    if path is None:
        return parse_scheduler_config({}, "built-in")
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SchedulerConfigError(source, None, f"cannot read the file: {exc}") from exc
    return parse_scheduler_config(text, source)


def parse_scheduler_config(text: str | Mapping[str, Any], source: str = "<config>") -> SchedulingConfig:
    """Parse HCL text, JSON text (``source`` ending in ``.json``) or an already decoded mapping."""
    if not isinstance(text, str):
        return _Reader(source, None).config(text)
    if source.endswith(".json"):
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise SchedulerConfigError(source, getattr(exc, "lineno", None), f"not valid JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise SchedulerConfigError(source, 1, "expected a JSON object")
        return _Reader(source, None).config(doc)
    try:
        raw = hcl2.loads(text, serialization_options=SerializationOptions(with_comments=False, strip_string_quotes=True))
    except UnexpectedInput as exc:
        line = exc.line if exc.line > 0 else text.count("\n") + 1  # lark says -1 at the end of input
        raise SchedulerConfigError(source, line, f"syntax error: {_first_line(exc)}") from exc
    except (LarkError, ValueError) as exc:
        raise SchedulerConfigError(source, None, f"syntax error: {_first_line(exc)}") from exc
    reader = _Reader(source, text)
    return reader.config(reader.from_hcl(raw))


class _Reader:
    """Checks every value, naming the key path (and, for HCL, the line) of whatever is wrong."""

    def __init__(self, source: str, hcl_text: str | None) -> None:
        self.source = source
        self.lines = scan(hcl_text) if hcl_text is not None else None

    def fail(self, where: Where, reason: str, occurrence: int = 0) -> SchedulerConfigError:
        line = self.lines.line_of(where, occurrence) if self.lines is not None else None
        return SchedulerConfigError(self.source, line, f"{'.'.join(where)}: {reason}" if where else reason)

    # -- HCL -> the plain structure JSON gives directly --

    def from_hcl(self, doc: Mapping[str, Any]) -> dict[str, Any]:
        assert self.lines is not None
        for where, line in self.lines.duplicate_keys():
            raise SchedulerConfigError(self.source, line, f"{'.'.join(where)}: assigned more than once")
        plain: dict[str, Any] = {}
        for key, value in _attributes(doc).items():
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
        if isinstance(value, str) and ("${" in value or "%{" in value):
            raise self.fail(where, "interpolation is not allowed in the scheduler configuration")
        if isinstance(value, Mapping):
            return {key: self.value(item, (*where, key)) for key, item in _attributes(value).items()}
        if isinstance(value, list):
            return [self.value(item, where) for item in value]
        return value

    # -- the plain structure -> SchedulingConfig --

    def config(self, doc: Mapping[str, Any]) -> SchedulingConfig:
        self.known_keys(doc, (), TOP_LEVEL_KEYS)
        default_body = self.mapping(doc.get("default", {}), ("default",))
        default = self.group(default_body, ("default",), {})
        groups_doc = self.mapping(doc.get("resource_group", {}), ("resource_group",))
        groups = {name: self.group(self.mapping(body, ("resource_group", name)), ("resource_group", name), default)
                  for name, body in groups_doc.items()}
        plugins = self.plugins({("default",): default, **{("resource_group", n): g for n, g in groups.items()}})
        core = SchedulerConfig(
            default=_group_config(default),
            groups={name: _group_config(g) for name, g in groups.items()},
            plugin_selectors=plugins,
        )
        validate_config(core)
        mhz = doc.get("cpu_mhz_per_core")
        if mhz is not None and (isinstance(mhz, bool) or not isinstance(mhz, int) or mhz <= 0):
            raise self.fail(("cpu_mhz_per_core",), f"expected a whole number of MHz > 0, got {mhz!r}")
        return SchedulingConfig(
            core=core,
            pending_timeouts={name: g["pending_timeout"] for name, g in groups.items()},
            default_pending_timeout=default["pending_timeout"],
            device_slots=MappingProxyType(self.device_slots(doc.get("device_slots", {}))),
            cpu_mhz_per_core=mhz,
            source=self.source,
            allowed_drivers={name: g["allowed_drivers"] for name, g in groups.items()},
            default_allowed_drivers=default["allowed_drivers"],
            group_default_resources={name: g["default_resources"] for name, g in groups.items()},
            default_default_resources=default["default_resources"],
        )

    def group(self, body: Mapping[str, Any], where: Where, inherited: Mapping[str, Any]) -> dict[str, Any]:
        self.known_keys(body, where, GROUP_KEYS)
        found = dict(inherited or {**{f.name: getattr(GroupConfig(), f.name) for f in fields(GroupConfig)},
                                   "pending_timeout": None, "allowed_drivers": frozenset(d.value for d in Driver),
                                   "default_resources": DEFAULT_RESOURCES})
        for key in ("session_strategy", "agent_selector"):
            if key in body:
                found[key] = self.string(body[key], (*where, key))
        if found["session_strategy"] not in STRATEGIES:
            raise self.fail((*where, "session_strategy"), f"unknown strategy {found['session_strategy']!r} "
                            f"(valid: {', '.join(sorted(STRATEGIES))})")
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
            found["default_resources"] = self.resources(body["default_resources"], (*where, "default_resources"),
                                                        found["default_resources"])
        if "selector_options" in body:
            found["selector_options"] = MappingProxyType(dict(self.mapping(body["selector_options"],
                                                                           (*where, "selector_options"))))
        return found

    def plugins(self, groups: Mapping[Where, Mapping[str, Any]]) -> dict[str, Any]:
        wanted = {g["agent_selector"]: where for where, g in groups.items()
                  if g["agent_selector"] not in BUILTIN_SELECTORS and g["agent_selector"] != ROUNDROBIN}
        try:
            return load_plugin_selectors(wanted)
        except UnknownSelectorError as exc:
            raise self.fail((*wanted.get(exc.name, ()), "agent_selector"), str(exc)) from None

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
                raise self.fail((*where, slot), f"expected an amount such as 0.5 or \"512m\", got {raw!r}")
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

    def known_keys(self, body: Mapping[str, Any], where: Where, allowed: tuple[str, ...]) -> None:
        for key in body:
            if key not in allowed:
                raise self.fail((*where, key), f"unknown key (expected one of: {', '.join(allowed)})")

    def mapping(self, value: Any, where: Where) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected a block or object, got {value!r}")
        return value

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


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _attributes(body: Mapping[str, Any]) -> dict[str, Any]:
    # python-hcl2's markers (__is_block__ ...) are not the operator's keys
    return {key: value for key, value in body.items() if not (key.startswith("__") and key.endswith("__"))}


def _group_config(found: Mapping[str, Any]) -> GroupConfig:
    edge_only = ("pending_timeout", "allowed_drivers", "default_resources")  # read by the edges, not the core
    return GroupConfig(**{key: value for key, value in found.items() if key not in edge_only})
