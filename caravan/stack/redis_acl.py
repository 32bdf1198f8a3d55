"""Redis users for Caravan: the ACL file the stack's Redis starts with.

- ``default`` is off: a connection that has not authenticated can run nothing (``NOAUTH``), not even ``PING``, and
  nobody can authenticate as ``default`` (off, no password). It keeps every permission for one reader only: the
  client that replays the append-only file at start runs as ``default``, and Redis 7.0-7.2 re-check that user's
  permissions at each replayed ``EXEC`` (redis/redis#14541, fixed after the 7.0.15 Debian ships): with ``-@all``
  there, every MULTI/EXEC Caravan wrote (session documents, users) was silently dropped on restart.
- ``gateway``, ``scheduler`` and ``idle``, one per component, each with its own password: only keys under Caravan's
  prefix (``~<prefix>:*``), no Pub/Sub channel, and only the command categories Caravan uses (reads and writes of
  strings, hashes, sets, sorted sets, lists and streams; ``WATCH``/``MULTI``/``EXEC``; Lua ``EVAL``/``EVALSHA``
  for the leases and token checks; blocking ``XREAD``/``BLPOP``; ``PING`` and the connection handshake). Dangerous
  and administrative commands (``FLUSHALL``, ``FLUSHDB``, ``CONFIG``, ``ACL``, ``KEYS``, ``INFO``, ``DEBUG``,
  ``SHUTDOWN``, ``MONITOR``, ``CLIENT KILL``, ...) are refused (``NOPERM``), and so are the commands that would reach
  past the prefix or other databases (``SCAN``, ``RANDOMKEY``, ``SELECT``, ``MOVE``, ``SWAPDB``) or change
  server-side code (``FUNCTION``, ``SCRIPT FLUSH``/``KILL``/``DEBUG``).
- ``admin``: everything, for the operator and the tests.

Passwords are generated once into the secrets directory (``redis-<role>.password``, 0600); the ACL file holds only
their SHA-256 (``#<hex>``) and is 0600 too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from core.secrets import (
    COMPONENT_ROLES,
    ROLES,
    Role,
    ensure_secret,
    redis_acl_path,
    redis_password_path,
    write_secret,
)

COMPONENT_RULES = (
    "resetchannels -@all +@read +@write +@transaction +@scripting +@blocking +@connection "
    "-@dangerous -@admin -@pubsub -select -scan -randomkey -move -swapdb -function "
    "-script|flush -script|kill -script|debug"
)
"""What a component may run, on keys of its prefix only (order matters: later rules take away)."""


def _hashed(password: str) -> str:
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def acl_lines(secrets: dict[Role, str], key_prefixes: Sequence[str]) -> list[str]:
    """The ACL file's lines: ``default`` off, one user per component limited to ``<prefix>:*`` keys, an admin.
    ``secrets``: each user's password rule (``#<sha256 hex>``)."""
    keys = " ".join(f"~{prefix}:*" for prefix in key_prefixes)
    lines = ["user default off resetpass ~* &* +@all"]  # off: nobody logs in as it; +@all: the AOF replay (above)
    for role in COMPONENT_ROLES:
        lines.append(f"user {role} on {secrets[role]} resetkeys {keys} {COMPONENT_RULES}")
    lines.append(f"user admin on {secrets['admin']} ~* &* +@all")
    return lines


def write_acl_file(secrets_dir: Path, key_prefixes: Sequence[str], extra_users: Sequence[str] = ()) -> Path:
    """Generate the missing passwords and (re)write the ACL file from them, ``extra_users`` (more lines) at its end;
    returns its path."""
    hashed = {role: hashed_password(redis_password_path(secrets_dir, role)) for role in ROLES}
    path = redis_acl_path(secrets_dir)
    write_secret(path, "\n".join([*acl_lines(hashed, key_prefixes), *extra_users]))
    return path


def hashed_password(path: Path) -> str:
    """The ACL rule (``#<sha256 hex>``) of the password in ``path``, generated there first if missing."""
    return _hashed(ensure_secret(path))


def describe_users(prefix: str) -> str:
    """The users as an operator adds them to a Redis of their own (``caravan stack redis-users``)."""
    placeholders: dict[Role, str] = {role: f"#<sha256-hex-of-the-{role}-password>" for role in ROLES}
    return "\n".join(
        [
            f"# Caravan's Redis users for key prefix {prefix!r} (CARAVAN_REDIS_PREFIX), in ACL file syntax.",
            "# Give each component its user in its URL (redis://<role>:<password>@host:port/db) or its password in",
            "# $CARAVAN_SECRETS_DIR/redis-<role>.password (mode 0600). Keep your own admin user instead of ours if you",
            "# have one, and turn the default user off.",
            *acl_lines(placeholders, (prefix,)),
        ]
    )
