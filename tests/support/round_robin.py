"""A small round-robin HTTP load balancer for tests that run several platform servers.

Each request goes to the next backend in strict rotation, whatever connection it arrived on. A backend that
refuses the connection (a killed process) is skipped and the request goes to the next one, like
``proxy_next_upstream error`` in nginx: the request never reached the refused backend, so sending it
elsewhere is safe. Nothing else is retried. The proxy records which backend served each request.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection", "host"}
_SET_BY_PROXY = {"content-length", "date", "server"}  # BaseHTTPRequestHandler writes its own


@dataclass(frozen=True, slots=True)
class Forwarded:
    backend: int
    """Index of the backend that answered."""
    method: str
    path: str
    status: int


class RoundRobinProxy:
    """Listens on ``127.0.0.1:port`` and forwards to ``backends`` (base URLs ``http://host:port``)."""

    def __init__(self, backends: Sequence[str], *, port: int, timeout_sec: float = 10.0) -> None:
        self.backends = [urlsplit(url) for url in backends]
        self.url = f"http://127.0.0.1:{port}"
        self.log: list[Forwarded] = []
        self.refused: list[int] = []
        """Backend indexes whose connection was refused (one entry per refusal)."""
        self._timeout_s = timeout_sec
        self._next = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), self._handler_class())
        self._server.daemon_threads = True

    def counts(self) -> list[int]:
        """Requests answered per backend."""
        with self._lock:
            return [sum(1 for f in self.log if f.backend == i) for i in range(len(self.backends))]

    def _turn(self) -> int:
        with self._lock:
            chosen, self._next = self._next, (self._next + 1) % len(self.backends)
            return chosen

    def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        first = self._turn()
        for step in range(len(self.backends)):
            index = (first + step) % len(self.backends)
            target = self.backends[index]
            connection = http.client.HTTPConnection(
                target.hostname or "127.0.0.1", target.port, timeout=self._timeout_s
            )
            try:
                try:
                    connection.connect()
                except ConnectionRefusedError:
                    with self._lock:
                        self.refused.append(index)
                    continue
                connection.request(method, path, body=body or None, headers=headers)
                response = connection.getresponse()
                payload = response.read()
            finally:
                connection.close()
            with self._lock:
                self.log.append(Forwarded(index, method, path, response.status))
            return response.status, response.getheaders(), payload
        return 502, [("Content-Type", "text/plain")], b"no backend accepted the connection"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive towards the client, as a real balancer does

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                status, response_headers, payload = proxy.forward(self.command, self.path, headers, body)
                self.send_response(status)
                for name, value in response_headers:
                    if name.lower() not in _HOP_BY_HOP | _SET_BY_PROXY:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = do_PUT = _relay

            def log_message(self, format: str, *args: object) -> None:
                pass  # the proxy's own log is `proxy.log`

        return Handler

    @contextmanager
    def running(self) -> Iterator[RoundRobinProxy]:
        thread = threading.Thread(target=self._server.serve_forever, name="round-robin-proxy", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()
            thread.join(10)
