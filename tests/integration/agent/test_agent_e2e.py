"""The agent against a real server process: fake nvidia-smi on PATH, the samples and capabilities APIs,
SIGTERM, simulated mode, and a server restart that loses no queued XID event."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from heteroflow.agent.assembly import build_agent
from heteroflow.agent.settings import AgentSettings
from heteroflow.agent.testing import FakeCommandRunner, FakeGpu, FakeNvml
from heteroflow.core.clock import SystemClock

from .conftest import OWN_FIXTURES, SHARED_FIXTURES, ServerProcess, agent_env, fake_smi_path, poll, start_server

pytestmark = pytest.mark.e2e

FIVE = (
    "ecc_uncorrected_total",
    "ecc_corrected_total",
    "retired_pages",
    "remapped_rows_pending",
    "remapped_rows_failure",
)


def run_agent(node: str, env: dict[str, str], server: ServerProcess) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "heteroflow", "agent", "run",
            "--server", server.url, "--token", server.token, "--node-name", node,
            "--heartbeat-interval", "0.2", "--health-interval", "0.5", "--tick-timeout", "10",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def node_id_of(server: ServerProcess, name: str) -> str | None:
    items = server.get("/api/v1/nodes").json()["items"]
    return next((item["id"] for item in items if item["name"] == name), None)


def samples(server: ServerProcess, node_id: str, index: int, source: str = "real") -> list[dict[str, object]]:
    body = server.get("/api/v1/gpu-health/samples", node_id=node_id, gpu_index=index, source=source).json()
    return list(body["samples"])


def stop_agent(agent: subprocess.Popen[str]) -> str:
    agent.send_signal(signal.SIGTERM)
    _, stderr = agent.communicate(timeout=20)
    assert agent.returncode == 0, stderr[-2000:]
    return stderr


def test_synthetic_nvidia_smi_beats_into_a_real_server(server: ServerProcess, tmp_path: Path) -> None:
    env = agent_env(
        fake_smi_path(tmp_path),
        FAKE_NVIDIA_SMI_HELP=str(OWN_FIXTURES / "help-query-gpu.synthetic.txt"),
        FAKE_NVIDIA_SMI_CSV=str(OWN_FIXTURES / "query-gpu.synthetic.csv"),
        FAKE_NVIDIA_SMI_EXIT="15",  # the real tool exits non-zero when a GPU is lost
    )
    agent = run_agent("e2e-synthetic", env, server)
    try:
        node_id = str(poll(lambda: node_id_of(server, "e2e-synthetic")))
        rows = poll(lambda: samples(server, node_id, 0))
        assert isinstance(rows, list)
        assert next(tuple(row[k] for k in FIVE) for row in rows) == (0, 12, 0, 1, 0)
        assert rows[0]["uuid"] == "GPU-aaaaaaaa-0000-0000-0000-000000000000"
        three = poll(lambda: samples(server, node_id, 3))
        assert isinstance(three, list)
        assert tuple(three[0][k] for k in FIVE) == (None, 55_000_000_000, 5, 0, 1)
        # GPU 1: every counter unknown → never stored; the lost GPU: no row at all
        assert samples(server, node_id, 1) == []
        cards = {
            card["gpu_index"]: card
            for card in server.get("/api/v1/gpu-health/capabilities").json()["cards"]
            if card["node_id"] == node_id
        }
        assert sorted(cards) == [0, 3, 4]
        assert cards[0]["metrics"]["ecc_corrected_total"] == "collectable"
        assert cards[4]["metrics"]["ecc_corrected_total"] == "unknown"
        node = next(item for item in server.get("/api/v1/nodes").json()["items"] if item["id"] == node_id)
        assert (node["vendor"], node["model"], node["gpu_count"], node["source"]) == ("NVIDIA", "NVIDIA A10", 4, "real")
    finally:
        if agent.poll() is None:
            stderr = stop_agent(agent)
            assert "Traceback" not in stderr
            assert "agent.registered" in stderr


@pytest.mark.skipif(not SHARED_FIXTURES.is_dir(), reason=f"shared captures not present at {SHARED_FIXTURES}")
def test_h100_capture_through_the_agent_process(server: ServerProcess, tmp_path: Path) -> None:
    capture = (
        SHARED_FIXTURES
        / "nvidia-smi"
        / "nvidia_gpu_exporter__capture__linux-x86_64__nvidia-h100-80gb-hbm3__590.48.01.txt"
    )
    env = agent_env(fake_smi_path(tmp_path), FAKE_NVIDIA_SMI_CAPTURE=str(capture), FAKE_NVIDIA_SMI_PHASE="load")
    agent = run_agent("e2e-h100", env, server)
    try:
        node_id = str(poll(lambda: node_id_of(server, "e2e-h100")))
        rows = poll(lambda: samples(server, node_id, 0))
        assert isinstance(rows, list)
        assert tuple(rows[0][k] for k in FIVE) == (0, 0, None, 0, 0)
    finally:
        if agent.poll() is None:
            stop_agent(agent)


def test_simulated_mode_registers_a_simulated_node(server: ServerProcess) -> None:
    settings = AgentSettings.load(
        server_url=server.url,
        token=server.token,
        node_name="e2e-sim",
        heartbeat_interval_seconds=0.2,
        health_interval_seconds=0.5,
        simulate_gpus=2,
    )
    agent = build_agent(settings, runner=FakeCommandRunner(installed=[]), clock=SystemClock())
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        node_id = str(poll(lambda: node_id_of(server, "e2e-sim")))
        rows = poll(lambda: samples(server, node_id, 1, source="simulated"))
        assert isinstance(rows, list)
        assert rows[0]["uuid"]
        assert samples(server, node_id, 1, source="real") == []
        node = next(item for item in server.get("/api/v1/nodes").json()["items"] if item["id"] == node_id)
        assert node["source"] == "simulated"
    finally:
        agent.stop_event.set()
        thread.join(20)
    assert agent.status().registrations == 1


def test_a_server_restart_loses_no_queued_xid_event(tmp_path: Path) -> None:
    server = start_server(tmp_path)
    fake = FakeNvml([FakeGpu(uuid="GPU-x0"), FakeGpu(uuid="GPU-x1")])
    settings = AgentSettings.load(
        server_url=server.url,
        token=server.token,
        node_name="e2e-xid",
        heartbeat_interval_seconds=0.1,
        health_interval_seconds=0.5,
        reconnect_initial_seconds=0.05,
        reconnect_max_seconds=0.2,
        request_timeout_seconds=2,
    )
    agent = build_agent(settings, runner=FakeCommandRunner(installed=[]), clock=SystemClock(), nvml_loader=lambda: fake)
    thread = threading.Thread(target=agent.run)
    thread.start()
    engine = sa.create_engine(server.database_url)
    try:
        assert agent.status().collection.collector == "nvml"
        poll(lambda: agent.status().beats_sent >= 2)
        server.stop()
        poll(lambda: agent.status().consecutive_failures >= 2)
        fake.emit_xid(1, 48)
        fake.emit_xid(0, 79)
        poll(lambda: agent.status().xid.pending == 2)
        poll(lambda: agent.status().consecutive_failures >= 4)  # events are retried while the server is away
        assert agent.status().xid.pending == 2
        server.start()

        def stored() -> list[tuple[int, int, str | None]]:
            with engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT gpu_index, xid, uuid FROM gpu_xid_events ORDER BY xid"))
                return [(int(r[0]), int(r[1]), r[2]) for r in rows]

        assert poll(stored) == [(1, 48, "GPU-x1"), (0, 79, "GPU-x0")]
        poll(lambda: agent.status().xid.pending == 0)
        assert agent.status().xid.dropped == 0
        assert agent.status().registrations == 1  # same node across the restart
    finally:
        agent.stop_event.set()
        thread.join(20)
        engine.dispose()
        server.stop()


def test_xid_collection_that_fails_is_shown_on_the_node_and_in_the_capability_matrix(tmp_path: Path) -> None:
    from heteroflow.agent.assembly import run_probe
    from heteroflow.agent.nvml import GPU_IS_LOST, NO_PERMISSION

    denied = {"nvmlDeviceRegisterEvents": NO_PERMISSION}
    lost = {"nvmlEventSetWait": GPU_IS_LOST, "nvmlDeviceGetUUID": GPU_IS_LOST}
    gpus = [FakeGpu(uuid="GPU-p0", errors=denied), FakeGpu(uuid="GPU-p1", errors=denied)]
    probe = run_probe(
        "nvml",
        runner=FakeCommandRunner(installed=[]),
        clock=SystemClock(),
        timeout_sec=5,
        nvml_loader=lambda: FakeNvml(gpus),
    )
    assert probe["xid_events"]["state"] == "not_collected"
    assert any(
        w.startswith("XID events: not collected: 2 card(s) not registered (no permission)") for w in probe["warnings"]
    )

    server = start_server(tmp_path)
    fake = FakeNvml(
        [
            FakeGpu(uuid="GPU-x0", ecc_corrected=1),
            FakeGpu(uuid="GPU-x1", ecc_corrected=1, errors=lost),
            FakeGpu(uuid="GPU-x2", ecc_corrected=1, errors=denied),
        ]
    )
    settings = AgentSettings.load(
        server_url=server.url, token=server.token, node_name="e2e-xid-status",
        heartbeat_interval_seconds=0.1, health_interval_seconds=0.5, request_timeout_seconds=2,
    )  # fmt: skip
    agent = build_agent(settings, runner=FakeCommandRunner(installed=[]), clock=SystemClock(), nvml_loader=lambda: fake)
    thread = threading.Thread(target=agent.run)
    thread.start()
    try:
        node_id = str(poll(lambda: node_id_of(server, "e2e-xid-status")))

        def node_xids() -> dict[str, object] | None:
            node = server.get(f"/api/v1/nodes/{node_id}").json()
            xids = node.get("xid_events")
            return xids if xids and xids.get("lost") else None

        xids = poll(node_xids)
        assert isinstance(xids, dict)
        assert xids["state"] == "partial"
        assert xids["watched"] == [0]
        assert xids["unwatched"] == [{"index": 2, "error": "no permission"}]

        def matrix() -> dict[int, str] | None:
            cards = server.get("/api/v1/gpu-health/capabilities").json()["cards"]
            by_index = {card["gpu_index"]: card["xid_events"] for card in cards if card["node_id"] == node_id}
            return by_index if len(by_index) == 3 else None

        assert poll(matrix) == {0: "collected", 1: "lost", 2: "not_collected"}
    finally:
        agent.stop_event.set()
        thread.join(20)
        server.stop()


def test_xids_in_the_kernel_log_before_start_are_stored_once_and_the_node_names_the_source(tmp_path: Path) -> None:
    """An XID raised while the agent was down is still in the ring buffer; a card NVML cannot register is read
    from the kernel log; an agent restart re-reads the record with the same time, so the server keeps one row."""
    from datetime import UTC, datetime, timedelta

    from heteroflow.agent.kernel_xid import DevKmsg
    from heteroflow.agent.nvml import NO_PERMISSION

    boot = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=2)
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "6,1,1000,-;Linux version 6.8.0\n"
        "4,2,3600000000,-;NVRM: Xid (PCI:0000:02:00): 48, pid=7, name=python3, An uncorrectable double bit error\n"
        # card 0 falls off the bus without an XID number: the split sentence, then the short line; one loss
        "3,3,3700000000,-;NVRM: The NVIDIA GPU 0000:01:00.0 (PCI ID: 10de:2330) installed in this system has\n"
        "3,4,3700000001,-;NVRM: fallen off the bus and is not responding to commands.\n"
        "3,5,3700000500,-;NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.\n",
        encoding="utf-8",
    )
    server = start_server(tmp_path)
    denied = {"nvmlDeviceRegisterEvents": NO_PERMISSION}
    fake = FakeNvml([FakeGpu(uuid="GPU-k0"), FakeGpu(uuid="GPU-k1", errors=denied)])
    settings = AgentSettings.load(
        server_url=server.url, token=server.token, node_name="e2e-kmsg",
        heartbeat_interval_seconds=0.1, health_interval_seconds=0.5, request_timeout_seconds=2,
    )  # fmt: skip
    engine = sa.create_engine(server.database_url)

    def run_once() -> None:
        agent = build_agent(
            settings,
            runner=FakeCommandRunner(installed=[]),
            clock=SystemClock(),
            nvml_loader=lambda: fake,
            kernel_log=DevKmsg(str(kmsg), btime=lambda: boot),
        )
        thread = threading.Thread(target=agent.run)
        thread.start()
        try:
            poll(lambda: agent.status().xid.delivered >= 2)
            poll(lambda: agent.status().beats_sent >= 2)
        finally:
            agent.stop_event.set()
            thread.join(20)

    def stored() -> list[tuple[int, int, str | None]]:
        with engine.connect() as conn:
            rows = conn.execute(sa.text("SELECT gpu_index, xid, uuid FROM gpu_xid_events ORDER BY id"))
            return [(int(r[0]), int(r[1]), r[2]) for r in rows]

    try:
        run_once()
        # the lost card is XID 79 on its card, stored once: what the serving controller reads as an L6 card fault
        poll(lambda: len(stored()) >= 2)
        assert sorted(stored()) == [(0, 79, "GPU-k0"), (1, 48, "GPU-k1")]
        node_id = str(node_id_of(server, "e2e-kmsg"))
        xids = server.get(f"/api/v1/nodes/{node_id}").json()["xid_events"]
        assert xids["sources"] == ["nvml", "kernel_log"]
        assert xids["kernel_log"] is None
        assert xids["state"] == "partial"  # card 0 is lost, by the kernel log's word
        assert xids["lost"] == [0]
        assert xids["watched"] == [0, 1]
        run_once()  # restarted: the ring buffer still holds the records
        assert sorted(stored()) == [(0, 79, "GPU-k0"), (1, 48, "GPU-k1")]
    finally:
        engine.dispose()
        server.stop()


def test_a_hung_tool_shows_in_the_node_status_within_two_health_intervals_and_beats_go_on(
    server: ServerProcess, tmp_path: Path
) -> None:
    env = agent_env(
        fake_smi_path(tmp_path),
        FAKE_NVIDIA_SMI_HELP=str(OWN_FIXTURES / "help-query-gpu.synthetic.txt"),
        FAKE_NVIDIA_SMI_CSV=str(OWN_FIXTURES / "query-gpu.synthetic.csv"),
        FAKE_NVIDIA_SMI_HANG="1",  # every call hangs, as on a card that wedges its tool
    )
    health_interval = 3.0
    agent = subprocess.Popen(
        [
            sys.executable, "-m", "heteroflow", "agent", "run", "--collector", "nvidia-smi",
            "--server", server.url, "--token", server.token, "--node-name", "e2e-hung-tool",
            "--heartbeat-interval", "0.2", "--health-interval", str(health_interval), "--tick-timeout", "1",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        node_id = str(poll(lambda: node_id_of(server, "e2e-hung-tool")))
        registered = time.monotonic()

        def node() -> dict[str, object]:
            body: dict[str, object] = server.get(f"/api/v1/nodes/{node_id}").json()
            return body

        stalls = poll(lambda: node()["tool_stalls"], timeout_sec=2 * health_interval)
        assert isinstance(stalls, list)
        assert time.monotonic() - registered <= 2 * health_interval
        (stall,) = stalls
        assert stall["tool"] == "nvidia-smi"
        assert stall["timeouts"] >= 1
        first_beat = node()["last_heartbeat"]
        assert poll(lambda: node()["last_heartbeat"] != first_beat, timeout_sec=10)  # the beats go on
        assert node()["online"] is True
    finally:
        if agent.poll() is None:
            stderr = stop_agent(agent)
            assert "Traceback" not in stderr
