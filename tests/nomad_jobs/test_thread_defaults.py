"""The HPC thread count in a kernel's environment (pure): OMP_NUM_THREADS and friends default to the kernel's
allocated cores, rounded up (a fraction of a core still runs one thread), and the user's own value wins; the launcher's
"HPC threads" field sends exactly such values."""

from __future__ import annotations

from dataclasses import replace

import pytest

from nomad_jobs.session_job import HPC_THREAD_VARIABLES, vm_environment
from tests.nomad_jobs.test_kernel_network import cluster


@pytest.mark.parametrize(("cpu", "threads"), [("0.25", "1"), ("1", "1"), ("2.5", "3"), ("16", "16")])
def test_thread_variables_default_to_the_allocated_cores(cpu: str, threads: str) -> None:
    session = cluster(size=2)
    kernels = tuple(replace(k, resources={**k.resources, "cpu": cpu}) for k in session.kernels)
    session = replace(session, kernels=kernels)
    for kernel in session.kernels:
        env = vm_environment(session, kernel)
        assert {name: env[name] for name in HPC_THREAD_VARIABLES} == dict.fromkeys(HPC_THREAD_VARIABLES, threads)
    assert {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"} <= set(HPC_THREAD_VARIABLES)


def test_the_users_thread_count_overrides_the_default() -> None:
    session = replace(cluster(size=1), environ={"OMP_NUM_THREADS": "7", "MKL_NUM_THREADS": "7"})
    env = vm_environment(session, session.kernels[0])
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"], env["OPENBLAS_NUM_THREADS"]) == ("7", "7", "1")
