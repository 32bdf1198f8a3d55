"""The environment catalog (pure): the images Caravan offers, each a version (tag) of a named environment, with what
it is for, the apps it serves and its minimum and default resources, all declared by the image itself through labels
(as Backend.AI's ``ai.backend.service-ports``), read when an admin registers it (``registerEnvironment``):

- ``ai.caravan.environment``: the environment's name (``python``); else the reference's last path component;
- ``ai.caravan.title``, ``ai.caravan.description``: what it is for;
- ``ai.caravan.apps``: ``name:protocol:port`` separated by ``,`` (``jupyter:http:8888``), the session's apps when it
  declares none;
- ``ai.caravan.startup-command``: the session's startupCommand when it gives none (starts the apps);
- ``ai.caravan.resource.min.<slot>`` and ``ai.caravan.resource.default.<slot>`` (``cpu``, ``mem``, any slot):
  a session asking for less than the minimum is refused (``INVALID_INPUT`` on ``resources``); the defaults fill
  what the session and its preset leave out.

The catalog is the image allowlist: an image in it is allowed, whatever ``CARAVAN_DOCKER_IMAGES`` says; a retired
one is refused to new sessions (sessions already made keep running), even where the glob patterns would allow it.
Images neither registered nor retired are checked against the patterns, as before (the busybox images, committed
images). A user's committed images are listed with the catalog as the environment ``customized``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from docker_image.reference import Reference

from core.errors import InvalidInput
from domain.apps import App, AppProtocol, checked_apps
from domain.slots import InvalidQuantityError, SlotType, UnknownSlotError, from_user_input

LABEL = "ai.caravan."
NAME_LABEL = LABEL + "environment"
TITLE_LABEL = LABEL + "title"
DESCRIPTION_LABEL = LABEL + "description"
APPS_LABEL = LABEL + "apps"
STARTUP_LABEL = LABEL + "startup-command"
MIN_PREFIX = LABEL + "resource.min."
DEFAULT_PREFIX = LABEL + "resource.default."
CUSTOMIZED = "customized"
"""The environment name under which a user's committed images are listed."""
NAME_RULE = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,38}[a-z0-9])?$")
MAX_TEXT = 400
UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


@dataclass(frozen=True)
class EnvironmentImage:
    """One version of an environment: an image reference and what its labels declare."""

    image: str
    name: str
    tag: str
    title: str = ""
    description: str = ""
    apps: tuple[App, ...] = ()
    startup_command: str | None = None
    min_resources: dict[str, str] = field(default_factory=dict)
    default_resources: dict[str, str] = field(default_factory=dict)
    registered_at: datetime | None = None
    retired: bool = False

    def evolve(self, **changes: Any) -> EnvironmentImage:
        return replace(self, **changes)


def environment_of(
    image: str, labels: Mapping[str, str], *, now: datetime, name: str | None = None
) -> EnvironmentImage:
    """The catalog entry of ``image`` (a checked, tagged reference) from its ``labels``; ``name`` overrides the label.
    INVALID_INPUT on ``labels`` for a label that does not read, on ``name`` for a bad name."""
    parsed = Reference.parse_normalized_named(image)
    tag = str(parsed["tag"] or "")
    path = str(parsed["name"] or image.rsplit(":", 1)[0])
    chosen = name or labels.get(NAME_LABEL) or path.rsplit("/", 1)[-1]
    if not NAME_RULE.match(chosen) or chosen == CUSTOMIZED:
        raise InvalidInput(
            f"environment name {chosen[:60]!r} must be 1-40 lower-case letters, digits, '.', '_' or '-' "
            f"(and not {CUSTOMIZED!r}, which lists committed images)",
            field="name",
        )
    startup = labels.get(STARTUP_LABEL) or None
    return EnvironmentImage(
        image=image,
        name=chosen,
        tag=tag,
        title=_text(labels.get(TITLE_LABEL, "")),
        description=_text(labels.get(DESCRIPTION_LABEL, "")),
        apps=apps_of_label(labels.get(APPS_LABEL, "")),
        startup_command=_text(startup) if startup else None,
        min_resources=_resources(labels, MIN_PREFIX),
        default_resources=_resources(labels, DEFAULT_PREFIX),
        registered_at=now,
    )


def apps_of_label(value: str) -> tuple[App, ...]:
    """``jupyter:http:8888,tensorboard:http:6006`` as apps; INVALID_INPUT on ``labels`` when it does not read."""
    apps = []
    for item in filter(None, (part.strip() for part in value.split(","))):
        pieces = item.split(":")
        if len(pieces) != 3 or not pieces[2].isdigit():
            raise InvalidInput(f"label {APPS_LABEL}: {item[:60]!r} is not name:protocol:port", field="labels")
        name, protocol, port = pieces
        try:
            kind = AppProtocol(protocol.upper())
        except ValueError:
            raise InvalidInput(f"label {APPS_LABEL}: unknown protocol {protocol[:20]!r}", field="labels") from None
        apps.append(App(name=name, port=int(port), protocol=kind))
    return checked_apps(apps, field="labels")


def quantity(value: str) -> Decimal | None:
    """A resource amount (``0.5``, ``512m``, ``2g``) as a number to compare; None if it does not read."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgtKMGT]?)i?[bB]?\s*", value)
    if not match:
        return None
    try:
        return Decimal(match.group(1)) * UNITS[match.group(2).lower()]
    except InvalidOperation:
        return None


def check_minimum(entry: EnvironmentImage, slots: Mapping[str, str], known: Mapping[str, SlotType]) -> None:
    """Refuse (INVALID_INPUT on ``resources``) ``slots`` (a session's, normalized) below the environment's minimum;
    a minimum of a slot no agent knows is left to the scheduler (the session asks for none of it)."""
    have = from_user_input(slots, known)
    for slot, minimum in entry.min_resources.items():
        try:
            wanted = from_user_input({slot: minimum}, known).amount(slot)
        except (UnknownSlotError, InvalidQuantityError):
            continue
        if have.amount(slot) < wanted:
            raise InvalidInput(
                f"environment {entry.name} {entry.tag} needs at least {slot} {minimum}",
                field="resources",
            )


def allowed_patterns(patterns: Sequence[str], catalog: Mapping[str, EnvironmentImage]) -> tuple[str, ...]:
    """The operator's glob patterns plus the catalog's images in use (exact references: Docker's grammar, checked
    first, has no glob character)."""
    return (*patterns, *(e.image for e in catalog.values() if not e.retired))


def check_not_retired(image: str, catalog: Mapping[str, EnvironmentImage], *, field: str = "image") -> None:
    entry = catalog.get(image)
    if entry is not None and entry.retired:
        raise InvalidInput(f"environment {entry.name} {entry.tag} ({image}) is retired: choose another", field=field)


@dataclass(frozen=True)
class EnvironmentDefaults:
    """What a session of a catalog image gets when it leaves them out."""

    apps: tuple[App, ...]
    startup_command: str | None
    resources: dict[str, str]


def defaults_for(entry: EnvironmentImage | None) -> EnvironmentDefaults:
    if entry is None:
        return EnvironmentDefaults((), None, {})
    return EnvironmentDefaults(entry.apps, entry.startup_command, dict(entry.default_resources))


def _text(value: str) -> str:
    if len(value) > MAX_TEXT or not value.isprintable():
        raise InvalidInput(f"a label's text must be printable and at most {MAX_TEXT} characters", field="labels")
    return value


def _resources(labels: Mapping[str, str], prefix: str) -> dict[str, str]:
    found = {}
    for key, value in labels.items():
        if key.startswith(prefix):
            slot = key[len(prefix) :]
            if quantity(value) is None or not re.fullmatch(r"[a-z][a-z0-9_.-]{0,40}", slot):
                raise InvalidInput(f"label {key[:80]}={value[:20]!r} is not a resource amount", field="labels")
            found[slot] = value
    return dict(sorted(found.items()))
