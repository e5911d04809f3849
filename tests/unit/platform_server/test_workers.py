"""Several server workers on one port answer /metrics as one server (``heteroflow.platform_server.workers``)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from heteroflow.platform_server.workers import SiblingMetrics, merge_expositions


def worker(*, beats: int, pending: int, newest: float, ecc: dict[str, int], seconds: list[float]) -> bytes:
    """What one worker renders: a counter, a histogram, a per-process gauge, a shared gauge, per-card series."""
    registry = CollectorRegistry()
    Counter("heteroflow_heartbeats", "Heartbeats accepted.", registry=registry).inc(beats)
    histogram = Histogram("heteroflow_heartbeat_seconds", "Beat time.", buckets=(0.01, 0.1), registry=registry)
    for value in seconds:
        histogram.observe(value)
    Gauge("heteroflow_health_pending_readings", "Waiting.", registry=registry).set(pending)
    Gauge("heteroflow_node_last_heartbeat_timestamp_seconds", "Newest.", registry=registry).set(newest)
    cards = Gauge("heteroflow_gpu_retired_pages", "Pages.", ["node", "gpu", "uuid"], registry=registry)
    for node, value in ecc.items():
        cards.labels(node=node, gpu="0", uuid=f"GPU-{node}").set(value)
    return generate_latest(registry)


def renders(**figures: Any) -> Callable[[], Awaitable[bytes]]:
    """A worker's own render, as the server hands it to :class:`SiblingMetrics` (a coroutine function)."""

    async def render() -> bytes:
        return worker(**figures)

    return render


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def test_counters_and_histograms_add_up_per_process_gauges_add_up_and_shared_facts_take_the_largest() -> None:
    a = worker(beats=3, pending=2, newest=100.0, ecc={"n1": 4, "n2": 1}, seconds=[0.005, 0.05])
    b = worker(beats=5, pending=1, newest=130.0, ecc={"n2": 2, "n3": 7}, seconds=[0.5])

    merged = samples(merge_expositions([a.decode(), b.decode()]))

    assert merged[("heteroflow_heartbeats_total", ())] == 8
    assert merged[("heteroflow_heartbeat_seconds_count", ())] == 3
    assert merged[("heteroflow_heartbeat_seconds_bucket", (("le", "0.01"),))] == 1
    assert merged[("heteroflow_heartbeat_seconds_bucket", (("le", "0.1"),))] == 2
    assert merged[("heteroflow_heartbeat_seconds_bucket", (("le", "+Inf"),))] == 3
    assert merged[("heteroflow_health_pending_readings", ())] == 3  # per-process state: the host's sum
    assert merged[("heteroflow_node_last_heartbeat_timestamp_seconds", ())] == 130.0  # one fact: the newest
    cards = {labels: value for (name, labels), value in merged.items() if name == "heteroflow_gpu_retired_pages"}
    by_node = {dict(labels)["node"]: value for labels, value in cards.items()}
    assert by_node == {"n1": 4, "n2": 2, "n3": 7}  # a card both heard: the larger (newer) count
    created = {name: value for (name, _), value in merged.items() if name.endswith("_created")}
    assert created["heteroflow_heartbeats_created"] == min(
        samples(a)[("heteroflow_heartbeats_created", ())], samples(b)[("heteroflow_heartbeats_created", ())]
    )


def test_one_exposition_merges_to_itself() -> None:
    alone = worker(beats=2, pending=0, newest=5.0, ecc={"n1": 1}, seconds=[0.02])
    assert samples(merge_expositions([alone.decode()])) == samples(alone)


def test_a_scrape_on_one_worker_includes_its_siblings_and_leaves_out_a_dead_or_stalled_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        first = SiblingMetrics(tmp_path, renders(beats=3, pending=1, newest=1, ecc={}, seconds=[]), name="a")
        second = SiblingMetrics(tmp_path, renders(beats=4, pending=1, newest=2, ecc={}, seconds=[]), name="b")
        await first.start()
        await second.start()
        assert oct((tmp_path / "a.sock").stat().st_mode & 0o777) == "0o600"

        merged = samples(await first.render())
        assert merged[("heteroflow_heartbeats_total", ())] == 7
        assert merged[("heteroflow_server_workers", ())] == 2
        assert samples(await second.render())[("heteroflow_heartbeats_total", ())] == 7  # either worker answers

        # a killed worker leaves its socket file behind: nobody listens there
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(str(tmp_path / "dead.sock"))
        dead.close()
        # a stalled worker accepts and never answers
        held: list[asyncio.StreamWriter] = []

        async def never_answer(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            held.append(writer)

        stalled = await asyncio.start_unix_server(never_answer, path=str(tmp_path / "slow.sock"))
        impatient = SiblingMetrics(
            tmp_path, renders(beats=1, pending=0, newest=0, ecc={}, seconds=[]), name="c", timeout_sec=0.2
        )
        await impatient.start()
        try:
            merged = samples(await impatient.render())
        finally:
            for writer in held:
                writer.close()
            stalled.close()
            await stalled.wait_closed()
        assert merged[("heteroflow_heartbeats_total", ())] == 8
        assert merged[("heteroflow_server_workers", ())] == 3
        assert merged[("heteroflow_server_workers_unanswered_total", ())] == 1
        assert not (tmp_path / "dead.sock").exists()  # cleared, not asked again

        await second.stop()
        assert not (tmp_path / "b.sock").exists()
        assert samples(await first.render())[("heteroflow_heartbeats_total", ())] == 3 + 1
        await first.stop()
        await impatient.stop()

    asyncio.run(scenario())
