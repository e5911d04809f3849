"""Several server processes on one host: ``heteroflow server --workers N``.

The workers are replicas, as several servers on one PostgreSQL are (docs/deploy.md): they share one listening
socket (the kernel hands each new connection to one of them), the database, the liveness flush and the
prediction worker's lease. What each keeps in memory stays its own — the dedup cache, the heartbeat admission
and client limits, the GPU metrics recorder, the counters — exactly as on separate replicas.

One thing replicas get from Prometheus and workers behind one port do not: a scrape per process. So each worker
also answers its own metrics on a private Unix socket in a directory only the server's user can enter, and the
worker a scrape reaches asks its siblings there and answers the merge: the host reads as one server. A sibling
answers its registry's series as text and its cards' newest values as data (:func:`encode_answer`, JSON); the
registries are merged as series (:func:`merge_expositions`: counters add up), the cards card by card
(:func:`merge_cards`: a card two workers heard is one card, never summed), and the per-GPU lines are written
once, by the asking worker, as a single process writes its own. A sibling that does not answer within
:data:`SIBLING_TIMEOUT_SEC` is left out of that scrape (and counted in
``heteroflow_server_workers_unanswered_total``) instead of failing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Final

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from heteroflow.health.counters import HEALTH_KEYS, Counters
from heteroflow.health.gpu_metrics import METRIC_KEYS
from heteroflow.platform_server.metrics import CARD_ITEMS, NO_METRICS, FlatCards, card_parts

_log = structlog.get_logger(__name__)

WORKER_DIR_ENV: Final = "HETEROFLOW_SERVER_WORKER_DIR"
"""Set by the supervising process for its workers: the private directory of their metrics sockets. Not a
setting: the supervisor makes the directory (mode 0700) and removes it when it stops."""

SIBLING_TIMEOUT_SEC: Final = 2.0
"""How long a scrape waits for a sibling's metrics, seconds (a render takes milliseconds; a worker stalled longer
is left out of this scrape rather than making Prometheus time out)."""

MAX_SIBLING_BYTES: Final = 256 * 1024 * 1024
"""Largest exposition read from a sibling (a 10,000-node fleet's per-card series are tens of MiB)."""

SUMMED_GAUGES: Final = frozenset(
    {
        "heteroflow_health_pending_readings",
        "heteroflow_health_dedup_cache_entries",
        # each worker has its own heartbeat gate: the host holds the sum (its size and shares, too)
        "heteroflow_heartbeat_admission_in_flight",
        "heteroflow_heartbeat_admission_max_in_flight",
        "heteroflow_heartbeat_admission_max_per_tenant",
        "heteroflow_heartbeat_admission_max_per_token",
        "heteroflow_heartbeat_admission_tenant_in_flight",
    }
)
"""Gauges of per-process state: the host's value is the sum over its workers. Every other gauge is the same fact
seen by each worker (a database count, the newest beat) and merges as the largest value. The cards' series are
not in the merged texts: :func:`merge_cards` merges the cards themselves."""

_SUMMED_TYPES: Final = frozenset({"counter", "histogram", "summary", "gaugehistogram"})


def merge_expositions(texts: Sequence[str]) -> bytes:
    """One exposition from several processes' (Prometheus text format): counters, histograms and the gauges in
    :data:`SUMMED_GAUGES` add up; ``_created`` samples take the earliest; other gauges take the largest value."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            merged = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            seen = values.setdefault(family.name, {})
            for sample in family.samples:
                key = (sample.name, tuple(sample.labels.items()))
                old = seen.get(key)
                seen[key] = sample.value if old is None else _combine(merged, sample.name, old, sample.value)
    for name, merged in families.items():
        for (sample_name, labels), value in values[name].items():
            merged.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


def _combine(family: Metric, sample_name: str, old: float, new: float) -> float:
    if sample_name.endswith("_created"):
        return min(old, new)
    if family.type in _SUMMED_TYPES or family.name in SUMMED_GAUGES:
        return old + new
    return max(old, new)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def merge_cards(parts: Sequence[FlatCards]) -> FlatCards:
    """The cards of several workers as one host's: a card (node name, index, uuid: the series' labels) that more
    than one worker heard -- its node's connection moved between them -- is one card, each value the largest that
    a worker holds (the error counters only grow, so the largest is the newest; unknown stays unknown unless a
    worker knows it). Summing them, as the counter-typed ECC totals would be as series, counted the card twice."""
    if len(parts) == 1:
        return parts[0]
    merged: dict[tuple[object, ...], list[Any]] = {}
    for cards in parts:
        for start in range(0, len(cards), CARD_ITEMS):
            name, index, uuid, counters, *metrics = cards[start : start + CARD_ITEMS]
            known = merged.get((name, index, uuid))
            if known is None:
                merged[(name, index, uuid)] = [counters, metrics]
            else:
                known[0] = _larger_counters(known[0], counters)
                known[1] = _larger_values(known[1], metrics)
    flat: FlatCards = []
    for (name, index, uuid), (counters, metrics) in merged.items():
        flat += (name, index, uuid, counters, *metrics)
    return flat


def _larger_counters(a: Counters | None, b: Counters | None) -> Counters | None:
    if a is None or b is None:
        return b if a is None else a
    return Counters(*_larger_values(_counter_values(a), _counter_values(b)))


def _larger_values(a: Sequence[float | None], b: Sequence[float | None]) -> list[Any]:
    return [y if x is None else x if y is None else max(x, y) for x, y in zip(a, b, strict=True)]


def _counter_values(counters: Counters) -> tuple[int | None, ...]:
    return tuple(getattr(counters, key) for key in HEALTH_KEYS)


def encode_answer(own: bytes, cards: FlatCards) -> bytes:
    """A worker's answer to a sibling: its registry's series (text, length first), then its cards as JSON (the
    counters and the metrics as lists of values in :data:`HEALTH_KEYS` and :data:`METRIC_KEYS` order, ``null`` for
    unknown): a fraction of what parsing the per-GPU lines of a fleet back from text costs."""
    wire: list[object] = []
    for start in range(0, len(cards), CARD_ITEMS):
        name, index, uuid, counters, *metrics = cards[start : start + CARD_ITEMS]
        wire += (name, index, uuid, None if counters is None else _counter_values(counters), metrics)
    return struct.pack("!Q", len(own)) + own + json.dumps(wire, separators=(",", ":")).encode()


def decode_answer(answer: bytes) -> tuple[str, FlatCards]:
    """What :func:`encode_answer` wrote: the registry's text and the cards. A broken answer raises ``ValueError``
    (its message names a sibling's answer), whatever part of it is broken."""
    if len(answer) < 8:
        raise ValueError("a sibling's answer ended before its length")
    (size,) = struct.unpack("!Q", answer[:8])
    if 8 + size > len(answer):
        raise ValueError("a sibling's answer is shorter than its registry text")
    try:
        text = answer[8 : 8 + size].decode()
        wire = json.loads(answer[8 + size :])
    except ValueError as exc:  # not UTF-8, not JSON
        raise ValueError(f"a sibling's answer is broken: {exc}") from exc
    try:  # read here, in the asking worker's thread: a text the merge cannot read is this sibling's answer refused
        for _ in text_string_to_metric_families(text):
            pass
    except Exception as exc:  # the parser's errors are not all ValueErrors
        raise ValueError(f"a sibling's series are not in the text format: {exc!r:.200}") from exc
    if not isinstance(wire, list) or len(wire) % _WIRE_ITEMS:
        raise ValueError("a sibling's cards are not a list of whole cards")
    cards: FlatCards = []
    for start in range(0, len(wire), _WIRE_ITEMS):
        name, index, uuid, counters, metrics = wire[start : start + _WIRE_ITEMS]
        if type(name) is not str or type(index) is not int or not (uuid is None or type(uuid) is str):
            raise ValueError(f"a sibling's card is not (name, index, uuid, ...): {wire[start : start + 3]!r:.200}")
        cards += (
            name,
            index,
            uuid,
            None if counters is None else Counters(*_values(counters, len(HEALTH_KEYS), _COUNTER_TYPES)),
            *(NO_METRICS if metrics is None else _values(metrics, len(METRIC_KEYS), _METRIC_TYPES)),
        )
    return text, cards


_WIRE_ITEMS: Final = 5
"""A card on the wire: name, index, uuid, its counters' values (or null), its metrics' values."""
_COUNTER_TYPES: Final[frozenset[type]] = frozenset({int, type(None)})
_METRIC_TYPES: Final[frozenset[type]] = frozenset({float, int, type(None)})


def _values(values: object, size: int, types: frozenset[type]) -> list[Any]:
    if not isinstance(values, list) or len(values) != size or not types.issuperset(map(type, values)):
        raise ValueError(f"a sibling's card values are not {size} numbers or nulls: {values!r:.200}")
    return values


class SiblingMetrics:
    """This worker's metrics socket, and the host-wide render that asks every sibling's."""

    def __init__(
        self,
        directory: Path,
        own: Callable[[], Awaitable[tuple[bytes, FlatCards]]],
        *,
        name: str | None = None,
        timeout_sec: float = SIBLING_TIMEOUT_SEC,
    ) -> None:
        self._directory = directory
        self._own = own
        self._path = directory / f"{name or os.getpid()}.sock"
        self._timeout_s = timeout_sec
        self._server: asyncio.Server | None = None
        self.unanswered_total = 0
        """Sibling renders left out of a scrape (no answer within the timeout, or a broken answer)."""

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()  # a previous process with this pid
        self._server = await asyncio.start_unix_server(self._answer, path=str(self._path))
        self._path.chmod(0o600)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()

    async def _local(self) -> tuple[bytes, FlatCards]:
        """This worker's own series, with its count of siblings it could not hear (summed like any counter), and
        its cards."""
        unanswered = (
            "# HELP heteroflow_server_workers_unanswered_total Sibling worker renders left out of a scrape this worker "
            f"answered (no answer within {self._timeout_s:g} s, or a broken one).\n"
            "# TYPE heteroflow_server_workers_unanswered_total counter\n"
            f"heteroflow_server_workers_unanswered_total {self.unanswered_total}\n"
        )
        own, cards = await self._own()
        return own + unanswered.encode(), cards

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            own, cards = await self._local()
            writer.write(await asyncio.to_thread(encode_answer, own, cards))
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the asking worker gave up (timeout): nothing to do
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    def siblings(self) -> list[Path]:
        """The other workers' sockets now in the directory."""
        return sorted(path for path in self._directory.glob("*.sock") if path != self._path)

    async def render(self) -> list[bytes]:
        """This host's metrics, in parts to be sent one after another: the merged registries' series, then the
        merged cards' per-GPU families (:func:`~heteroflow.platform_server.metrics.card_parts`)."""
        answers = await asyncio.gather(*(self._ask(path) for path in self.siblings()))
        own, cards = await self._local()  # after the asks: it counts this scrape's unanswered siblings
        heard = [(own.decode(), cards), *(answer for answer in answers if answer is not None)]
        workers = (
            "# HELP heteroflow_server_workers Server worker processes whose metrics this scrape includes.\n"
            "# TYPE heteroflow_server_workers gauge\n"
            f"heteroflow_server_workers {len(heard)}\n"
        )
        # parsing and merging is Python work: off the loop that answers heartbeats
        registry = await asyncio.to_thread(merge_expositions, [text for text, _ in heard])
        merged = await asyncio.to_thread(merge_cards, [found for _, found in heard])
        return [registry + workers.encode(), *await card_parts(merged)]

    async def _ask(self, path: Path) -> tuple[str, FlatCards] | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                reader, writer = await asyncio.open_unix_connection(str(path))
                try:
                    answer = await _read_all(reader)
                finally:
                    writer.close()
            return await asyncio.to_thread(decode_answer, answer)
        except (ConnectionRefusedError, FileNotFoundError):
            # a worker that exited without removing its socket (killed): nobody listens there any more
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # noqa: ASYNC240 - one unlink of a socket file, no wait
            return None
        except (TimeoutError, OSError, ValueError) as exc:
            self.unanswered_total += 1
            _log.warning("server.worker_metrics_unanswered", socket=path.name, error=repr(exc)[:300])
            return None


async def _read_all(reader: asyncio.StreamReader) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await reader.read(1 << 20):
        size += len(chunk)
        if size > MAX_SIBLING_BYTES:
            raise OSError(f"a sibling's metrics passed {MAX_SIBLING_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def worker_directory() -> Path | None:
    """The metrics-socket directory the supervisor handed this worker, or ``None`` for a single process."""
    value = os.environ.get(WORKER_DIR_ENV)
    return Path(value) if value else None
