"""Settings read from the environment: a removed variable stops the start instead of being silently ignored."""

from __future__ import annotations

import pytest

from common.settings import load_settings


def test_the_raw_exec_opt_in_for_users_is_refused_loudly() -> None:
    with pytest.raises(ValueError, match="CARAVAN_ALLOW_RAW_EXEC_FOR_USERS was removed: .*SUPERADMIN"):
        load_settings({"CARAVAN_ALLOW_RAW_EXEC_FOR_USERS": "1"})
    assert load_settings({"CARAVAN_ALLOW_RAW_EXEC_FOR_USERS": ""}).home.name == ".caravan"
