"""The test helper that picks ports for processes under test."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

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


def test_side_by_side_test_workers_draw_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    floor = 10000 if low > 12000 else 1024
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    drawn: dict[str, set[int]] = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        drawn[worker] = {free_port() for _ in range(40)}
    middle = floor + (low - floor) // 2
    assert all(floor <= port < middle for port in drawn["gw0"]), sorted(drawn["gw0"])
    assert all(middle <= port < low for port in drawn["gw1"]), sorted(drawn["gw1"])
