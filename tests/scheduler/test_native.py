"""The scheduling pass runs compiled (``ops/build-native``: mypyc), from its current sources, and its pure-Python
modules (the fallback when the extensions are missing) decide exactly what the recorded passes decided."""

from __future__ import annotations

import hashlib
import importlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = [
    line for line in (ROOT / "ops" / "native-modules").read_text().splitlines() if line and not line.startswith("#")
]
BUILD = Path(sys.prefix) / "native-build.json"  # written by ops/build-native into the venv


def _module_name(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


def test_the_pass_runs_compiled_from_its_current_sources() -> None:
    assert BUILD.exists(), "the scheduling pass is not compiled: run ./ops/build-native (./ops/install runs it)"
    built = json.loads(BUILD.read_text())["sources"]
    assert sorted(built) == sorted(MODULES)
    for path in MODULES:
        module = importlib.import_module(_module_name(path))
        assert str(module.__file__).endswith(".so"), f"{path} runs interpreted"
        current = hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
        assert current == built[path], f"{path} changed since it was compiled: run ./ops/build-native"


_PURE_REPLAY = """
import importlib.util, json, sys

ROOT, NAMES = sys.argv[1], set(sys.argv[2:])


class SourcesFirst:  # the listed modules from their .py files, as when no extension is built
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name in NAMES:
            return importlib.util.spec_from_file_location(name, f"{ROOT}/{name.replace('.', '/')}.py")
        return None


sys.meta_path.insert(0, SourcesFirst)
from tests.scheduler.replay import FIXTURE, cases, digest
import scheduler.scheduling_pass

recorded = json.loads(FIXTURE.read_text())
differ = [case.name for case in cases() if digest(case) != recorded[case.name]]
print(json.dumps({"file": scheduler.scheduling_pass.__file__, "cases": len(recorded), "differ": differ}))
"""


def test_the_pure_python_fallback_replays_the_recorded_decisions() -> None:
    names = [_module_name(path) for path in MODULES]
    done = subprocess.run(
        [sys.executable, "-c", _PURE_REPLAY, str(ROOT), *names], cwd=ROOT, capture_output=True, text=True, check=True
    )
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["file"].endswith("scheduler/scheduling_pass.py")
    assert outcome["cases"] > 0
    assert outcome["differ"] == []
