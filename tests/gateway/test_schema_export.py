"""The committed SDL (gateway/graphql/schema.graphql) is the schema's: schema changes show up in review."""

from __future__ import annotations

import difflib

import pytest

from gateway.graphql.export import COMMAND, SCHEMA_FILE, main, sdl


def test_committed_schema_is_current() -> None:
    committed = SCHEMA_FILE.read_text() if SCHEMA_FILE.exists() else ""
    if committed != sdl():
        diff = "".join(
            difflib.unified_diff(
                committed.splitlines(True), sdl().splitlines(True), "schema.graphql (committed)", "schema.as_str()", n=1
            )
        )
        pytest.fail(f"{SCHEMA_FILE.name} is stale; regenerate it with: {COMMAND}\n{diff[:4000]}", pytrace=False)


def test_export_check_fails_on_drift(tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "schema.graphql"  # type: ignore[operator]
    monkeypatch.setattr("gateway.graphql.export.SCHEMA_FILE", stale)
    assert main(["--check"]) == 1
    stale.write_text(sdl().replace("type Query", "type Qeury"))
    assert main(["--check"]) == 1
    assert main([]) == 0 and stale.read_text() == sdl()
    assert main(["--check"]) == 0
