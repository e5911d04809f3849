"""The test helper that picks ports for processes under test."""

from __future__ import annotations

import socket
from pathlib import Path

from heteroflow.core.testing import free_port


def test_ports_come_from_below_the_ephemeral_range_and_are_bindable() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(20):
        port = free_port()
        assert port < low
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_returned() -> None:
    held = []
    try:
        for _ in range(30):
            port = free_port()
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            held.append(sock)
        ports = [sock.getsockname()[1] for sock in held]
        assert len(set(ports)) == len(ports)
    finally:
        for sock in held:
            sock.close()
