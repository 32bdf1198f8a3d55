"""Python's cyclic garbage collector paused while a burst of objects is made that holds no cycles to free.

Decoding 100,000 stored sessions makes a few million objects; with the collector running, its collections walk the
ones made so far again and again (the young ones each time, every long-lived one whenever enough have aged), and
they cost about three times the decoding itself (``bench/scale_redis``: bench/README.md). Reference counting frees
everything as usual meanwhile; the collector resumes when the block ends, and its next collections count what was
made.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic collection within the block (synchronous code: an ``await`` inside would pause it for every task)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
