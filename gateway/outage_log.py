"""Log lines about ``UNAVAILABLE`` answers, rate-limited per cause: an outage shows in the log without a line per
request.

Per cause (Redis, Nomad, an unreadable scheduler configuration, ...): the first answer logs one WARNING line with what
failed; while answers keep coming, a WARNING line every ``interval`` seconds counts them; once none came for
``interval`` seconds, an INFO line says the outage ended, with its totals. :class:`OutageLog` decides, from the times
it is given; :class:`OutageReporter` feeds it the clock and logs, waking itself to notice the quiet that ends one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from core.errors import TransientError, Unavailable

log = logging.getLogger(__name__)

INTERVAL = 30.0
"""Seconds between two count lines of one outage, and of quiet after which it is reported over."""


@dataclass(frozen=True)
class Line:
    level: int
    message: str


@dataclass
class _Outage:
    began: float
    """When its first answer was given (seconds on the clock the log is given)."""
    last: float
    """When its latest answer was given."""
    reported: float
    """When its latest line was logged."""
    total: int = 1
    unreported: int = 0
    """Answers given since its latest line."""


class OutageLog:
    """The lines to log about the ``UNAVAILABLE`` answers of each cause; pure (every time is given)."""

    def __init__(self, interval: float = INTERVAL) -> None:
        self.interval = interval
        self._outages: dict[str, _Outage] = {}

    @property
    def open(self) -> bool:
        """Whether some outage has not been reported over yet."""
        return bool(self._outages)

    def answered(self, cause: str, detail: str, now: float) -> list[Line]:
        """One more ``UNAVAILABLE`` error because of ``cause`` (``detail``: what failed, for the first line)."""
        lines = []
        outage = self._outages.get(cause)
        if outage is not None and now - outage.last >= self.interval:  # over, though nobody noticed yet
            lines.append(self._end(cause, outage, now))
            outage = None
        if outage is None:
            self._outages[cause] = _Outage(began=now, last=now, reported=now)
            lines.append(
                Line(
                    logging.WARNING,
                    f"answering UNAVAILABLE: {cause} ({detail}); a count of these errors "
                    f"follows every {self.interval:g} s while they last",
                )
            )
        else:
            outage.last, outage.total, outage.unreported = now, outage.total + 1, outage.unreported + 1
        return [*lines, *self.tick(now)]

    def tick(self, now: float) -> list[Line]:
        """The lines due at ``now``: counts of the outages going on, ends of those that went quiet."""
        lines = []
        for cause, outage in list(self._outages.items()):
            lines.extend(
                [self._end(cause, outage, now)]
                if now - outage.last >= self.interval
                else self._count(cause, outage, now)
            )
        return lines

    def _end(self, cause: str, outage: _Outage, now: float) -> Line:
        del self._outages[cause]
        return Line(
            logging.INFO,
            f"no more UNAVAILABLE errors for {cause}: none for {now - outage.last:.0f} s; "
            f"{outage.total} in all over {outage.last - outage.began:.0f} s",
        )

    def _count(self, cause: str, outage: _Outage, now: float) -> list[Line]:
        if not outage.unreported or now - outage.reported < self.interval:
            return []
        line = Line(
            logging.WARNING,
            f"still answering UNAVAILABLE: {cause}: {outage.unreported} errors in the last "
            f"{now - outage.reported:.0f} s, {outage.total} since it began "
            f"{now - outage.began:.0f} s ago",
        )
        outage.reported, outage.unreported = now, 0
        return [line]


def outage_of(error: BaseException) -> tuple[str, str]:
    """(cause, detail) of an outage an ``UNAVAILABLE`` answer reports: Redis and Nomad by name, others by the first
    part of their message."""
    cause = error.__cause__ if isinstance(error, Unavailable) and error.__cause__ is not None else error
    if isinstance(cause, RedisConnectionError | RedisTimeoutError):
        return "Redis", str(cause) or type(cause).__name__
    if isinstance(cause, TransientError):
        return "Nomad", str(cause)
    if isinstance(error, Unavailable):
        return error.message.partition(":")[0], error.message
    return "network", f"{type(error).__name__}: {error}"


class OutageReporter:
    """Logs what :class:`OutageLog` decides, with the monotonic clock; one per gateway process."""

    def __init__(
        self, interval: float = INTERVAL, clock: Callable[[], float] = time.monotonic, logger: logging.Logger = log
    ) -> None:
        self.outages = OutageLog(interval)
        self.clock = clock
        self.logger = logger
        self._timer: asyncio.TimerHandle | None = None
        self._timer_loop: asyncio.AbstractEventLoop | None = None

    def answered(self, error: BaseException) -> None:
        """An ``UNAVAILABLE`` answer is being given because of ``error``."""
        cause, detail = outage_of(error)
        self._log(self.outages.answered(cause, detail, self.clock()))
        self._wake_later()

    def _tick(self) -> None:
        self._timer = None
        self._log(self.outages.tick(self.clock()))
        self._wake_later()

    def _wake_later(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (the schema run synchronously): the next answer logs what is due
            return
        if not self.outages.open or (self._timer is not None and self._timer_loop is loop):
            return
        self._timer, self._timer_loop = loop.call_later(self.outages.interval / 2, self._tick), loop

    def _log(self, lines: list[Line]) -> None:
        for line in lines:
            self.logger.log(line.level, "%s", line.message)
