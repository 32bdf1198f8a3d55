"""bench/chaos's check of a session's final state: a batch session that ran out of its start retries is right only
in the one coherent state Caravan gives it (pure: the check alone, on the states the long run saw)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DETAIL = 'sub1: Setup Failure: failed to setup alloc: pre-run hook "network" failed (not started after 4 attempts)'


@cache
def chaos_module() -> ModuleType:
    """bench/chaos (a script without a .py suffix)."""
    path = Path(__file__).resolve().parents[2] / "bench" / "chaos"
    loader = importlib.machinery.SourceFileLoader("bench_chaos", str(path))
    spec = importlib.util.spec_from_loader("bench_chaos", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    loader.exec_module(module)
    return module


def shown(status: str, info: str, detail: str | None, exit_code: int | None) -> dict[str, Any]:
    return {"status": status, "statusInfo": info, "statusDetail": detail, "exitCode": exit_code}


@pytest.mark.parametrize(
    ("session", "right"),
    [
        (shown("ERROR", "failed-to-start", DETAIL, None), True),
        # the three wrong_final of the 1,100-fault run of session 13: the same give-up, ended otherwise
        (shown("TERMINATED", "terminating", None, None), False),
        (shown("TERMINATED", "task-failed", "main1: Terminated: Exit Code: 143", 143), False),
        (shown("ERROR", "failed-to-start", DETAIL, 143), False),  # a stray exit code from Caravan's own stop
        (shown("ERROR", "failed-to-start", "sub1: Driver Failure: image not found", None), False),  # not a give-up
        (shown("ERROR", "job-lost", DETAIL, None), False),
    ],
)
def test_only_the_coherent_give_up_is_a_true_final_state(session: dict[str, Any], right: bool) -> None:
    assert chaos_module().gave_up(session) is right
