"""Several server processes on one host: ``heteroflow server --workers N``.

The workers are replicas, as several servers on one PostgreSQL are (docs/deploy.md): they share one listening
socket (the kernel hands each new connection to one of them), the database, the liveness flush and the
prediction worker's lease. What each keeps in memory stays its own — the dedup cache, the heartbeat admission
and client limits, the GPU metrics recorder, the counters — exactly as on separate replicas.

One thing replicas get from Prometheus and workers behind one port do not: a scrape per process. So each worker
also answers its own metrics on a private Unix socket in a directory only the server's user can enter, and the
worker a scrape reaches asks its siblings there and answers the sum (:func:`merge_expositions`): the host reads as
one server. A sibling that does not answer within :data:`SIBLING_TIMEOUT_SEC` is left out of that scrape (and
counted in ``heteroflow_server_workers_unanswered_total``) instead of failing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Final

import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

_log = structlog.get_logger(__name__)

WORKER_DIR_ENV: Final = "HETEROFLOW_SERVER_WORKER_DIR"
"""Set by the supervising process for its workers: the private directory of their metrics sockets. Not a
setting: the supervisor makes the directory (mode 0700) and removes it when it stops."""

SIBLING_TIMEOUT_SEC: Final = 2.0
"""How long a scrape waits for a sibling's metrics, seconds (a render takes milliseconds; a worker stalled longer
is left out of this scrape rather than making Prometheus time out)."""

MAX_SIBLING_BYTES: Final = 256 * 1024 * 1024
"""Largest exposition read from a sibling (a 10,000-node fleet's per-card series are tens of MiB)."""

SUMMED_GAUGES: Final = frozenset({"heteroflow_health_pending_readings", "heteroflow_health_dedup_cache_entries"})
"""Gauges of per-process state: the host's value is the sum over its workers. Every other gauge is the same fact
seen by each worker (a database count, the newest beat, a card's newest reading) and merges as the largest value:
for the cards' error counters, which only grow, that is the newest one."""

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


class SiblingMetrics:
    """This worker's metrics socket, and the host-wide render that asks every sibling's."""

    def __init__(
        self,
        directory: Path,
        render_own: Callable[[], Awaitable[bytes]],
        *,
        name: str | None = None,
        timeout_sec: float = SIBLING_TIMEOUT_SEC,
    ) -> None:
        self._directory = directory
        self._render_own = render_own
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

    async def _local(self) -> bytes:
        """This worker's own series, with its count of siblings it could not hear (summed like any counter)."""
        unanswered = (
            "# HELP heteroflow_server_workers_unanswered_total Sibling worker renders left out of a scrape this worker "
            f"answered (no answer within {self._timeout_s:g} s, or a broken one).\n"
            "# TYPE heteroflow_server_workers_unanswered_total counter\n"
            f"heteroflow_server_workers_unanswered_total {self.unanswered_total}\n"
        )
        return await self._render_own() + unanswered.encode()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(await self._local())
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

    async def render(self) -> bytes:
        """This host's metrics: this worker's and every sibling's that answered, merged."""
        answers = await asyncio.gather(*(self._ask(path) for path in self.siblings()))
        own = (await self._local()).decode()  # after the asks: it counts this scrape's unanswered siblings
        texts = [own, *(answer for answer in answers if answer is not None)]
        workers = (
            "# HELP heteroflow_server_workers Server worker processes whose metrics this scrape includes.\n"
            "# TYPE heteroflow_server_workers gauge\n"
            f"heteroflow_server_workers {len(texts)}\n"
        )
        # parsing and merging a fleet's per-GPU lines is seconds of Python: off the loop that answers heartbeats
        return await asyncio.to_thread(merge_expositions, texts) + workers.encode()

    async def _ask(self, path: Path) -> str | None:
        try:
            async with asyncio.timeout(self._timeout_s):
                reader, writer = await asyncio.open_unix_connection(str(path))
                try:
                    return (await _read_all(reader)).decode()
                finally:
                    writer.close()
        except (ConnectionRefusedError, FileNotFoundError):
            # a worker that exited without removing its socket (killed): nobody listens there any more
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # noqa: ASYNC240 - one unlink of a socket file, no wait
            return None
        except (TimeoutError, OSError, UnicodeDecodeError) as exc:
            self.unanswered_total += 1
            _log.warning("server.worker_metrics_unanswered", socket=path.name, error=repr(exc))
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
