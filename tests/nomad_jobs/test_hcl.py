"""The literal encoder, without Nomad (tests/e2e/test_hostile_strings.py checks against Nomad's parse)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import hcl2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nomad_jobs.hcl import Block, identifier, literal, render, runtime_text
from tests.conftest import STACK


@pytest.mark.parametrize(
    ("text", "encoded"),
    [
        ("plain", '"plain"'),
        ('a "quoted" word', '"a \\u0022quoted\\u0022 word"'),
        ("${x}", '"$${x}"'),
        ("%{if}", '"%%{if}"'),
        ("$${x}", '"$$${x}"'),
        ("back\\slash", '"back\\\\slash"'),
        ("new\nline\ttab\r", '"new\\nline\\ttab\\r"'),
        ("bell\x07 del\x7f", '"bell\\u0007 del\\u007f"'),
        ("ünï ✓", '"ünï ✓"'),
    ],
)
def test_literal(text: str, encoded: str) -> None:
    assert literal(text) == encoded


def test_runtime_text_escapes_one_more_template_level() -> None:
    assert runtime_text("${a} %{b} $c") == "$${a} %%{b} $c"


@pytest.mark.parametrize("name", ["9lives", "a b", "a.b", "", 'x"'])
def test_identifiers_are_never_quoted_so_only_plain_names_pass(name: str) -> None:
    with pytest.raises(ValueError):
        identifier(name)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=40))
def test_any_text_stays_one_attribute_of_one_block(text: str) -> None:
    # python-hcl2's reader (the oracle here) rejects an escaped "$${" or "%%{" with no "}" after it, and any "%%{" in
    # an object key, all of which Nomad reads correctly: test_template_escapes_read_back_through_nomad checks those
    # against Nomad's own parser, tests/e2e/test_hostile_strings.py hostile keys.
    while "${" in text or "%{" in text:  # until none is left: "%{{" becomes "%{"
        text = text.replace("${", "$").replace("%{", "%")
    job = Block("job", text)
    job.block("group", "g").set(value=text, items=[text, text], table={text: text})
    parsed = hcl2.loads(render(job))
    [job_block] = parsed["job"]
    [body] = job_block.values()
    [group_block] = body["group"]
    [group] = group_block.values()
    assert set(group) == {"value", "items", "table", "__is_block__"}
    assert len(group["items"]) == 2


NOMAD = Path(STACK.get("CARAVAN_NOMAD_HOME", "/nonexistent")) / "bin" / "nomad"
TRICKY = [
    "%{",
    "x%{",
    "%{x",
    "%%{",
    "%{ if }",
    "${",
    "$${",
    "a${b",
    "%{}%{",
    '"%{"',
    "\\%{",
    "%{{",
    "${{",
    '${x"""\t\t\u2028',
    '\u2028\t"}# ${=',
    '${%"**x=\tx',
    "\u2028=\t\t ${##",
    "${}${",
    "}${{",
    'a$\n%{\t\r%*"\t',
    '%{$ ="#/',
    '\x07${$\t"\x07%#',
    '"$**${\\\n#/',
]


@pytest.mark.skipif(not NOMAD.exists(), reason="ops/install-nomad builds Nomad")
def test_template_escapes_read_back_through_nomad(tmp_path: Path) -> None:
    """Nomad's own HCL parser (``nomad job run -output``: offline, no agent) reads each value back as written."""
    job = Block("job", "x")
    env = {f"V{i}": text for i, text in enumerate(TRICKY)}
    job.block("group", "g").block("task", "t", driver="raw_exec").set(env=env).block("config", command="/bin/true")
    (tmp_path / "job.hcl").write_text(render(job))
    out = subprocess.run(
        [str(NOMAD), "job", "run", "-output", str(tmp_path / "job.hcl")],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    [task] = json.loads(out.stdout)["Job"]["TaskGroups"][0]["Tasks"]
    assert task["Env"] == env
