"""The chaos run's short version (``bench/chaos``), as CI runs it: Caravan's processes, the multi-host cluster's
Nomad servers and clients (killed, their RPC cut, their host's link cut), the Redis primary and HAProxy hit at random,
three at a time, under a steady stream of two tenants' sessions (batch, interactive, cluster, a folder written by
sessions, an inference endpoint under light load through HAProxy, a schedule firing); nothing acknowledged may be lost,
duplicated, left in a wrong final state or with an orphaned job, route or volume, every request (GraphQL or to the
endpoint) answered, success or typed, every schedule run exactly once, every file written found, no tenant may read the
other's session and no revoked token may be let in.

Only the fault kinds that recover within seconds are drawn (not the leaders killed or paused, which wait out a 10 s
lease), so that enough faults fit in CI's time. A Nomad client killed is drawn since it no longer ends a BATCH
session ERROR (an allocation whose network set-up the kill interrupted is placed again: ``domain.start_retry``).
The run starts its own multi-host cluster: it runs before ``test_multihost.py`` (whose cluster, once up, stays up for
the session; one such cluster per machine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from caravan.stack import multihost

FAST = (
    "gateway_kill,gateway_term,scheduler_term_leader,idle_term_leader,nomad_leader,nomad_client,nomad_client_rpc_cut,"
    "host_network_cut,redis_primary,haproxy_kill"
)
FAULTS = 50


@pytest.mark.slow
@pytest.mark.redis
@pytest.mark.nomad
@pytest.mark.cluster
def test_a_short_chaos_run_loses_nothing(tmp_path: object) -> None:
    owner = multihost.RECORDS / "owner"
    if owner.exists() and owner.read_text().strip() == str(os.getpid()):
        pytest.skip("this session's multi-host cluster is up already (one per machine): run this test on its own")
    done = subprocess.run(
        [
            sys.executable,
            str(multihost.PROJECT / "bench" / "chaos"),
            f"--faults={FAULTS}",
            f"--kinds={FAST}",
            "--lanes=3",
            "--no-calm",
            "--settle=90",
            f"--state={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        cwd=multihost.PROJECT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["faults"] == FAULTS, summary
    failures = {
        name: summary[name]
        for name in (
            "lost",
            "duplicated",
            "orphaned",
            "wrong_final",
            "unacknowledged",
            "cross_tenant",
            "revoked_accepted",
        )
        if summary[name]
    }
    assert failures == {}, done.stdout[-4000:]
    assert summary["jobs_per_session_max"] <= 1, summary
    assert summary["requests"]["untyped_errors"] == 0 and summary["requests"]["hangs"] == 0, done.stdout[-4000:]
    assert all(line["unrecovered"] == 0 for line in summary["per_kind"].values()), summary["per_kind"]
    schedule = summary["schedule"]
    assert schedule["runs_started"] >= 1 and schedule_clean(schedule), schedule
    assert summary["folder_writes"] >= 1 and summary["folder_missing"] == 0, done.stdout[-4000:]
    endpoint = summary["endpoint"]
    # the bench prints the first answers it could not type, the summary only counts them
    untyped = [line for line in done.stdout.splitlines() if line.startswith(("endpoint untyped:", "untyped:"))]
    assert endpoint["answers"].get("200") and endpoint["untyped"] == 0 and endpoint["hangs"] == 0, (endpoint, untyped)
    # the orphaned-route check reads HAProxy's maps; what it read of each is printed
    routes = [line for line in done.stdout.splitlines() if line.startswith(('{"routes_read"', '{"routes_unreadable"'))]
    assert summary["routes_seen_live"] > 0, (summary, routes)


def schedule_clean(schedule: dict[str, object]) -> bool:
    """Every run of the schedule exactly once, each ended with its command's 0."""
    return schedule["duplicated"] == schedule["lost"] == schedule["wrong_final"] == 0
