"""Several server workers on one port answer /metrics as one server (``heteroflow.platform_server.workers``)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from heteroflow.health.counters import Counters
from heteroflow.health.gpu_metrics import GpuMetrics
from heteroflow.platform_server.metrics import CARD_ITEMS, NO_METRICS, FlatCards, flat_exposition
from heteroflow.platform_server.workers import (
    SiblingMetrics,
    decode_answer,
    encode_answer,
    merge_cards,
    merge_expositions,
)


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


def renders(cards: FlatCards | None = None, **figures: Any) -> Callable[[], Awaitable[tuple[bytes, FlatCards]]]:
    """A worker's own series and cards, as the server hands them to :class:`SiblingMetrics` (a coroutine
    function, as ``ServerMetrics.own``)."""

    async def render() -> tuple[bytes, FlatCards]:
        return worker(**figures), list(cards or [])

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

        merged = samples(b"".join(await first.render()))
        assert merged[("heteroflow_heartbeats_total", ())] == 7
        assert merged[("heteroflow_server_workers", ())] == 2
        assert samples(b"".join(await second.render()))[("heteroflow_heartbeats_total", ())] == 7  # either worker

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
            merged = samples(b"".join(await impatient.render()))
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
        assert samples(b"".join(await first.render()))[("heteroflow_heartbeats_total", ())] == 3 + 1
        await first.stop()
        await impatient.stop()

    asyncio.run(scenario())


def card(node: str, counters: Counters | None, metrics: GpuMetrics | None, *, uuid: str | None = "GPU-1") -> FlatCards:
    return [node, 0, uuid, counters, *(metrics or NO_METRICS)]


def test_a_card_two_workers_heard_is_one_card_with_the_larger_values_never_their_sum() -> None:
    # the node's connection moved from worker a to worker b: both hold the card, b the newer reading
    a = card("n1", Counters(ecc_uncorrected_total=3, ecc_corrected_total=10), GpuMetrics(41.0, 90.0, None, 1.0, 300.0))
    b = card("n1", Counters(ecc_uncorrected_total=4, ecc_corrected_total=10, retired_pages=None), GpuMetrics(40.0))
    only_b = card("n2", Counters(retired_pages=2), None)

    merged = merge_cards([a, b + only_b])

    assert merged == [
        "n1",
        0,
        "GPU-1",
        Counters(ecc_uncorrected_total=4, ecc_corrected_total=10),  # unknown in both stays unknown: no 0
        *GpuMetrics(41.0, 90.0, None, 1.0, 300.0),  # what only a knew is kept
        *only_b,
    ]
    # a new uuid in the same slot is another card (another series)
    assert len(merge_cards([a, card("n1", Counters(ecc_uncorrected_total=0), None, uuid="GPU-2")])) == 2 * CARD_ITEMS


def test_the_host_scrape_counts_a_shared_card_once_and_reads_as_one_process_would(tmp_path: Path) -> None:
    shared = Counters(ecc_uncorrected_total=3, ecc_corrected_total=10, retired_pages=1)
    newer = Counters(ecc_uncorrected_total=5, ecc_corrected_total=10, retired_pages=1)
    first_cards = card("n1", shared, GpuMetrics(41.0)) + card("n2", Counters(ecc_corrected_total=1), None)
    second_cards = card("n1", newer, GpuMetrics(43.0))

    async def scenario() -> bytes:
        first = SiblingMetrics(
            tmp_path, renders(first_cards, beats=1, pending=0, newest=1, ecc={}, seconds=[]), name="a"
        )
        second = SiblingMetrics(
            tmp_path, renders(second_cards, beats=1, pending=0, newest=1, ecc={}, seconds=[]), name="b"
        )
        await first.start()
        await second.start()
        try:
            return b"".join(await first.render())
        finally:
            await first.stop()
            await second.stop()

    scraped = asyncio.run(scenario())
    alone = flat_exposition(card("n1", newer, GpuMetrics(43.0)) + card("n2", Counters(ecc_corrected_total=1), None))
    # the per-GPU lines are those one process holding the merged cards writes, byte for byte
    assert alone in scraped
    merged = samples(scraped)
    ecc = ("heteroflow_gpu_ecc_uncorrected_total", (("gpu", "0"), ("node", "n1"), ("uuid", "GPU-1")))
    assert merged[ecc] == 5  # the newer count, not 3 + 5


def test_a_sibling_answer_survives_the_wire_and_a_broken_one_is_refused_as_a_whole() -> None:
    cards = card('we"ird\n\u202e', Counters(1, None, 2), GpuMetrics(None, 5.5, 1e6, None, 0.0), uuid=None)
    own = b"# TYPE x counter\nx_total 1.0\n"
    assert decode_answer(encode_answer(own, cards)) == (own.decode(), cards)

    answer = encode_answer(own, cards)
    broken = [
        answer[:5],  # ends inside the length
        answer[:12],  # shorter than the registry text it announces
        answer[:-3],  # the cards cut off: not JSON
        answer[: -len(b"]")] + b',"extra"]',  # not whole cards
        encode_answer(own, [])[:-2] + b'["n",0,null,[1,2],null]',  # counters of the wrong size
        encode_answer(own, [])[:-2] + b'["n",0,null,null,{"t":1}]',  # metrics that are not values
        answer[:8] + b"\xff" + answer[9:],  # the text is not UTF-8
        encode_answer(own, [])[:-2] + b"[7,0,null,null,null]",  # a name that is no text
        encode_answer(b"x_total{le= 1\n", cards),  # series the merge could not read
        encode_answer(own, [])[:-2] + b'["n",0,null,[1,2,"3",4,5,6,7,8,9],null]',  # a counter that is no number
    ]
    for wire in broken:
        with pytest.raises(ValueError, match="a sibling's"):
            decode_answer(wire)
    # the cards of the last cases are well-formed JSON: refused for what they hold
    assert decode_answer(encode_answer(own, [])[:-2] + b'["n",0,null,[1,2,3,4,5,6,7,8,9],null]')[1][3] == Counters(
        1, 2, 3, 4, 5, 6, 7, 8, 9
    )


def test_a_sibling_answering_garbage_is_left_out_and_counted(tmp_path: Path) -> None:
    async def scenario() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        async def garbage(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"\x00\x00\x00\x00\x00\x00\x00\x02{}not json")
            await writer.drain()
            writer.close()

        bad = await asyncio.start_unix_server(garbage, path=str(tmp_path / "bad.sock"))
        good = SiblingMetrics(tmp_path, renders(beats=2, pending=0, newest=1, ecc={}, seconds=[]), name="good")
        await good.start()
        try:
            return samples(b"".join(await good.render()))
        finally:
            await good.stop()
            bad.close()
            await bad.wait_closed()

    merged = asyncio.run(scenario())
    assert merged[("heteroflow_heartbeats_total", ())] == 2
    assert merged[("heteroflow_server_workers", ())] == 1
    assert merged[("heteroflow_server_workers_unanswered_total", ())] == 1
