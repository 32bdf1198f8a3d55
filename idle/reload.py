"""The idle policy in force, and reloading it from its file without a restart.

The file is read at start (a broken file then stops the checker from starting: better than running a
policy nobody wrote). Afterwards :meth:`PolicySource.refresh` re-reads it; the idle service calls it
before every sweep and at once on SIGHUP. A changed file that parses replaces the policy; one that
does not is refused with ``file:line: reason`` in the log (once per distinct content) and the previous
policy stays in force.

Without a file the built-in defaults apply (:data:`domain.idle.config.BUILTIN_DEFAULTS`, a 15 s sweep): every
check is off, so the checker reports but reclaims nothing. Backend.AI does the same: sessions are
reclaimed only once an administrator configures its idle checkers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

from devices.catalog import DeviceCatalog
from domain.idle.config import IdlePolicyConfig
from domain.idle.policy_file import PolicyFileError, parse_policy, read_policy_text
from stores.idle import PublishedPolicy

log = logging.getLogger(__name__)

BUILT_IN = "built-in"


class PolicySource:
    def __init__(self, path: Path | None, devices: DeviceCatalog | None = None) -> None:
        """Load the policy at ``path`` (or the built-in one); raises :class:`PolicyFileError` if it is broken.
        ``devices``: the device names in force (their metrics may have thresholds)."""
        self.path = path
        self.devices = devices
        text = read_policy_text(path) if path is not None else ""
        self.published = PublishedPolicy(source=str(path) if path is not None else BUILT_IN, text=text)
        self.config: IdlePolicyConfig = parse_policy(text, self.published.source, devices)
        self._refused: str | None = None
        """What was last refused (the broken text, or why the file could not be read): reported once, not every
        sweep."""
        log.info("idle policy from %s: check every %gs", self.published.source, self.config.check_interval)

    def refresh(self) -> bool:
        """Re-read the file; True when a new policy is now in force."""
        if self.path is None:
            return False
        try:
            text = read_policy_text(self.path)
        except PolicyFileError as exc:
            self._refuse(exc, str(exc))
            return False
        if text == self.published.text:
            self._refused = None  # back to the policy in force: a later breakage is news again
            return False
        if text == self._refused:
            return False
        try:
            config = parse_policy(text, str(self.path), self.devices)
        except PolicyFileError as exc:
            self._refuse(exc, text)
            return False
        self.published = PublishedPolicy(source=str(self.path), text=text)
        self.config = config
        self._refused = None
        log.info("idle policy reloaded from %s: check every %gs", self.path, config.check_interval)
        return True

    def _refuse(self, error: PolicyFileError, what: str) -> None:
        if what != self._refused:
            log.error("idle policy refused, the previous one stays in force: %s", error)
            self._refused = what


@contextlib.contextmanager
def reload_on_sighup(request_reload: Callable[[], None]) -> Iterator[None]:
    """Within the block, SIGHUP to this process calls ``request_reload`` (on the running event loop)."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, request_reload)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGHUP)
