"""A job rendered anew keeps its groups' ``cpu``: the MHz per core it was rendered with is found back from it."""

from __future__ import annotations

from decimal import Decimal

import pytest

from nomad_jobs.session_job import cpu_mhz, mhz_rendered


@pytest.mark.parametrize("cores", ["0.001", "0.25", "0.3", "1", "1.5", "2", "3.7", "64"])
@pytest.mark.parametrize("mhz", [1, 999, 1000, 1001, 2399, 3100])
def test_the_rendered_mhz_renders_the_same_cpu(cores: str, mhz: int) -> None:
    cpu = cpu_mhz(Decimal(cores), mhz)
    found = mhz_rendered(cpu, Decimal(cores))
    assert found is not None and cpu_mhz(Decimal(cores), found) == cpu


def test_no_cores_no_answer() -> None:
    assert mhz_rendered(100, Decimal(0)) is None
