"""The gateway passes every audit of npm graphql-http's serverAudits, warnings and notices included."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest

from tests.harness import Caravan

AUDIT = Path(__file__).with_name("audit")


async def run_audit(url: str) -> list[dict[str, object]]:
    node = shutil.which("node")
    if node is None or not (AUDIT / "node_modules" / "graphql-http").is_dir():
        pytest.fail("Node.js and the audit's node modules are needed: run ./ops/install")
    # Asynchronously: the gateway under audit answers from this same event loop.
    process = await asyncio.create_subprocess_exec(
        node,
        str(AUDIT / "audit.mjs"),
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode == 0, stderr.decode()
    results: list[dict[str, object]] = json.loads(stdout)
    return results


async def test_graphql_http_server_audits_all_pass(caravan: Caravan, capsys: pytest.CaptureFixture[str]) -> None:
    results = await run_audit(caravan.url)
    tally = {status: sum(r["status"] == status for r in results) for status in ("ok", "notice", "warn", "error")}
    with capsys.disabled():
        print(
            f"\ngraphql-http audit: {tally['ok']} passed, {tally['notice']} notices, "
            f"{tally['warn']} warnings, {tally['error']} errors"
        )
    failed = [r for r in results if r["status"] != "ok"]
    assert not failed, json.dumps(failed, indent=2)
    assert len(results) >= 60  # the suite did run (graphql-http 1.23.1 has 61 audits)
