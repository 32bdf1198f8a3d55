"""The utilization series as the idle leader stores them (append per sweep, rewrite compacted now and then) and the
gateway reads them, on a real Redis."""

from __future__ import annotations

from datetime import UTC, datetime

from redis.asyncio import Redis

from core.keys import Keys
from core.lease import Lease
from domain.idle.series import MAX_POINTS, SERIES_RETENTION, point
from stores.idle import IdleStore


async def test_a_long_life_stays_bounded_in_redis_and_expires_after_the_retention(redis: Redis, keys: Keys) -> None:
    store = IdleStore(redis, keys)
    fence = await Lease(redis, keys.idle_lease, keys.idle_fence, ttl=10).acquire()
    assert fence is not None
    lengths: dict[str, int] = {}
    sweeps = 3 * MAX_POINTS
    rewrites = 0
    for i in range(sweeps):
        new = {"s": point(1000.0 + 15 * i, {"k1": {"cpu_util": 50.0}}, {"cpu_util": 10.0})}
        appended, rewritten = await store.series_to_write(new, lengths)
        rewrites += len(rewritten)
        at = datetime.fromtimestamp(1000.0 + 15 * i, UTC)
        await store.save_sweep(fence, checked_at=at, verdicts={}, ttl=30, series_appended=appended,
                               series_rewritten=rewritten)  # fmt: skip
        assert await redis.llen(keys.idle_series("s")) == lengths["s"] <= MAX_POINTS * 3 // 2
    points = await store.series("s")
    assert 0 < rewrites < sweeps // 10  # now and then, not each sweep
    assert sum(p.weight for p in points) == sweeps and points[-1].until == 1000.0 + 15 * (sweeps - 1)
    assert {p.kernels["k1"]["cpu_util"] for p in points} == {50.0}
    assert 0 < await redis.ttl(keys.idle_series("s")) <= SERIES_RETENTION

    lengths.clear()  # a new leader: reads the stored length, appends after it
    appended, _ = await store.series_to_write({"s": point(1e6, {"k1": {"mem": 1.0}}, {})}, lengths)
    assert lengths["s"] == len(points) + 1 and list(appended) == ["s"]
    assert await store.series("nothing") == []
