"""What a /metrics scrape copies of the cards' newest values: their own values in one flat list per slice, no
object per card for the cyclic collector to walk, and nothing stale."""

from __future__ import annotations

import gc
import itertools

from heteroflow.core.testing import FakeClock
from heteroflow.health.gpu_metrics import GpuMetrics
from heteroflow.platform_server.gpu_metrics import GpuMetricsRecorder
from heteroflow.platform_server.metrics import CARD_ITEMS, FlatCards, gpu_exposition
from tests.unit.platform_server.test_gpu_exposition import LatestCard
from tests.unit.platform_server.test_metrics_flush_pacing import CARDS, NODES, T0, FakeStore, beat_fleet, recorder


def _copy(rec: GpuMetricsRecorder) -> tuple[FlatCards, int]:
    """The scrape's copy, and how many more objects the collector tracks once it is made."""
    gc.collect()
    gc.disable()  # nothing collected meanwhile: the count is what the copy left alive
    try:
        before = gc.get_count()[0]
        copied = list(itertools.chain.from_iterable(rec.latest(slice_cards=16)))
        return copied, gc.get_count()[0] - before
    finally:
        gc.enable()


def test_the_copy_is_the_cards_own_values_without_an_object_per_card() -> None:
    clock = FakeClock(T0)
    rec = recorder(clock, FakeStore())
    beat_fleet(rec, clock)

    copied, tracked = _copy(rec)
    assert len(copied) == NODES * CARDS * CARD_ITEMS
    assert tracked < 50  # a handful (the lists, freelists), whatever the number of cards: not one per card (200)
    first = LatestCard("node-000", 0, "GPU-0-0", None, GpuMetrics(40.0, 50.0, 1000.0, 80_000.0, 300.0))
    assert copied[:CARD_ITEMS] == [first.node_name, first.gpu_index, first.uuid, first.counters, *(first.metrics or ())]
    # the scrape writes from it what it writes from the cards themselves
    cards = [
        LatestCard(copied[i], copied[i + 1], copied[i + 2], copied[i + 3], GpuMetrics(*copied[i + 4 : i + CARD_ITEMS]))
        for i in range(0, len(copied), CARD_ITEMS)
    ]
    assert b'heteroflow_gpu_temperature_celsius{gpu="0",node="node-000",uuid="GPU-0-0"} 40.0\n' in gpu_exposition(cards)


def test_a_card_no_longer_reported_is_left_out() -> None:
    clock = FakeClock(T0)
    rec = recorder(clock, FakeStore(), export_stale_seconds=60.0)
    beat_fleet(rec, clock)
    clock.advance(61)

    copied, _ = _copy(rec)
    assert copied == []
