"""A kernel as a QEMU virtual machine: the qemu driver's task config, and its exit code read back. Pure.

A Caravan VM image (``ops/build-vm-image``) is a directory holding ``vmlinux`` (a Linux kernel ELF,
booted through its PVH entry by the qboot firmware: no BIOS, no decompression) and ``initrd.img``
(busybox and an ``/init``). Operators allowlist images by name (``CARAVAN_QEMU_IMAGES``); the
Nomad agent's qemu ``image_paths`` must contain their directories, since ``initrd.img`` is the task's
``image_path`` (attached to no guest device: ``-kernel``/``-initrd`` load it).

The init reads what to run from two fw_cfg items, both plain base64 so that neither QEMU's option
syntax (``,``), Nomad's interpolation (``${``) nor a shell ever sees a user byte:
``opt/caravan/command`` (the command) and ``opt/caravan/environ`` (``NAME BASE64`` lines). It runs
``/bin/sh -c <command>`` with stdout on the first serial port (the task's stdout: Nomad runs QEMU
``-nographic``) and stderr on the second (QEMU's stderr), then reports the exit code through QEMU's
``isa-debug-exit`` device, which makes QEMU exit with ``(value << 1) | 1``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal
from pathlib import PurePosixPath

from domain.vm import command_item, environ_item
from nomad_jobs.hcl import runtime_text

KERNEL_FILE = "vmlinux"
INITRD_FILE = "initrd.img"
KERNEL_COMMAND_LINE = "console=ttyS0 quiet loglevel=1 panic=-1 cryptomgr.notests"
"""Only panics reach the console; a panic reboots, which ``-no-reboot`` turns into QEMU exiting."""
EXIT_PORT = 0xF4
HIGHEST_EXIT_CODE = 126
"""The init writes ``min(code, 126) + 1``: QEMU then exits with an odd status of at least 3 (8 bits hold
up to 255), apart from its own 0 (stopped from outside) and 1 (failed to start). So 0-125 arrive exactly,
and 126 means 126 or more (137 after a SIGKILL reads as 126)."""


def driver_config(image_dir: str, command: str, environ: Mapping[str, str], cores: Decimal) -> dict[str, object]:
    """The qemu task's ``config``: the allowlisted image at ``image_dir`` running ``command`` with ``environ``."""
    image = PurePosixPath(image_dir)
    args = [
        "-bios",
        "qboot.rom",  # QEMU's minimal firmware: boots the PVH kernel directly and prints nothing
        "-nodefaults",
        "-no-user-config",  # no default NIC (the guest must not reach the host's loopback), no VGA
        "-snapshot",  # the image file is shared by every VM: never written, never write-locked
        "-no-reboot",
        "-serial",
        "stdio",
        "-serial",
        "file:/dev/stderr",
        "-device",
        f"isa-debug-exit,iobase={EXIT_PORT:#x},iosize=0x01",
        "-kernel",
        str(image / KERNEL_FILE),
        "-initrd",
        str(image / INITRD_FILE),
        "-append",
        KERNEL_COMMAND_LINE,
        "-fw_cfg",
        f"name=opt/caravan/command,string={command_item(command)}",
    ]
    if environ:  # QEMU refuses an empty string item
        args += ["-fw_cfg", f"name=opt/caravan/environ,string={environ_item(environ)}"]
    vcpus = max(1, math.ceil(cores))
    if vcpus > 1:  # each vCPU is brought up under software emulation: one boots faster than two
        args += ["-smp", str(vcpus)]
    return {
        "image_path": runtime_text(str(image / INITRD_FILE)),
        "drive_interface": "none",
        "accelerator": "tcg",
        "args": [runtime_text(a) for a in args],
    }


def guest_exit_code(qemu_status: int) -> int | None:
    """The command's exit code from QEMU's exit status; None when the guest reported none."""
    if qemu_status >= 3 and qemu_status % 2 == 1:
        return (qemu_status - 3) // 2
    return None
