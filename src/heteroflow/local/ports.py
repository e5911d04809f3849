"""Choosing TCP ports for the processes of a local cluster.

Ports are chosen *below* the kernel's ephemeral range: a port picked there cannot be taken by an outgoing
connection or a ``bind(0)`` (gloo, HTTP clients) between the moment it is chosen and the moment the process
we start binds it. A port is only ever a guess until that process binds it; the cluster notices a process that
could not bind (it exits) and says so.
"""

from __future__ import annotations

import contextlib
import random
import socket
from collections.abc import Iterable
from pathlib import Path

_PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


class PortUnavailableError(OSError):
    """An explicitly requested port is in use."""


def _ephemeral_floor() -> int:
    low = 32768
    with contextlib.suppress(OSError, ValueError, IndexError):
        low = int(_PORT_RANGE_FILE.read_text().split()[0])
    return low


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now (SO_REUSEADDR, as uvicorn binds)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str = "127.0.0.1", *, exclude: Iterable[int] = ()) -> int:
    """A TCP port free on ``host`` now, chosen at random below the ephemeral range, never one of ``exclude``."""
    taken = set(exclude)
    low = _ephemeral_floor()
    floor = 10000 if low > 12000 else 1024
    for _ in range(200):
        port = random.randrange(floor, max(low, floor + 1))
        if port not in taken and port_is_free(port, host):
            return port
    for _ in range(20):  # a crowded range: let the kernel choose
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            chosen: int = sock.getsockname()[1]
        if chosen not in taken:
            return chosen
    raise PortUnavailableError(f"no free TCP port on {host}")


class PortAllocator:
    """Hands out distinct ports for one cluster: a preferred port when it is free, else a free one.

    ``None`` asks for the preferred default when free (``8080`` and friends, so that the README's URLs work),
    ``0`` for any free port, any other number for exactly that port (refused when it is taken: an explicit
    choice is never silently replaced).
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self._given: set[int] = set()

    @property
    def given(self) -> frozenset[int]:
        return frozenset(self._given)

    def take(self, requested: int | None = 0, *, default: int | None = None) -> int:
        if (
            requested is None
            and default is not None
            and default not in self._given
            and port_is_free(default, self.host)
        ):
            port = default
        elif requested:
            if requested in self._given or not port_is_free(requested, self.host):
                raise PortUnavailableError(f"port {requested} on {self.host} is in use")
            port = requested
        else:
            port = pick_port(self.host, exclude=self._given)
        self._given.add(port)
        return port
