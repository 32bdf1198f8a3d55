"""Each component connects with its own credentials: ``Settings.for_role`` and the secrets files behind it."""

from __future__ import annotations

import stat
from pathlib import Path

from core.secrets import ensure_secret, nomad_token_path, redis_password_path, write_secret
from core.settings import load_settings, with_credentials


def test_a_role_takes_its_token_and_redis_user_from_the_secrets_directory(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    write_secret(nomad_token_path(secrets, "scheduler"), "nomad-secret")
    write_secret(redis_password_path(secrets, "scheduler"), "redis-secret")
    settings = load_settings(
        {
            "CARAVAN_HOME": str(tmp_path),
            "CARAVAN_REDIS_URL": "redis://127.0.0.1:7000/2",
            "CARAVAN_NOMAD_TOKEN": "operator-token",
        }
    )
    assert settings.secrets == secrets  # the default: <home>/secrets
    scheduler = settings.for_role("scheduler")
    assert scheduler.nomad.token == "nomad-secret"
    assert scheduler.redis.url == "redis://scheduler:redis-secret@127.0.0.1:7000/2"
    assert settings.nomad.token == "operator-token"  # the settings themselves are left as they were


def test_without_files_the_configured_credentials_stay(tmp_path: Path) -> None:
    settings = load_settings(
        {
            "CARAVAN_HOME": str(tmp_path),
            "CARAVAN_SECRETS_DIR": str(tmp_path / "none"),
            "CARAVAN_REDIS_URL": "redis://me:pw@redis.internal:6379/0",
            "CARAVAN_NOMAD_TOKEN": "operator-token",
        }
    )
    gateway = settings.for_role("gateway")
    assert (gateway.nomad.token, gateway.redis.url) == ("operator-token", "redis://me:pw@redis.internal:6379/0")


def test_credentials_in_the_url_are_replaced_and_quoted() -> None:
    assert with_credentials("redis://old:pw@h:1/0", "idle", "a/b@c") == "redis://idle:a%2Fb%40c@h:1/0"


def test_a_secret_is_written_once_and_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "s" / "redis-admin.password"
    first = ensure_secret(path)
    assert ensure_secret(path) == first and len(first) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
