"""The Nomad clients the tests start share this machine's Docker daemon with ./ops/dev's and with each other: none may
run Nomad's dangling-container reconciler, which removes every running Nomad container its own client does not track
(another agent's kernels, once 5 minutes old; seen on the multi-host cluster: a kernel on one host killed, exit 137, by
the other host's client). Read from the running agent's own configuration (``/v1/agent/self``)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from caravan.stack.nomad_agent import NomadAgent

pytestmark = [pytest.mark.nomad, pytest.mark.docker]


def docker_config(agent: NomadAgent) -> dict[str, Any]:
    request = urllib.request.Request(f"{agent.addr}/v1/agent/self", headers={"X-Nomad-Token": agent.token or ""})
    with urllib.request.urlopen(request, timeout=10) as answer:
        found = json.load(answer)
    [plugin] = [p for p in found["config"]["Plugins"] if p["Name"] == "docker"]
    config: dict[str, Any] = plugin["Config"]
    return config


def test_the_tests_agent_runs_no_dangling_container_reconciler(nomad_agent: NomadAgent) -> None:
    gc = docker_config(nomad_agent).get("gc")
    assert gc, "the docker plugin's gc block is missing"
    [block] = gc if isinstance(gc, list) else [gc]
    [dangling] = (
        block["dangling_containers"]
        if isinstance(block["dangling_containers"], list)
        else [block["dangling_containers"]]
    )
    assert dangling["enabled"] is False  # the old config: no block, Nomad's default (enabled, 5 minutes' grace)
