"""Caravan's credentials on disk: one directory (mode 0700), one file per secret (mode 0600).

Layout of the secrets directory (``CARAVAN_SECRETS_DIR``, default ``$CARAVAN_HOME/secrets``):

- ``nomad-<role>.token``: the Nomad ACL token of ``<role>``; ``nomad-admin.token`` is the management token (the
  bootstrap secret Caravan generated and gave Nomad's ``/v1/acl/bootstrap``);
- ``redis-<role>.password``: the password of the Redis user named ``<role>``;
- ``redis-users.acl``: the Redis ACL file written from those passwords (hashed);
- with Sentinels (:mod:`caravan.stack.redis_sentinel`): ``redis-replication.password`` (replicas authenticating to
  their primary), ``redis-sentinel.password`` (the Sentinels, on the data nodes and to each other) and
  ``redis-sentinel-client.password`` (Caravan's processes asking the Sentinels).

Every file is created with mode 0600 from the start (never written first and narrowed after), and replaced
atomically, so that no reader ever sees a half-written or a world-readable secret.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Literal

Role = Literal["gateway", "scheduler", "idle", "admin"]
COMPONENT_ROLES: tuple[Role, ...] = ("gateway", "scheduler", "idle")
"""The roles Caravan's services run as; each has its own Nomad token and Redis user."""
ROLES: tuple[Role, ...] = (*COMPONENT_ROLES, "admin")
"""``admin``: the operator's and the tests' credentials (Nomad management token, the Redis admin user)."""

DIR_MODE = 0o700
FILE_MODE = 0o600


def nomad_token_path(secrets_dir: Path, role: Role) -> Path:
    return secrets_dir / f"nomad-{role}.token"


def redis_password_path(secrets_dir: Path, role: Role) -> Path:
    return secrets_dir / f"redis-{role}.password"


def redis_sentinel_client_path(secrets_dir: Path) -> Path:
    """The password of the user ``caravan`` on Redis Sentinels: Caravan's processes asking where the primary is."""
    return secrets_dir / "redis-sentinel-client.password"


def redis_acl_path(secrets_dir: Path) -> Path:
    return secrets_dir / "redis-users.acl"


def app_cookie_key_path(secrets_dir: Path) -> Path:
    """The HS256 key of the app cookies (signed by the gateway, checked by HAProxy)."""
    return secrets_dir / "app-cookie.key"


def ensure_app_cookie_key(secrets_dir: Path) -> str:
    """The app cookies' key, generated (0600) on first use."""
    path = app_cookie_key_path(secrets_dir)
    found = read_secret(path)
    if found is None:
        found = secrets.token_urlsafe(48)
        write_secret(path, found)
    return found


def read_secret(path: Path) -> str | None:
    """The secret in ``path`` (surrounding whitespace dropped), or None when there is no such file."""
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


def ensure_secrets_dir(secrets_dir: Path) -> Path:
    """Create ``secrets_dir`` (and its parents) if missing, and make it 0700 whoever created it."""
    secrets_dir.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    secrets_dir.chmod(DIR_MODE)
    return secrets_dir


def write_secret(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` in a secrets directory (made 0700) with mode 0600 (:func:`write_private`)."""
    ensure_secrets_dir(path.parent)
    write_private(path, value)


def write_private(path: Path, value: str) -> None:
    """Write ``value`` to ``path`` with mode 0600 from the start: a temporary file created 0600 in the same directory,
    renamed over ``path`` (never readable by others, not even for a moment)."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        with os.fdopen(descriptor, "w") as out:
            out.write(value if value.endswith("\n") else value + "\n")
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        raise


def new_password() -> str:
    """A random secret of 256 bits, hex (safe in a URL and in an ACL file without quoting)."""
    return secrets.token_hex(32)


def ensure_secret(path: Path, generate: Callable[[], str] = new_password) -> str:
    """The secret in ``path``, generated and written once if there is none yet."""
    existing = read_secret(path)
    if existing is not None:
        return existing
    value = generate()
    write_secret(path, value)
    return value
