"""The Nomad address of Redis-tier tests: a tripwire, not a fake Nomad.

A test that needs Redis alone (``redis_settings``) gets settings whose Nomad address points here, so that the
session's Nomad agent is never booted for it. Every request is answered ``400`` with a sentence naming the mistake:
Caravan's Nomad client raises :class:`nomad_jobs.client.NomadRejected`, a permanent error that nothing retries, so a
Nomad call fails at once and loudly; and the call is recorded under the test's namespace (the first segment of the
path), so that the fixture fails the test at teardown even if the code under test swallowed the error.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

PATH = "/no-nomad/"
"""Every tripwire address has this path: :func:`is_tripwire` tells them from a real Nomad's."""
ANSWER = (
    "no Nomad here: this test was given Redis alone (redis_settings); a test that reaches Nomad uses the "
    "settings fixture (Nomad tier)"
)


def is_tripwire(addr: str) -> bool:
    """Is this Nomad address a tripwire (a Redis-tier test's)?"""
    return PATH in urlsplit(addr).path + "/"


class NoNomad:
    """An HTTP listener on a free loopback port, answering from a thread of its own until :meth:`close`."""

    def __init__(self) -> None:
        self._calls: defaultdict[str, list[str]] = defaultdict(list)
        self._lock = threading.Lock()
        calls, lock = self._calls, self._lock

        class Refuse(BaseHTTPRequestHandler):
            def _refuse(self) -> None:
                namespace, _, rest = self.path.removeprefix(PATH).partition("/")
                with lock:
                    calls[namespace].append(f"{self.command} /{rest}")
                body = ANSWER.encode()
                self.send_response(400)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_DELETE = _refuse

            def log_message(self, format: str, *args: object) -> None:  # the base class's parameter names
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.5}, name="no-nomad", daemon=True
        )
        self._thread.start()

    def address(self, namespace: str) -> str:
        """The Nomad address to give a test of ``namespace``."""
        return f"http://127.0.0.1:{self._server.server_address[1]}{PATH}{namespace}"

    def calls(self, namespace: str) -> list[str]:
        """The requests made with ``namespace``'s address (``GET /v1/jobs?…``)."""
        with self._lock:
            return list(self._calls.get(namespace, ()))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
