"""The policy file: the shipped example parses; every kind of mistake names its file, line and reason."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.durations import parse_duration
from domain.idle.config import CheckName, PolicyLayer, ThresholdOperator
from domain.idle.policy_file import PolicyFileError, load_policy_file, parse_policy

EXAMPLE = Path(__file__).parents[2] / "idle" / "policy.example.hcl"


def test_example_file_parses() -> None:
    config = load_policy_file(EXAMPLE)
    assert config.source == str(EXAMPLE)
    assert config.check_interval == 15.0
    assert config.enabled == frozenset(CheckName)
    assert config.defaults == PolicyLayer(
        max_session_lifetime=86400.0,
        network_idle_timeout=3600.0,
        grace_period=600.0,
        window=1800.0,
        operator=ThresholdOperator.ALL,
        thresholds={"cpu_util": 2.0, "mem": None, "cuda_util": 1.0, "cuda_mem": None, "sim_util": 1.0},
    )
    assert config.resource_groups == {
        "gpu": PolicyLayer(network_idle_timeout=1200.0, window=900.0, thresholds={"cuda_util": 5.0})
    }
    assert config.user_policies == {"research": PolicyLayer(max_session_lifetime=604800.0, network_idle_timeout=0.0)}


def test_empty_file_terminates_nothing() -> None:
    effective = parse_policy("", "empty.hcl").effective(resource_group="default", user_policy=None)
    assert (effective.max_session_lifetime, effective.network_idle_timeout) == (None, None)
    assert effective.utilization is not None and effective.utilization.thresholds == {}


def test_object_form_and_quoted_keys_are_accepted() -> None:
    text = 'defaults {\n  utilization = {\n    thresholds = { "mem" = 5, cpu_util = 1.5 }\n  }\n}\n'
    assert parse_policy(text).defaults.thresholds == {"mem": 5.0, "cpu_util": 1.5}


def test_comments_strings_and_heredocs_do_not_confuse_lines() -> None:
    text = (
        '# a { "b" = 1\n'
        "defaults { // }\n"
        "  /* x = {\n"
        "  */\n"
        "  network_idle_timeout = <<EOT\n"
        "nope = {\n"
        "EOT\n"
        '  max_session_lifetime = "1h}"\n'
        "  nope = 1\n"
        "}\n"
    )
    with pytest.raises(PolicyFileError) as caught:
        parse_policy(text)
    assert (caught.value.line, caught.value.reason) == (
        9,
        "defaults.nope: unknown key (expected one of: max_session_lifetime, network_idle_timeout, utilization)",
    )


HCL_PIECES = st.sampled_from(
    ["defaults", "resource_group", "utilization", "thresholds", "cpu_util", "window", "enabled", '"gpu"', '"10m"']
    + ["{", "}", "[", "]", "=", ",", "\n", " ", "1", "-2", "150", "null", "true", '"${x}"', "#c\n", "/*", "*/", '"']
)


@settings(max_examples=200, deadline=None)
@given(st.lists(HCL_PIECES, max_size=30).map("".join))
def test_any_text_parses_or_fails_with_a_line_in_the_file(text: str) -> None:
    try:
        parse_policy(text, "f.hcl")
    except PolicyFileError as error:
        assert error.line is not None and 1 <= error.line <= text.count("\n") + 1


@dataclass(frozen=True)
class Bad:
    name: str
    text: str
    line: int | None
    reason: str


BAD = [
    Bad("syntax: missing value", "defaults {\n  max_session_lifetime =\n}\n", 2, "syntax error"),
    Bad("syntax: unclosed block", 'defaults {\n  max_session_lifetime = "1h"\n', 3, "syntax error"),
    Bad("syntax: stray brace", "check_interval = 5\n\n}\n", 3, "syntax error"),
    Bad("unknown top-level key", 'check_interval = "15s"\nfoo = 1\n', 2, "foo: unknown key"),
    Bad(
        "unknown key in a layer",
        'defaults {\n  max_session_lifetime = "1h"\n  idle_timeout = "5m"\n}\n',
        3,
        "defaults.idle_timeout: unknown key",
    ),
    Bad(
        "unknown key in utilization",
        'resource_group "g" {\n  utilization {\n    time_window = 5\n  }\n}\n',
        3,
        "utilization.time_window: unknown key",
    ),
    Bad("enabled at layer level", 'user_policy "u" {\n  enabled = []\n}\n', 2, "user_policy.u.enabled: unknown key"),
    Bad("bool duration", "defaults {\n\n  network_idle_timeout = true\n}\n", 3, "got true"),
    Bad("unquoted expression", "check_interval = fifteen\n", 1, "expected a quoted string"),
    Bad("interpolation", 'defaults {\n  network_idle_timeout = "${x}"\n}\n', 2, "interpolation"),
    Bad(
        "negative duration string",
        'resource_group "gpu" {\n  utilization {\n    grace_period = "-5m"\n  }\n}\n',
        3,
        "negative",
    ),
    Bad("negative duration number", 'user_policy "x" {\n  max_session_lifetime = -3\n}\n', 2, "negative"),
    Bad("malformed duration", 'defaults {\n  max_session_lifetime = "1 week"\n}\n', 2, "invalid duration"),
    Bad("zero check interval", "\ncheck_interval = 0\n", 2, "longer than 0"),
    Bad("zero window", 'defaults {\n  utilization {\n    window = "0s"\n  }\n}\n', 3, "longer than 0"),
    Bad(
        "unknown metric",
        "defaults {\n  utilization {\n    thresholds {\n      cpu_util = 1\n      tpu_util = 3\n    }\n  }\n}\n",
        5,
        "unknown metric 'tpu_util'",
    ),
    Bad(
        "threshold above 100",
        "defaults {\n  utilization {\n    thresholds = { cuda_util = 150 }\n  }\n}\n",
        3,
        "0 to 100",
    ),
    Bad("negative threshold", "defaults {\n  utilization {\n    thresholds { mem = -1 }\n  }\n}\n", 3, "0 to 100"),
    Bad(
        "string threshold",
        'defaults {\n  utilization {\n    thresholds {\n      mem = "5"\n    }\n  }\n}\n',
        4,
        "expected a percentage",
    ),
    Bad("bad operator", 'defaults {\n  utilization {\n\n    operator = "and"\n  }\n}\n', 4, 'expected "all" or "any"'),
    Bad("unknown check name", 'enabled = ["session_lifetime",\n  "timeout"]\n', 1, "unknown check 'timeout'"),
    Bad("enabled not a list", 'enabled = "utilization"\n', 1, "expected a list"),
    Bad(
        "key assigned twice",
        'defaults {\n  network_idle_timeout = "5m"\n  network_idle_timeout = "6m"\n}\n',
        3,
        "assigned more than once",
    ),
    Bad("defaults twice", "defaults {\n}\n\ndefaults {\n}\n", 4, "more than once"),
    Bad(
        "group twice",
        'resource_group "a" {\n}\nresource_group "b" {}\nresource_group "a" {\n}\n',
        4,
        "defined more than once",
    ),
    Bad("group without a name", "check_interval = 5\nresource_group {\n}\n", 2, "needs one name"),
    Bad("policy with two names", '\nuser_policy "a" "b" {\n}\n', 2, "exactly one name"),
    Bad("defaults with a name", 'defaults "x" {\n}\n', 1, "takes no name"),
    Bad("block given as a string", '\ndefaults = "x"\n', 2, "expected a block"),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.name for b in BAD])
def test_invalid_file_is_refused_with_path_line_and_reason(bad: Bad) -> None:
    with pytest.raises(PolicyFileError) as caught:
        parse_policy(bad.text, "/etc/caravan/idle.hcl")
    error = caught.value
    assert (error.path, error.line) == ("/etc/caravan/idle.hcl", bad.line), str(error)
    assert bad.reason in error.reason
    assert str(error).startswith(f"/etc/caravan/idle.hcl:{bad.line}: ")


def test_unreadable_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.hcl"
    with pytest.raises(PolicyFileError) as caught:
        load_policy_file(missing)
    assert (caught.value.path, caught.value.line) == (str(missing), None)


def test_file_errors_carry_the_file_path(tmp_path: Path) -> None:
    broken = tmp_path / "idle.hcl"
    broken.write_text('defaults {\n  utilization {\n    operator = "most"\n  }\n}\n')
    with pytest.raises(PolicyFileError, match=rf"^{broken}:3: defaults.utilization.operator: "):
        load_policy_file(broken)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (1.5, 1.5),
        ("30s", 30.0),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("0.5m", 30.0),
        ("45", 45.0),
        ("0", 0.0),
    ],
)
def test_durations(value: object, seconds: float) -> None:
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["-1s", -1, "10x", "m", "", "1.5.2h", True, None, float("inf")])
def test_bad_durations(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)
