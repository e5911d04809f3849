"""The per-GPU series of /metrics, written out (``metrics.gpu_exposition``): byte for byte ``prometheus_client``'s."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from heteroflow.core.text import printable
from heteroflow.health.counters import HEALTH_KEYS, Counters
from heteroflow.health.gpu_metrics import GpuMetrics
from heteroflow.platform_server import metrics as metrics_module
from heteroflow.platform_server.metrics import (
    _COUNTER_GAUGES,
    _METRIC_GAUGES,
    GPU_FAMILIES,
    FlatCards,
    ServerMetrics,
    flat_cards,
    gpu_exposition,
    gpu_family,
)


@dataclass(frozen=True, slots=True)
class LatestCard:
    """The newest known values of one card, as :class:`~heteroflow.platform_server.metrics.GpuValues` reads them
    (``None`` = unknown or no longer reported)."""

    node_name: str
    gpu_index: int
    uuid: str | None
    counters: Counters | None
    metrics: GpuMetrics | None


class LibraryGpuCollector(Collector):
    """The same families through the library's own metric families and ``generate_latest``: the reference."""

    def __init__(self, cards: Sequence[LatestCard]) -> None:
        self._cards = cards

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["node", "gpu", "uuid"]
        for name, help_text, attribute in _COUNTER_GAUGES:
            family: GaugeMetricFamily | CounterMetricFamily = (
                CounterMetricFamily(name.removesuffix("_total"), help_text, labels=labels)
                if name.endswith("_total")
                else GaugeMetricFamily(name, help_text, labels=labels)
            )
            for card in self._cards:
                value = getattr(card.counters, attribute) if card.counters is not None else None
                if value is not None:
                    family.add_metric(self._labels(card), float(value))
            yield family
        for name, help_text, attribute, scale in _METRIC_GAUGES:
            family = GaugeMetricFamily(name, help_text, labels=labels)
            for card in self._cards:
                value = card.metrics.value(attribute) if card.metrics is not None else None
                if value is not None:
                    family.add_metric(self._labels(card), value * scale)
            yield family

    @staticmethod
    def _labels(card: LatestCard) -> list[str]:
        return [printable(card.node_name), str(card.gpu_index), printable(card.uuid or "")]


def library_exposition(cards: Sequence[LatestCard]) -> bytes:
    registry = CollectorRegistry()
    registry.register(LibraryGpuCollector(cards))
    return generate_latest(registry)


_counts = st.none() | st.integers(min_value=0, max_value=10**15)
_values = st.none() | st.floats(allow_nan=False, min_value=-1e9, max_value=1e12)
_cards = st.builds(
    LatestCard,
    node_name=st.text(max_size=12),  # quotes, backslashes, newlines, controls and bidi overrides included
    gpu_index=st.integers(min_value=0, max_value=1023),
    uuid=st.none() | st.text(max_size=12),
    counters=st.none() | st.builds(Counters, **dict.fromkeys(HEALTH_KEYS, _counts)),
    metrics=st.none() | st.builds(GpuMetrics, _values, _values, _values, _values, _values),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_cards, max_size=6))
def test_the_written_out_series_are_the_librarys_to_the_byte(cards: list[LatestCard]) -> None:
    assert gpu_exposition(cards) == library_exposition(cards)


# a fleet's cards repeat values (the exposition writes each once per scrape): zeros of both signs among them
_shared = st.none() | st.sampled_from([0.0, -0.0, 0, 1.5, 100, 100.0, 81559.0, 999_999.0, 1e6, 8.5e10])
_fleet_cards = st.builds(
    LatestCard,
    node_name=st.sampled_from(["a", "b"]),
    gpu_index=st.integers(min_value=0, max_value=7),
    uuid=st.none(),
    counters=st.none(),
    metrics=st.builds(GpuMetrics, _shared, _shared, _shared, _shared, _shared),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_fleet_cards, min_size=2, max_size=24))
def test_values_many_cards_share_are_written_as_the_library_writes_each(cards: list[LatestCard]) -> None:
    assert gpu_exposition(cards) == library_exposition(cards)


def test_a_scrape_formats_the_cards_in_worker_threads_and_says_what_render_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cards = [
        LatestCard("node-a", 0, "GPU-1", Counters(0, 3, 1, 0, 0), GpuMetrics(41.0, 99.0, 1024.0, 81559.0, 350.5)),
        LatestCard('we"ird\n\u202e', 1, None, None, GpuMetrics(None, 5.0, None, None, None)),
    ]
    metrics = ServerMetrics()
    metrics.watch_gpus(lambda: [flat_cards(cards[:1]), flat_cards(cards[1:])])
    threads: dict[str, int] = {}

    def watched(family: int, found: FlatCards, labels: Sequence[str]) -> str:
        threads["formatted"] = threading.get_ident()
        return gpu_family(family, found, labels)

    async def scrape() -> list[bytes]:
        threads["loop"] = threading.get_ident()
        return await metrics.scrape_parts()

    monkeypatch.setattr(metrics_module, "gpu_family", watched)
    parts = asyncio.run(scrape())
    scraped = b"".join(parts)

    assert threads["formatted"] != threads["loop"]
    assert scraped == metrics.render()
    # in parts to be sent one after another: the registry's series, then a family each
    assert len(parts) == 1 + GPU_FAMILIES
    assert b'heteroflow_gpu_temperature_celsius{gpu="0",node="node-a",uuid="GPU-1"} 41.0\n' in scraped
    # the refused characters shown by their escapes, then escaped for the format: \" and \\
    assert b'heteroflow_gpu_utilization_percent{gpu="1",node="we\\"ird\\\\n\\\\u202e",uuid=""} 5.0\n' in scraped
