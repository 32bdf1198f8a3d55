"""Read the operator's idle policy file (HCL, parsed with python-hcl2). Pure except for reading the file.

Format (see ``idle/policy.example.hcl`` for a commented example)::

    check_interval = "15s"                          # sweep period; also the sampling interval (> 0)
    enabled = ["session_lifetime", "network_timeout", "utilization"]   # checks that run at all

    defaults {                                      # at most one; every key optional
      max_session_lifetime = "1d"                   # from RUNNING; 0 = no limit (BATCH: never applies)
      network_idle_timeout = "30m"                  # no user traffic for this long; 0 = never
      utilization {
        grace_period = "10m"                        # no utilization verdict before RUNNING + this
        window       = "30m"                        # seconds of samples averaged (> 0)
        operator     = "all"                        # "all": idle when all checked metrics are below; "any"
        thresholds {                                # percent, 0..100; null = not checked
          cpu_util = 2                              # (`thresholds = { ... }` works too)
          cuda_util = 1
        }
      }
    }
    resource_group "gpu" { ... }                    # same keys as defaults; one block per group
    user_policy "research" { ... }                  # same keys; one block per user policy name

Durations are numbers of seconds or strings such as ``"30s"``, ``"10m"``, ``"2h"``, ``"1d"``, ``"1h30m"``.
Metric names are those of :func:`domain.idle.metrics.known_metrics` (CPU, memory, and each named device's). How the
layers combine is in :mod:`domain.idle.config`.

Anything else is refused with :class:`PolicyFileError` naming the file, the line and the reason: syntax
errors (line from lark), unknown keys or blocks, wrong types, negative or malformed durations, unknown
metrics, a bad operator, a block or label given twice, a key assigned twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from core.config_file import ConfigFileError, ConfigReader, attributes, parse_hcl, read_text, shown
from core.durations import parse_duration
from core.source_lines import Path
from devices.catalog import DeviceCatalog
from domain.idle.config import DEFAULT_CHECK_INTERVAL, CheckName, IdlePolicyConfig, PolicyLayer, ThresholdOperator
from domain.idle.metrics import known_metrics

TOP_LEVEL_KEYS = ("check_interval", "enabled", "defaults", "resource_group", "user_policy")
LAYER_KEYS = ("max_session_lifetime", "network_idle_timeout", "utilization")
UTILIZATION_KEYS = ("grace_period", "window", "operator", "thresholds")


class PolicyFileError(ConfigFileError):
    """An idle policy file that cannot be used (``file:line: key.path: reason``)."""


def load_policy_file(path: str | os.PathLike[str], devices: DeviceCatalog | None = None) -> IdlePolicyConfig:
    return parse_policy(read_policy_text(path), os.fspath(path), devices)


def read_policy_text(path: str | os.PathLike[str]) -> str:
    """The file's text; :class:`PolicyFileError` when it cannot be read or is not UTF-8."""
    return read_text(path, PolicyFileError)


def parse_policy(
    text: str, path: str = "<policy>", devices: DeviceCatalog | None = None, *, published: bool = False
) -> IdlePolicyConfig:
    """``devices``: the device names in force (the metrics of named devices may have thresholds). ``published``: the
    text the idle checker published after parsing it with its own device names: any metric name is taken."""
    return _Reader(path, text, None if published else known_metrics(devices)).config(
        parse_hcl(text, path, PolicyFileError)
    )


class _Reader(ConfigReader):
    """Walks python-hcl2's dict, checking every value and naming the line of whatever is wrong."""

    error = PolicyFileError

    def __init__(self, path: str, text: str, metrics: frozenset[str] | None) -> None:
        super().__init__(path, text)
        self.known_metrics = metrics

    def config(self, doc: Mapping[str, Any]) -> IdlePolicyConfig:
        self.known_keys(doc, (), TOP_LEVEL_KEYS)
        interval = self.duration(doc, (), "check_interval", positive=True)
        defaults = self.single_block(doc, (), "defaults")
        config = IdlePolicyConfig(
            source=self.path,
            check_interval=DEFAULT_CHECK_INTERVAL if interval is None else interval,
            enabled=self.enabled(doc.get("enabled")),
            defaults=self.layer(defaults, ("defaults",)) if defaults is not None else PolicyLayer(),
            resource_groups=self.labeled_layers(doc, "resource_group"),
            user_policies=self.labeled_layers(doc, "user_policy"),
        )
        for duplicate in self.duplicates():
            raise duplicate
        return config

    def enabled(self, value: object) -> frozenset[CheckName]:
        if value is None:
            return frozenset(CheckName)
        if not isinstance(value, list):
            raise self.fail(("enabled",), f"expected a list of check names, got {shown(value)}")
        names = [self.string(item, ("enabled",)) for item in value]
        unknown = sorted(set(names) - set(CheckName))
        if unknown:
            raise self.fail(("enabled",), f"unknown check {unknown[0]!r} (known: {', '.join(CheckName)})")
        return frozenset(CheckName(name) for name in names)

    def labeled_layers(self, doc: Mapping[str, Any], kind: str) -> dict[str, PolicyLayer]:
        layers: dict[str, PolicyLayer] = {}
        for block in self.blocks(doc, (), kind):
            label, body = self.label_of(block, kind)
            if label in layers:
                raise self.fail((kind, label), f"{kind} {label!r} is defined more than once", occurrence=1)
            layers[label] = self.layer(body, (kind, label))
        return layers

    def label_of(self, block: Mapping[str, Any], kind: str) -> tuple[str, Mapping[str, Any]]:
        if "__is_block__" in block or len(block) != 1:
            raise self.fail((kind,), f'needs one name, as in {kind} "name" {{ ... }}')
        ((quoted, body),) = block.items()
        label = self.string(quoted, (kind,))
        if not isinstance(body, Mapping) or "__is_block__" not in body:
            raise self.fail((kind, label), f'takes exactly one name, as in {kind} "name" {{ ... }}')
        if not label:
            raise self.fail((kind,), "the name must not be empty")
        return label, body

    def layer(self, body: Mapping[str, Any], where: Path) -> PolicyLayer:
        self.known_keys(body, where, LAYER_KEYS)
        utilization = self.single_block(body, where, "utilization") or {}
        at = where + ("utilization",)
        self.known_keys(utilization, at, UTILIZATION_KEYS)
        return PolicyLayer(
            max_session_lifetime=self.duration(body, where, "max_session_lifetime"),
            network_idle_timeout=self.duration(body, where, "network_idle_timeout"),
            grace_period=self.duration(utilization, at, "grace_period"),
            window=self.duration(utilization, at, "window", positive=True),
            operator=self.operator(utilization, at),
            thresholds=self.thresholds(self.single_block(utilization, at, "thresholds") or {}, at + ("thresholds",)),
        )

    def operator(self, body: Mapping[str, Any], where: Path) -> ThresholdOperator | None:
        if "operator" not in body:
            return None
        text = self.string(body["operator"], where + ("operator",))
        if text not in set(ThresholdOperator):
            raise self.fail(where + ("operator",), f'expected "all" or "any", got {text!r}')
        return ThresholdOperator(text)

    def thresholds(self, body: Mapping[str, Any], where: Path) -> dict[str, float | None]:
        found: dict[str, float | None] = {}
        for key, value in attributes(body).items():
            metric = _unquoted_key(key)
            at = where + (metric,)
            if self.known_metrics is not None and metric not in self.known_metrics:
                raise self.fail(at, f"unknown metric {metric!r} (known: {', '.join(sorted(self.known_metrics))})")
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise self.fail(at, f"expected a percentage (a number from 0 to 100) or null, got {shown(value)}")
            if value is not None and not 0 <= value <= 100:
                raise self.fail(at, f"must be a percentage from 0 to 100, got {value}")
            found[metric] = None if value is None else float(value)
        return found

    def duration(self, body: Mapping[str, Any], where: Path, key: str, *, positive: bool = False) -> float | None:
        if key not in body:
            return None
        at = where + (key,)
        raw = body[key]
        if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
            raise self.fail(at, f'expected a duration such as "10m" or a number of seconds, got {shown(raw)}')
        try:
            seconds = parse_duration(self.string(raw, at) if isinstance(raw, str) else raw)
        except ValueError as exc:
            raise self.fail(at, str(exc)) from None
        if positive and seconds <= 0:
            raise self.fail(at, f"must be longer than 0, got {shown(raw)}")
        return seconds

    def string(self, value: object, where: Path) -> str:
        """A quoted HCL string without its quotes (python-hcl2 8.x keeps them); no interpolation allowed."""
        if not isinstance(value, str):
            raise self.fail(where, f"expected a quoted string, got {shown(value)}")
        if len(value) < 2 or not value.startswith('"') or not value.endswith('"'):
            raise self.fail(where, f"expected a quoted string, got the expression {value}")
        if "${" in value or "%{" in value:
            raise self.fail(where, "interpolation is not allowed in a policy file")
        try:
            return str(json.loads(value)) if "\\" in value else value[1:-1]
        except ValueError:
            raise self.fail(where, f"unsupported escape in {value}") from None

    def single_block(self, body: Mapping[str, Any], where: Path, name: str) -> Mapping[str, Any] | None:
        found = self.blocks(body, where, name)
        if len(found) > 1:
            raise self.fail(where + (name,), "given more than once", occurrence=1)
        if found and isinstance(body[name], list) and "__is_block__" not in found[0]:
            raise self.fail(where + (name,), f"{name} takes no name: write {name} {{ ... }}")
        return found[0] if found else None

    def blocks(self, body: Mapping[str, Any], where: Path, name: str) -> list[Mapping[str, Any]]:
        """The bodies of block ``name`` (``name { }``), also accepting the attribute form ``name = { }``."""
        value = body.get(name)
        if value is None:
            return []
        if isinstance(value, Mapping):
            return [value]
        if isinstance(value, list) and all(isinstance(item, Mapping) for item in value):
            return value
        raise self.fail(where + (name,), f"expected a block, got {shown(value)}")


def _unquoted_key(key: str) -> str:
    return key[1:-1] if len(key) >= 2 and key.startswith('"') and key.endswith('"') else key
