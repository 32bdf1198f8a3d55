"""The session reader and writer before ``core.codec`` (``Session.to_json``/``from_json`` and ``core.clock``'s ISO
helpers at 1171ae4, verbatim but for being functions): the reference the codec is held to, and what a rolled-back
Caravan would read the codec's documents with."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime

from domain.model import ClusterMode, Driver, Kernel, Session, SessionResult, SessionStatus, SessionType, StatusChange

KERNEL_MOMENTS = ("started_at", "finished_at")


def to_iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def from_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def session_to_json(self: Session) -> str:
    doc = asdict(self)
    for moment in ("created_at", "starts_at", "started_at"):
        doc[moment] = to_iso(doc[moment]) if doc[moment] else None
    doc["status_history"] = [
        {"status": c.status.value, "at": to_iso(c.at), "reason": c.reason, "detail": c.detail}
        for c in self.status_history
    ]
    for kernel in doc["kernels"]:
        for moment in KERNEL_MOMENTS:
            kernel[moment] = to_iso(kernel[moment]) if kernel[moment] else None
    return json.dumps(doc, separators=(",", ":"))


ADDED_SINCE = ("apps", "mounts", "autoscaling", "scaling", "revision", "previous", "preferred_ports_taken")
"""Session fields added after 1171ae4, which this reader never knew (their tests are in tests/core/test_codec.py)."""


def session_from_json(text: str | bytes) -> Session:
    doc = json.loads(text)
    for name in ADDED_SINCE:  # not the old reader's: the session takes the field's default
        doc.pop(name, None)
    doc["type"] = SessionType(doc["type"])
    doc["driver"] = Driver(doc["driver"])
    doc["status"] = SessionStatus(doc["status"])
    doc["result"] = SessionResult(doc["result"])
    doc["cluster_mode"] = ClusterMode(doc["cluster_mode"])
    for moment in ("created_at", "starts_at", "started_at"):
        doc[moment] = from_iso(doc[moment]) if doc.get(moment) else None
    doc["status_history"] = tuple(
        StatusChange(SessionStatus(c["status"]), from_iso(c["at"]), c["reason"], c.get("detail"))
        for c in doc["status_history"]
    )
    doc["kernels"] = tuple(
        Kernel(
            **{
                **k,
                "status": SessionStatus(k["status"]),
                "ports": tuple(k.get("ports", ())),
                **{m: from_iso(k[m]) if k.get(m) else None for m in KERNEL_MOMENTS},
            }
        )
        for k in doc["kernels"]
    )
    for listed in ("wait_reasons", "dependencies", "preopen_ports"):
        doc[listed] = tuple(doc.get(listed, ()))
    return Session(**doc)
