"""Where the plugin reads a reservation's load (:class:`node_plugins.devices.sim.state.StateDir`), on real files: the
file a task wrote in its allocation's shared directory under the client's ``alloc_dir``, else the reservation's own
(raw_exec's). The task owns that directory and the plugin runs as root: a symlink, a FIFO or a device node there is
never read."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from node_plugins.devices.sim.inventory import Load
from node_plugins.devices.sim.state import LOCATE_PERIOD, StateDir, task_load_name

IDS = ["gpu0-s0", "gpu0-s1"]


def reserved(tmp_path: Path) -> tuple[StateDir, str, Path]:
    """A state directory with one reservation of :data:`IDS`, and the shared directory of the allocation holding it."""
    state = StateDir(tmp_path / "state", tmp_path / "alloc")
    state.create()
    reservation = state.reserve(IDS).name
    for other in ("a1", "a2"):  # other allocations, with no load file
        (tmp_path / "alloc" / other / "alloc").mkdir(parents=True)
    shared = tmp_path / "alloc" / "a3" / "alloc"
    shared.mkdir(parents=True)
    return state, reservation, shared


def load_of(state: StateDir) -> Load | None:
    return state.loads(IDS)[IDS[0]][0]


def test_the_task_s_file_in_its_allocation_is_read_first(tmp_path: Path) -> None:
    state, reservation, shared = reserved(tmp_path)
    settled = time.time() - 60
    for allocation in (tmp_path / "alloc").iterdir():
        os.utime(allocation / "alloc", (settled, settled))
    assert load_of(state) == Load(0.0, 0)  # the reservation's own file, as made; the allocations listed
    (shared / task_load_name(reservation)).write_text("util=85 mem_mib=2048\n")
    time.sleep(LOCATE_PERIOD)
    assert load_of(state) == Load(85.0, 2048)  # its allocation changed since: listed again
    fresh = StateDir(state.root, tmp_path / "alloc")  # a restarted plugin finds it again
    assert load_of(fresh) == Load(85.0, 2048)
    assert fresh.loads(IDS)[IDS[1]] == (Load(85.0, 2048), 2)


def test_without_an_alloc_dir_only_the_reservation_s_file_is_read(tmp_path: Path) -> None:
    state, reservation, shared = reserved(tmp_path)
    (shared / task_load_name(reservation)).write_text("util=85\n")
    (state.reservations / reservation / "load").write_text("util=7\n")
    assert load_of(StateDir(state.root)) == Load(7.0, 0)


def test_a_symlink_or_a_fifo_in_the_allocation_is_not_read(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("util=99 mem_mib=99\n")
    secret.chmod(0o600)
    state, reservation, shared = reserved(tmp_path)
    (shared / task_load_name(reservation)).symlink_to(secret)
    assert load_of(StateDir(state.root, tmp_path / "alloc")) == Load(0.0, 0)

    (shared / task_load_name(reservation)).unlink()
    os.mkfifo(shared / task_load_name(reservation))
    found: list[Load | None] = []
    reader = threading.Thread(target=lambda: found.append(load_of(StateDir(state.root, tmp_path / "alloc"))))
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked opening the FIFO: unblock it, then fail
        os.close(os.open(shared / task_load_name(reservation), os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
        raise AssertionError("the plugin opened a FIFO a task made for reading")
    assert found == [Load(0.0, 0)]
