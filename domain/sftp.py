"""SFTP access to storage folders as a SYSTEM session (pure): the request ``requestSftp`` turns into, and the public
key it installs. The session runs Debian's OpenSSH server in the image built by ``ops/build-sftp-image``, whose
sshd_config allows nothing but SFTP (``internal-sftp`` forced: no shell, command, TTY or forwarding; keys only),
chrooted into ``/srv``: the kernel mounts only the folders asked, under ``/srv/folders/<name>``, so the client sees
``/folders/<name>`` and nothing else of the container; only the one key is accepted.
SYSTEM sessions are made here and nowhere else (``createSession`` refuses the type)."""

from __future__ import annotations

import base64
import binascii
import re
import struct

from core.errors import InvalidInput
from domain.model import Driver, SessionType
from domain.session_requests import SessionRequest
from domain.storage import Folder, FolderMode, MountRequest

SFTP_PORT = 2222
"""The port sshd listens on in the kernel (published on a Nomad dynamic host port: the session's address)."""
SFTP_USER = "root"
"""The account the client logs in as (the container's; it holds nothing but the mounted folders)."""
KEY_VARIABLE = "SFTP_AUTHORIZED_KEY"
KEY_TYPES = frozenset({"ssh-ed25519", "ssh-rsa", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521"})
MAX_FOLDERS = 8
CHROOT = "/srv"
"""sshd's ChrootDirectory (the image's sshd_config): SFTP clients see what is under it."""
ACTIVITY_FILE = "alloc/caravan-sftp-activity"
"""The file, in the kernel's allocation directory (``/alloc`` in the container, out of the chrooted clients' sight),
whose modification time says when a client was last seen connected; the idle checker reads it through Nomad's
``fs/stat`` API, so the session itself never reaches the control plane."""
ACTIVITY_PERIOD = 5.0
"""Seconds between two looks for connected clients (:data:`SERVER_COMMAND`'s watcher)."""
CONNECTED_WITHIN = 3 * ACTIVITY_PERIOD
"""A client seen this recently (seconds) still counts as connected: a missed look or two does not end it."""
_WATCHER = (
    "(while :; do "
    f'cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk \'$4 == "01" && $2 ~ /:{SFTP_PORT:04X}$/ {{found = 1}} '
    f"END {{exit !found}}' && touch /{ACTIVITY_FILE}; sleep {ACTIVITY_PERIOD:g}; done) & "
)
"""Every :data:`ACTIVITY_PERIOD` seconds, touches :data:`ACTIVITY_FILE` while a TCP connection to sshd is
established (state ``01`` on the local port, in the kernel's own network namespace): SFTP traffic never passes
through the gateway, so this is how the network idle check sees it."""
SERVER_COMMAND = (
    f"{_WATCHER}"  # first, and in the background: "&" would otherwise take the whole "&&" chain with it
    'mkdir -p /root/.ssh && printf "%s\\n" "$SFTP_AUTHORIZED_KEY" > /root/.ssh/authorized_keys && '
    "chmod 700 /root /root/.ssh && chmod 600 /root/.ssh/authorized_keys && "
    "rm -f /etc/ssh/ssh_host_ed25519_key* && "
    '/usr/bin/ssh-keygen -q -t ed25519 -N "" -f /etc/ssh/ssh_host_ed25519_key && '
    f"exec /usr/sbin/sshd -D -e -p {SFTP_PORT}"
)
"""Starts the connection watcher (:data:`_WATCHER`), installs the one key, makes the session's own host key, and
runs sshd in the foreground (its sshd_config, in the image: SFTP only, keys only, chrooted into :data:`CHROOT`)."""
RESOURCES = {"cpu": "0.25", "mem": "128m"}
_KEY_LINE = re.compile(r"^(?P<type>[a-z0-9-]{7,32}) (?P<blob>[A-Za-z0-9+/]{40,1400}={0,2})(?: [^\x00-\x1f]{0,200})?$")


def checked_public_key(text: str) -> str:
    """An OpenSSH public key line (``ssh-ed25519 AAAA... comment``) as ``type blob`` (the comment dropped), if its
    type is one sshd takes and its blob is that type's; INVALID_INPUT on ``publicKey`` otherwise."""
    match = _KEY_LINE.match(text.strip())
    if not match or match["type"] not in KEY_TYPES:
        raise InvalidInput(
            f"publicKey is one OpenSSH public key line of type {', '.join(sorted(KEY_TYPES))}", field="publicKey"
        )
    try:
        blob = base64.b64decode(match["blob"], validate=True)
        (length,) = struct.unpack(">I", blob[:4])
        inner = blob[4 : 4 + length].decode("ascii")
    except (binascii.Error, struct.error, UnicodeDecodeError) as exc:
        raise InvalidInput("publicKey's key data is not valid base64 of an SSH key", field="publicKey") from exc
    if inner != match["type"]:
        raise InvalidInput("publicKey's key data is not of the type it names", field="publicKey")
    return f"{match['type']} {match['blob']}"


def sftp_request(folders: list[tuple[Folder, FolderMode]], public_key: str, *, image: str, name: str) -> SessionRequest:
    """The SYSTEM session serving ``folders`` (each with the mode the user has on it) to ``public_key``."""
    if not 1 <= len(folders) <= MAX_FOLDERS:
        raise InvalidInput(f"give 1-{MAX_FOLDERS} folders", field="folders")
    if len({f.id for f, _ in folders}) != len(folders):
        raise InvalidInput("each folder may be given once", field="folders")
    names = [f.name for f, _ in folders]
    mounts = tuple(
        MountRequest(
            folder=f.id,
            path=f"{CHROOT}/folders/{f.name if names.count(f.name) == 1 else f'{f.name}-{f.id[:8]}'}",
            mode=mode,
        )
        for f, mode in folders
    )
    return SessionRequest(
        name=name,
        type=SessionType.SYSTEM,
        driver=Driver.DOCKER,
        image=image,
        startup_command=SERVER_COMMAND,
        environ={KEY_VARIABLE: public_key},
        resources=RESOURCES,
        preopen_ports=(SFTP_PORT,),
        mounts=mounts,
    )


def sftp_address(ports: tuple[str, ...]) -> str | None:
    """``host:port`` where the session's SFTP server answers, from its kernel's ports (``2222=host:port``)."""
    for entry in ports:
        port, _, address = entry.partition("=")
        if port == str(SFTP_PORT) and address:
            return address
    return None
