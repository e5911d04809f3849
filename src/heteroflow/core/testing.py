"""Fakes of the core seams, shipped for tests of this project and of its users."""

from __future__ import annotations

import contextlib
import random
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 1, 1, tzinfo=UTC)
        self._mono = 1000.0

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return self._mono

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self._now += timedelta(seconds=seconds)
        self._mono += seconds


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now, chosen below the kernel's ephemeral range.

    A port picked there cannot be taken by an outgoing connection or a ``bind(0)`` (gloo, HTTP clients)
    between the moment it is chosen and the moment the process under test binds it.
    """
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(_PORT_RANGE_FILE.read_text().split()[0])
    floor = 10000 if low > 12000 else 1024
    for _ in range(200):
        port = random.randrange(floor, max(low, floor + 1))
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # a crowded range: let the kernel choose
        sock.bind((host, 0))
        chosen: int = sock.getsockname()[1]
        return chosen
