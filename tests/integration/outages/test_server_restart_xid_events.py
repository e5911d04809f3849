"""The platform server is SIGKILLed and started again while a real agent process keeps producing XID events.

The agent is ``heteroflow agent run --collector nvml`` with a stand-in ``pynvml`` first on its ``PYTHONPATH``
(``tests/fixtures/agent/fake_nvml``): its real NVML watcher thread receives XID critical-error events that this
test raises through a Unix datagram socket, at a steady pace, before, during and after the outage. The
simulated agent (``--simulate``) has no XID source and ``heteroflow fault hardware --via gpu-health`` sends its
heartbeat itself, bypassing the agent's queue, so neither would exercise what is tested here: the agent's queue
holding events while the server is away and re-sending them after it returns.

Every event gets its own (card, XID) pair, so "exactly once" is checked per event identity in the database.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.integration.agent.conftest import ServerProcess, start_server
from tests.support.polling import until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

FAKE_NVML = Path(__file__).resolve().parents[2] / "fixtures" / "agent" / "fake_nvml"
CARDS = 8
XIDS = (13, 31, 32, 38, 43, 45, 48, 56, 57, 58, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95, 119, 120, 154)
EVENT_GAP_SEC = 0.075
"""The pace of the producer (one event every 75 ms: 192 identities last 14 s)."""
PER_PHASE = 10
"""Events produced in each phase at least: server up, server down (queued by the agent), server back."""


def identity(seq: int) -> tuple[int, int]:
    """Event ``seq``'s (card index, XID): unique per event."""
    return seq % CARDS, XIDS[seq // CARDS]


class Producer:
    """Raises one XID event every :data:`EVENT_GAP_SEC` in the agent's NVML until stopped (or out of identities)."""

    def __init__(self, path: Path) -> None:
        self._path = str(path)
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._produced = 0
        self._thread = threading.Thread(target=self._run, name="xid-producer", daemon=True)

    @property
    def produced(self) -> int:
        with self._lock:
            return self._produced

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> int:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(10)
        self._socket.close()
        return self.produced

    def _run(self) -> None:
        for seq in range(CARDS * len(XIDS)):
            index, xid = identity(seq)
            self._socket.sendto(f"{index} {xid}".encode(), self._path)
            with self._lock:
                self._produced += 1
            if self._stop.wait(EVENT_GAP_SEC):
                return


def stored_events(engine: sa.Engine) -> list[tuple[int, int, str | None, int]]:
    """(card, XID, uuid, copies) per stored event identity."""
    query = sa.text(
        "SELECT gpu_index, xid, uuid, COUNT(*) FROM gpu_xid_events GROUP BY gpu_index, xid, uuid ORDER BY 1, 2"
    )
    with engine.connect() as conn:
        return [(int(r[0]), int(r[1]), r[2], int(r[3])) for r in conn.execute(query)]


def test_a_server_killed_and_restarted_under_a_stream_of_xid_events_stores_each_exactly_once(tmp_path: Path) -> None:
    server: ServerProcess = start_server(tmp_path)
    engine = sa.create_engine(server.database_url)
    xid_socket = tmp_path / "xid.sock"
    log = tmp_path / "agent.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETEROFLOW_", "FAKE_NVML"))}
    env.update(
        PYTHONPATH=os.pathsep.join(p for p in (str(FAKE_NVML), env.get("PYTHONPATH")) if p),
        PYTHONUNBUFFERED="1",
        FAKE_NVML_XID_SOCKET=str(xid_socket),
        FAKE_NVML_GPUS=str(CARDS),
        HETEROFLOW_AGENT_RECONNECT_INITIAL_SECONDS="0.05",
        HETEROFLOW_AGENT_REQUEST_TIMEOUT_SECONDS="2",
    )
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "heteroflow", "agent", "run",
                "--server", server.url, "--token", server.token, "--node-name", "outage-xid",
                "--collector", "nvml", "--heartbeat-interval", "0.1", "--health-interval", "0.5",
                "--reconnect-max", "0.3",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )  # fmt: skip
    producer = Producer(xid_socket)

    def agent_log() -> str:
        return log.read_text(errors="replace")

    def taken_by_agent() -> int:
        return len(re.findall(r"\bagent\.xid(?![_\w])", agent_log()))  # JSON or console lines

    def stored_total() -> int:
        return sum(copies for *_, copies in stored_events(engine))

    try:
        until(xid_socket.exists, within=30, what="the agent's NVML is loaded")
        until(lambda: "agent.registered" in agent_log(), within=30, what="the agent registered")
        producer.start()

        # the server is up: events flow into the database
        until(lambda: stored_total() >= PER_PHASE, within=30, what="events stored before the outage")
        server.stop()  # SIGKILL, in the middle of the stream
        at_kill = producer.produced
        unreachable_before = agent_log().count("agent.server_unreachable")

        # the server is down: the agent takes every new event into its queue and keeps retrying
        until(
            lambda: (
                taken_by_agent() >= at_kill + PER_PHASE
                and agent_log().count("agent.server_unreachable") >= unreachable_before + 2
            ),
            within=30,
            what="events queued by the agent while the server is down",
        )
        assert agent.poll() is None, agent_log()[-3000:]
        server.start()  # same port, same database
        restarted = time.monotonic()
        at_restart = producer.produced
        assert at_restart - at_kill >= PER_PHASE

        # the server is back: the backlog drains, new events keep arriving
        until(lambda: producer.produced >= at_restart + PER_PHASE, within=30, what="events after the restart")
        produced = producer.stop()
        until(lambda: stored_total() >= produced, within=30, what="every event stored")
        drained = time.monotonic() - restarted

        rows = stored_events(engine)
        expected = sorted((*identity(seq), f"GPU-fake-{identity(seq)[0]}", 1) for seq in range(produced))
        assert rows == expected, f"{len(rows)} identities stored for {produced} produced"  # none lost, none twice
        with engine.connect() as conn:
            nodes = conn.execute(sa.text("SELECT COUNT(*) FROM nodes WHERE name = 'outage-xid'")).scalar_one()
        assert nodes == 1  # the same node across the restart
        assert drained < 30
        assert "Traceback" not in agent_log()
    finally:
        producer.stop()
        if agent.poll() is None:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(20)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(10)
        engine.dispose()
        server.stop()
    assert agent.returncode == 0, agent_log()[-3000:]
