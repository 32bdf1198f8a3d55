"""What a VM kernel takes (the qemu driver): its least memory, and the command and environment it carries. Pure.

A VM gets its command and environment as two fw_cfg items of plain base64 (``nomad_jobs.qemu`` puts them on QEMU's
command line): each item is one QEMU argument, which Linux caps at 128 KiB. Creation refuses what would not fit
(``domain.session_requests``), with the same encoding the job is rendered with.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping

MIN_MEMORY_MIB = 192
"""The least memory a VM gets. Nomad's qemu driver refuses less than 128 MiB, but the image ops/build-vm-image builds
needs about 160 MiB (its kernel and the unpacked initramfs): with 128 or 144 MiB it stopped at once with no output
(exit 67), so a margin above what boots."""
MAX_ITEM_BYTES = 120 * 1024
"""A fw_cfg item travels as one QEMU argument, and Linux caps one argument at 128 KiB (MAX_ARG_STRLEN)."""
USER_ENVIRON_BYTES = MAX_ITEM_BYTES - 16 * 1024
"""What a user's environment may take encoded: the rest is kept for Caravan's own variables."""


class PayloadTooLarge(ValueError):
    """The command or the environment does not fit in one QEMU argument."""


def command_item(command: str) -> str:
    item = base64.b64encode(command.encode()).decode()
    if len(item) > MAX_ITEM_BYTES:
        raise PayloadTooLarge(f"the command is {len(command.encode())} bytes, more than a VM takes")
    return item


def environ_item(environ: Mapping[str, str], limit: int = MAX_ITEM_BYTES) -> str:
    """``NAME BASE64`` lines (names are identifiers: no space, no newline)."""
    item = "".join(f"{name} {base64.b64encode(value.encode()).decode()}\n" for name, value in environ.items())
    if len(item) > limit:
        raise PayloadTooLarge(f"the environment takes {len(item)} bytes encoded, more than a VM takes")
    return item
