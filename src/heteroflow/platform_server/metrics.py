"""Prometheus metrics of the platform server, on a registry of its own (no global state).

Counters kept by the services themselves (ingestion, liveness) are read from their status objects at
scrape time by a collector, so each number has exactly one owner.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Any, Final, Protocol, TypeAlias

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from heteroflow.core.admission import AdmissionStatus
from heteroflow.core.text import printable
from heteroflow.health.counters import HEALTH_KEYS, Counters
from heteroflow.health.gpu_metrics import METRIC_KEYS, GpuMetrics
from heteroflow.health.ingest import IngestStatus
from heteroflow.health.tool_stalls import NodeToolStalls
from heteroflow.platform.liveness import LivenessStatus


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._latest_gpus: Callable[[], Iterable[FlatCards]] = list
        """The cards' newest values for the per-GPU series (:meth:`watch_gpus`; none until then)."""
        self.beats = BeatTally(buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0))
        """Accepted heartbeats and their handling time (``heteroflow_heartbeats_total``,
        ``heteroflow_heartbeat_handler_seconds``)."""
        self.registry.register(self.beats)
        self.health_stats_invalid = Counter(
            "heteroflow_health_stats_invalid",
            "Heartbeat GPU stats whose health part was ignored (no valid declared index).",
            registry=self.registry,
        )
        self.sample_times_corrected = Counter(
            "heteroflow_sample_times_corrected",
            "Agent-claimed times not taken as they were, by kind (health, telemetry, xid) and reason: ahead "
            "(of the server's clock beyond the tolerance; the receive time is used), behind (older than a "
            "reading can be; the receive time is used), too_old (an XID older than the retention; rejected).",
            ["kind", "reason"],
            registry=self.registry,
        )
        self.xid_events_stored = Counter(
            "heteroflow_xid_events_stored",
            "XID events stored (re-sent duplicates excluded).",
            registry=self.registry,
        )
        self.db_statements = Counter(
            "heteroflow_db_statements",
            "SQL statements this server sent to the database (all paths).",
            registry=self.registry,
        )
        self.requests_denied = Counter(
            "heteroflow_requests_denied",
            "Requests refused before any work (no body read, no admission slot) because their bearer token is "
            "missing, unknown or revoked (401), or could not be checked (503).",
            ["status"],
            registry=self.registry,
        )
        self.heartbeats_foreign = Counter(
            "heteroflow_heartbeats_foreign",
            "Heartbeats for an existing node without that node's credential (answered 404, as a missing node).",
            registry=self.registry,
        )
        self.heartbeats_refused = Counter(
            "heteroflow_heartbeats_refused",
            "Heartbeats answered 503 + Retry-After by the admission gate, by reason: busy (max_in_flight_heartbeats "
            "in flight), tenant_share or token_share (the node's tenant, or the nodes of its token, hold their share "
            "of the gate) or lagging (the event loop behind by more than heartbeat_shed_lag_seconds).",
            ["reason"],
            registry=self.registry,
        )
        self.requests_limited = Counter(
            "heteroflow_requests_limited",
            "Requests answered 429 + Retry-After by a per-client limit before their body was read, by limit: node "
            "(max_in_flight_per_node heartbeats of one node), peer (max_in_flight_per_peer requests from one "
            "address) or credentials (an address or a token past max_failed_credentials 401s in its window).",
            ["limit"],
            registry=self.registry,
        )
        self.cards_refused = Counter(
            "heteroflow_cards_refused",
            "Heartbeat cards refused: an index beyond the node's gpu_count card slots, or a new uuid beyond "
            "max_new_cards_per_node_hour (the rest of the beat is kept; per node in its status).",
            registry=self.registry,
        )
        self.xid_events_refused = Counter(
            "heteroflow_xid_events_refused",
            "XID events refused: a card the node does not have, or over max_xid_events_per_beat or "
            "max_xid_events_per_node_hour (rejected with the reason, not retried).",
            registry=self.registry,
        )
        self.xid_event_failures = Counter(
            "heteroflow_xid_event_write_failures",
            "Heartbeats whose XID events could not be stored (the agent keeps and re-sends them).",
            registry=self.registry,
        )

        self.gc_pauses = Histogram(
            "heteroflow_gc_pause_seconds",
            "How long each garbage collection of this process held the interpreter (no request is answered "
            "meanwhile), seconds, by generation (2: a full collection).",
            ["generation"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )

    def observe_gc_pause(self, generation: int, seconds: float) -> None:
        self.gc_pauses.labels(generation=str(generation)).observe(seconds)

    def watch(self, ingest: Callable[[], IngestStatus], liveness: Callable[[], LivenessStatus]) -> None:
        self.registry.register(_StatusCollector(ingest, liveness))

    def watch_tool_stalls(self, stalled: Callable[[], Iterable[NodeToolStalls]]) -> None:
        """``heteroflow_node_tool_stalled_since_seconds{node, tool}``, read at scrape time from the nodes' newest
        beats (:mod:`heteroflow.health.tool_stalls`)."""
        self.registry.register(_ToolStallCollector(stalled))

    def watch_admission(self, admission: Callable[[], AdmissionStatus]) -> None:
        """The heartbeat gate's occupancy and shares, read from its status at scrape time."""
        self.registry.register(_AdmissionCollector(admission))

    def watch_gpus(self, latest: Callable[[], Iterable[FlatCards]]) -> None:
        """Per-GPU gauges read at scrape time from the newest values the server holds in memory (slices of cards,
        each a :data:`FlatCards` list)."""
        self._latest_gpus = latest

    def render(self) -> bytes:
        """The whole exposition: the registry's series, then the per-GPU ones (:func:`gpu_exposition`)."""
        return generate_latest(self.registry) + flat_exposition(
            list(itertools.chain.from_iterable(self._latest_gpus()))
        )

    async def scrape_parts(self) -> list[bytes]:
        """What :meth:`render` returns, in parts (the registry's series, then a part per per-GPU family) to be sent
        one after another: the per-GPU series are formatted and encoded in worker threads, the event loop only
        copies the cards' newest values (its own state, a slice at a time), and heartbeats go on while a fleet's
        lines are written (the loop waits for the interpreter lock after each turn meanwhile: at most the server's
        switch interval, 0.5 ms, where Python's 5 ms made each turn 5 ms long). Never joined on the loop: at 3,000
        nodes the joined text is 28 MB, and joining, encoding and adding to it there made the loop's longest
        stretch in a scrape 12-24 ms instead of 7-8 ms (``bench/scrape_stall.py``)."""
        own, cards = await self.own()
        return [own, *await card_parts(cards)]

    async def own(self) -> tuple[bytes, FlatCards]:
        """This process's registry series (text) and its cards' newest values (:data:`FlatCards`, copied a slice at
        a time: the loop answers what is ready between slices): what a sibling worker merges with its own."""
        own, cards = generate_latest(self.registry), FlatCards()
        for part in self._latest_gpus():
            cards += part
            await asyncio.sleep(0)
        return own, cards


async def card_parts(cards: FlatCards) -> list[bytes]:
    """The per-GPU series of ``cards``, a part per family, each formatted and encoded in a worker thread."""
    labels = await asyncio.to_thread(gpu_labels, cards)
    # one family per step (a fleet's family: ~20 ms): between steps the loop has the interpreter to itself
    return [await asyncio.to_thread(_family_bytes, family, cards, labels) for family in range(GPU_FAMILIES)]


def _family_bytes(family: int, cards: FlatCards, labels: Sequence[str]) -> bytes:
    return gpu_family(family, cards, labels).encode()


class BeatTally(Collector):
    """Accepted heartbeats and the time each took to handle, counted in plain numbers as they come (one bucket
    found in C, two additions: the hottest path pays no lock, label or metric object) and rendered at scrape time
    as the counter ``heteroflow_heartbeats`` and the histogram ``heteroflow_heartbeat_handler_seconds``."""

    def __init__(self, *, buckets: Sequence[float]) -> None:
        self._bounds = tuple(buckets)
        self._counts = [0] * (len(self._bounds) + 1)  # the last one is +Inf's own
        self._sum = 0.0
        self._created = time.time()

    def observe(self, seconds: float) -> None:
        """One accepted heartbeat that took ``seconds`` to handle (a bucket holds what is ≤ its bound)."""
        self._counts[bisect_left(self._bounds, seconds)] += 1
        self._sum += seconds

    def collect(self) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
        counts, total = list(self._counts), self._sum
        beats = CounterMetricFamily("heteroflow_heartbeats", "Heartbeats accepted.")
        beats.add_metric([], sum(counts), created=self._created)
        yield beats
        cumulative, running = [], 0
        for bound, count in zip((*map(floatToGoString, self._bounds), "+Inf"), counts, strict=True):
            running += count
            cumulative.append((bound, running))
        handled = HistogramMetricFamily(
            "heteroflow_heartbeat_handler_seconds", "Time spent handling one heartbeat, seconds."
        )
        handled.add_metric([], cumulative, sum_value=total)
        handled.samples.append(Sample("heteroflow_heartbeat_handler_seconds_created", {}, self._created))
        yield handled


class GpuValues(Protocol):
    """What the GPU collector reads of one card (``None`` = unknown: the series is left out, never 0)."""

    @property
    def node_name(self) -> str: ...
    @property
    def gpu_index(self) -> int: ...
    @property
    def uuid(self) -> str | None: ...
    @property
    def counters(self) -> Counters | None: ...
    @property
    def metrics(self) -> GpuMetrics | None: ...


#: (metric name, help, attribute, scale) of the per-GPU gauges; counter gauges keep the design's field names
_COUNTER_GAUGES = [
    (f"heteroflow_gpu_{name}", f"The card's {name.replace('_', ' ')} as last reported (absent when unknown).", name)
    for name in HEALTH_KEYS
]
_METRIC_GAUGES = [
    ("heteroflow_gpu_temperature_celsius", "GPU temperature, degrees Celsius.", "temperature_c", 1.0),
    ("heteroflow_gpu_utilization_percent", "GPU utilisation, percent.", "utilization_pct", 1.0),
    ("heteroflow_gpu_memory_used_bytes", "GPU memory in use, bytes.", "memory_used_mib", 1048576.0),
    ("heteroflow_gpu_memory_total_bytes", "GPU memory in total, bytes.", "memory_total_mib", 1048576.0),
    ("heteroflow_gpu_power_watts", "GPU power draw, watts.", "power_w", 1.0),
]
GPU_FAMILIES = len(_COUNTER_GAUGES) + len(_METRIC_GAUGES)
"""Per-GPU metric families: the health counters', then the telemetry's."""


FlatCards: TypeAlias = list[Any]
"""A scrape's cards in one flat list, :data:`CARD_ITEMS` items a card: node name, index, uuid, counters, then the
metrics' values in :data:`METRIC_KEYS` order (``None``: unknown or no longer reported). Made of the cards' own
values without an object per card, so that a fleet's scrape (24,000 cards) gives the cyclic collector nothing to
walk: with an object per card, the young collections that ran while a scrape was written walked them all and
promoted them to older generations (12 to 61 ms pauses during scrapes at 3,000 nodes, docs/benchmarks.md)."""
CARD_ITEMS = 4 + len(METRIC_KEYS)
NO_METRICS: Final = (None,) * len(METRIC_KEYS)
"""A card's metric values in :data:`FlatCards` while none is known."""


def flat_cards(cards: Iterable[GpuValues]) -> FlatCards:
    """``cards`` as :data:`FlatCards`."""
    flat: FlatCards = []
    for card in cards:
        flat += (card.node_name, card.gpu_index, card.uuid, card.counters, *(card.metrics or NO_METRICS))
    return flat


def gpu_exposition(cards: Sequence[GpuValues]) -> bytes:
    """The per-GPU series of ``cards`` in the Prometheus text format, byte for byte what ``prometheus_client``'s
    ``generate_latest`` writes for the same families (a hypothesis test holds the two equal).

    Written out because a fleet's cards make most of a scrape (3,000 nodes: 24,000 cards, 240,000 lines): through
    metric-family and sample objects that took seconds of the interpreter per scrape; here each card's label text
    is made once for its lines. :meth:`ServerMetrics.scrape_parts` runs the same steps in worker threads.
    """
    return flat_exposition(flat_cards(cards))


def flat_exposition(cards: FlatCards) -> bytes:
    """:func:`gpu_exposition` of :data:`FlatCards`."""
    labels = gpu_labels(cards)
    return "".join(gpu_family(family, cards, labels) for family in range(GPU_FAMILIES)).encode()


def gpu_labels(cards: FlatCards) -> list[str]:
    """Each card's label set as written after the series name (sorted by label name, as the library does)."""
    names, indexes, uuids = cards[0::CARD_ITEMS], cards[1::CARD_ITEMS], cards[2::CARD_ITEMS]
    return [
        f'{{gpu="{index}",node="{_label_value(name)}",uuid="{_label_value(uuid or "")}"}} '
        for name, index, uuid in zip(names, indexes, uuids, strict=True)
    ]


def gpu_family(family: int, cards: FlatCards, labels: Sequence[str]) -> str:
    """The text of per-GPU family number ``family`` (of :data:`GPU_FAMILIES`) of :data:`FlatCards`: its header
    and a line per card that knows the value (an unknown value has no series, never a 0)."""
    out: list[str] = []
    if family < len(_COUNTER_GAUGES):
        name, help_text, attribute = _COUNTER_GAUGES[family]
        # the two ECC totals only grow on a card (a new uuid is a new series): Prometheus counters, whose
        # exposition keeps the ``_total`` name; a gauge must not carry that suffix (promtool check metrics)
        kind = "counter" if name.endswith("_total") else "gauge"
        out.append(f"# HELP {name} {_help_text(help_text)}\n# TYPE {name} {kind}\n")
        read = attrgetter(attribute)
        texts: dict[float, str] = {}  # a fleet's counters take few values (mostly 0): each written once
        for counters, label in zip(cards[3::CARD_ITEMS], labels, strict=True):
            value = read(counters) if counters is not None else None
            if value is not None:
                text = texts.get(value)
                if text is None:
                    text = texts[value] = _go_float(value)
                out.append(f"{name}{label}{text}\n")
    else:
        name, help_text, attribute, scale = _METRIC_GAUGES[family - len(_COUNTER_GAUGES)]
        out.append(f"# HELP {name} {_help_text(help_text)}\n# TYPE {name} gauge\n")
        # a fleet's cards share many values (one memory size per model, whole-percent utilisation, whole degrees):
        # each distinct value is written once per scrape, then found; never a zero, whose sign the text keeps
        # (0.0 and -0.0 are one key)
        written: dict[float, str] = {}
        for value, label in zip(cards[4 + METRIC_KEYS.index(attribute) :: CARD_ITEMS], labels, strict=True):
            if value is not None:
                text = written.get(value) if value else None
                if text is None:
                    text = _go_float(value * scale)
                    if value:
                        written[value] = text
                out.append(f"{name}{label}{text}\n")
    return "".join(out)


_library_float: Callable[[float], str] = floatToGoString


def _go_float(value: float) -> str:
    """``prometheus_client``'s sample value text (``1.0``, ``+Inf``, ``1.5e+06``), its common case in C: a
    float's ``repr`` with a point in its first six characters, or not positive, is the library's text as it is."""
    text = repr(value)
    dot = text.find(".")
    if dot < 0 or (dot > 6 and value > 0):  # an int, inf, nan, an exponent, or Go's exponent from 1e6 up
        return _library_float(value)
    return text


def _label_value(value: str) -> str:
    # an agent's card uuid is untrusted text: NUL, controls and bidi overrides reach a label escaped
    return printable(value).replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _help_text(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


class _ToolStallCollector(Collector):
    def __init__(self, stalled: Callable[[], Iterable[NodeToolStalls]]) -> None:
        self._stalled = stalled

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "heteroflow_node_tool_stalled_since_seconds",
            "When the vendor tool's calls on the node began to time out without an answer since, Unix seconds "
            "(the agent's clock); absent while the tool answers.",
            labels=["node", "tool"],
        )
        for node in self._stalled():
            for stall in node.stalls:
                family.add_metric([node.node_name, stall.tool], stall.since.timestamp())
        yield family


class _AdmissionCollector(Collector):
    def __init__(self, admission: Callable[[], AdmissionStatus]) -> None:
        self._admission = admission

    def collect(self) -> Iterator[GaugeMetricFamily]:
        status = self._admission()
        for name, text, value in (
            ("in_flight", "Heartbeats in flight now.", status.in_flight),
            ("max_in_flight", "The heartbeat gate's size (max_in_flight_heartbeats).", status.max_in_flight),
            (
                "max_per_tenant",
                "The most heartbeats one tenant's nodes may have in flight (heartbeat_share_per_tenant of the gate).",
                status.max_per_tenant,
            ),
            (
                "max_per_token",
                "The most heartbeats one token's nodes may have in flight (heartbeat_share_per_token of a tenant's).",
                status.max_per_token,
            ),
            ("peak_per_tenant", "The most heartbeats one tenant had in flight at once.", status.peak_per_tenant),
        ):
            if value is None:
                continue
            gauge = GaugeMetricFamily(f"heteroflow_heartbeat_admission_{name}", text)
            gauge.add_metric([], value)
            yield gauge
        tenants = GaugeMetricFamily(
            "heteroflow_heartbeat_admission_tenant_in_flight",
            'Heartbeats in flight now of the (at most 10) busiest tenants (tenant "": nodes of no tenant).',
            labels=["tenant"],
        )
        for tenant, held in status.busiest_tenants:
            tenants.add_metric([printable(tenant)], held)
        yield tenants


class _StatusCollector(Collector):
    def __init__(self, ingest: Callable[[], IngestStatus], liveness: Callable[[], LivenessStatus]) -> None:
        self._ingest = ingest
        self._liveness = liveness

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        status = self._ingest()
        written = CounterMetricFamily("heteroflow_health_samples_written", "Health sample rows written.")
        written.add_metric([], status.written_total)
        yield written
        skipped = CounterMetricFamily(
            "heteroflow_health_readings_skipped", "Health readings not written, by reason.", labels=["reason"]
        )
        skipped.add_metric(["dedup_cache"], status.skipped_dedup_total)
        skipped.add_metric(["all_unknown"], status.skipped_all_unknown_total)
        skipped.add_metric(["unchanged"], status.skipped_unchanged_total)
        skipped.add_metric(["dropped"], status.dropped_total)
        yield skipped
        failures = CounterMetricFamily(
            "heteroflow_health_write_failures",
            "Failed health write transactions (side path; beats unaffected).",
        )
        failures.add_metric([], status.write_failures_total)
        yield failures
        moved = CounterMetricFamily(
            "heteroflow_health_rows_moved_after_newest",
            "Health rows whose time was not after their card's newest stored row (an agent clock stepped back) "
            "and were placed just after it, so the write policy's bound of rows holds.",
        )
        moved.add_metric([], status.moved_after_newest_total)
        yield moved
        selects = CounterMetricFamily(
            "heteroflow_health_latest_selects", "SELECTs of a card's newest row after a dedup cache miss."
        )
        selects.add_metric([], status.selects_total)
        yield selects
        cleanups = CounterMetricFamily(
            "heteroflow_health_cleanup_runs", "Retention cleanup runs, by outcome.", labels=["outcome"]
        )
        cleanups.add_metric(["ok"], status.cleanup_runs_total - status.cleanup_failures_total)
        cleanups.add_metric(["failed"], status.cleanup_failures_total)
        yield cleanups
        deleted = CounterMetricFamily("heteroflow_health_cleanup_deleted_rows", "Rows deleted by retention cleanup.")
        deleted.add_metric([], status.cleanup_deleted_total)
        yield deleted
        pending = GaugeMetricFamily("heteroflow_health_pending_readings", "Readings waiting for the writer.")
        pending.add_metric([], status.pending_readings)
        yield pending
        cache = GaugeMetricFamily("heteroflow_health_dedup_cache_entries", "Cards in the dedup cache.")
        cache.add_metric([], status.cache_entries)
        yield cache
        evictions = CounterMetricFamily(
            "heteroflow_health_dedup_capacity_evictions",
            "Dedup cache entries pushed out by the size bound; a steady rise means the cache is smaller than "
            "the fleet (nodes x GPUs) and steady beats cost SELECTs: raise GPU_HEALTH_DEDUP_CACHE_ENTRIES.",
        )
        evictions.add_metric([], status.cache_capacity_evictions)
        yield evictions
        live = self._liveness()
        flushes = CounterMetricFamily(
            "heteroflow_liveness_flushes", "Liveness flushes, by outcome.", labels=["outcome"]
        )
        flushes.add_metric(["ok"], live.flushes_total)
        flushes.add_metric(["failed"], live.flush_failures_total)
        yield flushes
