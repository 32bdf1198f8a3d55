"""The INFERENCE options of a createSession request, checked. Pure: no I/O.

``replicas``, ``servicePort``, ``healthCheckPath`` and ``healthCheckGrace`` belong to INFERENCE sessions only;
an INFERENCE session needs a service port (its replicas are health-checked on it) and a startup command
(the server it runs). Each failure names the offending field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.durations import duration_input
from core.errors import InvalidInput
from domain.autoscaling import ScalingRequest, ScalingRules, initial_replicas, rules_of_request
from domain.inference import MAX_REPLICAS
from domain.model import SessionType

MIN_SERVICE_PORT, MAX_SERVICE_PORT = 1024, 65535
MAX_PATH_LENGTH = 1024
HEALTH_CHECK_PATH_RULE = re.compile(r"^/[A-Za-z0-9\-._~!$&'()*+,;=:@%/?]*$")
"""An absolute HTTP path (and query) of RFC 3986 characters. No braces: Nomad's client interpolates ``${…}``
in check paths, and no spaces or control characters: they cannot be sent in a request line."""
MIN_GRACE_SECONDS, MAX_GRACE_SECONDS = 1.0, 3600.0
INFERENCE_ONLY = ("replicas", "servicePort", "healthCheckPath", "healthCheckGrace", "autoscaling")


@dataclass(frozen=True)
class ServiceOptions:
    """What a checked INFERENCE request asks of its service."""

    replicas: int
    port: int
    health_check_path: str | None = None
    """None: a TCP connect check."""
    health_check_grace: float | None = None
    """Seconds; None: the default grace (``nomad_jobs.replica_service.DEFAULT_GRACE_SECONDS``)."""
    autoscaling: ScalingRules | None = None
    """None: ``replicas`` for good."""


def checked_service_options(
    session_type: SessionType,
    *,
    replicas: int | None,
    service_port: int | None,
    health_check_path: str | None,
    health_check_grace: str | None,
    cluster_size: int,
    startup_command: str | None,
    autoscaling: ScalingRequest | None = None,
) -> ServiceOptions | None:
    """The request's service options; ``None`` for a session that is not INFERENCE (which must give none)."""
    if session_type is not SessionType.INFERENCE:
        given = dict(
            zip(
                INFERENCE_ONLY,
                (replicas, service_port, health_check_path, health_check_grace, autoscaling),
                strict=True,
            )
        )
        for field_name, value in given.items():
            if value is not None:
                raise InvalidInput(f"{field_name} is only for INFERENCE sessions", field=field_name)
        return None
    if not (startup_command or "").strip():
        raise InvalidInput(
            "an INFERENCE session needs a startupCommand: the server its replicas run", field="startupCommand"
        )
    if service_port is None:
        raise InvalidInput(
            "an INFERENCE session needs a servicePort: the port its replicas serve and are health-checked on",
            field="servicePort",
        )
    if not MIN_SERVICE_PORT <= service_port <= MAX_SERVICE_PORT:
        raise InvalidInput(
            f"servicePort {service_port} is outside {MIN_SERVICE_PORT}-{MAX_SERVICE_PORT}", field="servicePort"
        )
    rules = rules_of_request(autoscaling) if autoscaling is not None else None
    count = 1 if replicas is None else replicas
    if not 1 <= count <= MAX_REPLICAS:
        raise InvalidInput(f"replicas must be between 1 and {MAX_REPLICAS}", field="replicas")
    if rules is not None:
        count = initial_replicas(rules, replicas)
    if cluster_size != 1:
        raise InvalidInput("an INFERENCE session scales with replicas: clusterSize must be 1", field="clusterSize")
    if health_check_path is not None and (
        len(health_check_path) > MAX_PATH_LENGTH or not HEALTH_CHECK_PATH_RULE.match(health_check_path)
    ):
        raise InvalidInput(
            f"healthCheckPath must be an absolute HTTP path such as /healthz (at most "
            f"{MAX_PATH_LENGTH} characters, no spaces or braces)",
            field="healthCheckPath",
        )
    grace = duration_input("healthCheckGrace", health_check_grace, minimum=MIN_GRACE_SECONDS, maximum=MAX_GRACE_SECONDS)
    return ServiceOptions(count, service_port, health_check_path, grace, rules)
