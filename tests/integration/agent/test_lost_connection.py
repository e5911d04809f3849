"""The agent's kept connection reset under a beat, on real sockets: the beat goes out once more and is answered.

The peer is a small HTTP server on a socket of its own that resets (RST) the connection it answered the first beat
on when the second beat arrives over it, as a server or balancer does that closes an idle connection at the moment
a request goes out. Every other request it answers, each on the connection it came on.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from collections.abc import Iterator

from heteroflow.agent.client import HttpPlatformClient
from heteroflow.core.ids import NodeId

ANSWER = json.dumps({"status": "ok", "xid_events": {"received": 0, "stored": 0, "rejected": [], "retry": False}})


class ResettingServer:
    """Answers every request, except the second over the first connection: that connection is reset instead."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.requests: list[tuple[int, str]] = []
        """(connection number, request line) of each request that arrived."""
        self._threads: list[threading.Thread] = []

    def serve(self) -> None:
        for number in range(2):
            connection, _ = self.listener.accept()
            thread = threading.Thread(target=self._connection, args=(number, connection), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _connection(self, number: int, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as reader:
            while line := reader.readline():
                length = 0
                while (header := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = header.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                reader.read(length)
                self.requests.append((number, line.decode().strip()))
                if number == 0 and len(self.requests) == 2:
                    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return  # closed with linger 0: a reset, and no answer
                body = ANSWER.encode()
                connection.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(body), body)
                )

    def join(self) -> None:
        for thread in self._threads:
            thread.join(10)
        self.listener.close()


@contextlib.contextmanager
def resetting_server() -> Iterator[ResettingServer]:
    server = ResettingServer()
    acceptor = threading.Thread(target=server.serve, daemon=True)
    acceptor.start()
    try:
        yield server
    finally:
        acceptor.join(10)
        server.join()


def test_a_beat_whose_kept_connection_is_reset_goes_out_once_more_on_a_new_one() -> None:
    with resetting_server() as server:
        agent = HttpPlatformClient(base_url=f"http://127.0.0.1:{server.port}", token="t")
        try:
            for _ in range(3):
                assert agent.heartbeat(NodeId("n1"), {"gpu_stats": []}).xid_received == 0
        finally:
            agent.close()
    beat = "POST /api/v1/nodes/n1/heartbeat HTTP/1.1"
    # the first connection answered one beat and was reset under the second; the second beat went out again on
    # a new connection, and the third beat used that one
    assert server.requests == [(0, beat), (0, beat), (1, beat), (1, beat)]
