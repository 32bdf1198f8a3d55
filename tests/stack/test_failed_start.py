"""A part of the stack that never becomes ready is stopped, not left running (ops/dev and the tests start them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from caravan.stack.nomad_agent import start_nomad_dev
from caravan.stack.processes import StartupFailed
from tests.conftest import STACK


def running_with(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.skipif("CARAVAN_NOMAD_HOME" not in STACK, reason="ops/install-nomad builds Nomad")
@pytest.mark.nomad  # starts an agent of its own
def test_a_nomad_agent_that_never_gets_ready_is_stopped(tmp_path: Path) -> None:
    state = tmp_path / "never-ready"
    with pytest.raises(StartupFailed, match="no-such-driver"):
        start_nomad_dev(
            state,
            nomad_home=Path(STACK["CARAVAN_NOMAD_HOME"]),
            rootfs=Path(STACK["CARAVAN_ROOTFS"]),
            want_drivers=("no-such-driver",),
            log=tmp_path / "nomad.log",
            timeout=8,
        )
    assert running_with(str(state / "nomad.hcl")) == []
    assert f" {state}/" not in Path("/proc/self/mounts").read_text()
