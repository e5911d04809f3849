"""Prediction worker tick and statistics latency, against a naive read-every-series implementation.

Builds a fleet of N cards with 37 days of 5-minute samples (the keepalive cadence: 10,656 rows per card; most
cards healthy, some degrading, some with a sudden uncorrectable error), then measures in the same run:

* tick      - the production worker tick (backfill + predict over the capability matrix, indexed point
              queries at the rules' boundary instants);
* stats     - the production statistics (failure events and exposure in SQL with window functions), called
              twice: the first call after the ticks, and the same call again;
* naive     - the same decisions made by reading every card's whole series into Python (what known limit 7
              of docs/design/gpu-health-design.md describes), as the baseline.

Usage::

    .venv/bin/python bench/prediction.py [--cards 100 1000] [--days 37] [--postgres [--no-sqlite]]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import sqlalchemy as sa

from heteroflow.core.ids import NodeId
from heteroflow.core.testing import FakeClock
from heteroflow.health.counters import HEALTH_KEYS, Counters
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.rules import CardView, boundary_instants, evaluate
from heteroflow.health.samples import Card, CardKey, StoredSample
from heteroflow.health.simulation import Profile, series
from heteroflow.platform.auth import NodeScope
from heteroflow.platform_server.prediction_worker import PredictionWorker, rule_params
from heteroflow.storage.alert_store import SqlAlertStore
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.health_buckets import rebuild_buckets
from heteroflow.storage.lease_store import SqlLeaseStore
from heteroflow.storage.node_store import SqlNodeStore
from heteroflow.storage.prediction_store import SqlPredictionStore
from heteroflow.storage.schema import gpu_health_samples
from heteroflow.storage.testing import PostgresServer

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def profile_of(card: int) -> Profile:
    if card % 20 == 7:
        return "degrading"
    if card % 50 == 13:
        return "sudden-ue"
    return "healthy"


_SAMPLE_COLUMNS = ("node_id", "gpu_index", "uuid", "source", "sampled_at", "changed", "ue_changed", *HEALTH_KEYS)


def build_fleet(engine: sa.Engine, cards: int, days: float) -> int:
    """Write the fleet's samples in bulk: rows as plain tuples through the driver's executemany, in one transaction.

    Two things made the build slow at 1,000 cards (2.3 M rows), most of all on SQLite: each row went through
    SQLAlchemy's per-row parameter processing (a dict, the UTC type's conversion, ``Counters.as_dict``), and the
    sample table's five indexes outgrew SQLite's default page cache (2 MiB), so every insert read index pages back
    from disk — the cost per row grew with the table. Here the rows are tuples in the driver's own format, and the
    load's connection gets a 1 GiB page cache on SQLite.
    """
    nodes = SqlNodeStore(engine)
    sqlite_backend = engine.dialect.name == "sqlite"
    mark = "?" if engine.dialect.paramstyle == "qmark" else "%s"
    statement = (
        f"INSERT INTO {gpu_health_samples.name} ({', '.join(_SAMPLE_COLUMNS)}) "
        f"VALUES ({', '.join([mark] * len(_SAMPLE_COLUMNS))})"
    )

    def stored(at: datetime) -> object:  # as UtcDateTime stores it: naive UTC (SQLite: its text format)
        naive = at.astimezone(UTC).replace(tzinfo=None)
        return naive.strftime("%Y-%m-%d %H:%M:%S.%f") if sqlite_backend else naive

    node_ids = [
        nodes.register(
            name=f"bench-{first // 8:05d}",
            vendor="nvidia",
            model="H100",
            gpu_count=8,
            source="real",
            tenant_id=None,
            now=NOW - timedelta(days=days),
        ).node.id
        for first in range(0, cards, 8)
    ]
    written = 0
    with engine.begin() as conn:
        if sqlite_backend:
            conn.exec_driver_sql("PRAGMA cache_size = -1048576")  # KiB: 1 GiB for this connection
        for node_id, first in zip(node_ids, range(0, cards, 8), strict=True):
            rows: list[tuple[object, ...]] = []
            for index in range(min(8, cards - first)):
                card = first + index
                previous: tuple[str | None, Counters] | None = None
                for s in series(profile_of(card), card=card, start=NOW - timedelta(days=days), end=NOW):
                    # as the ingestion path writes them: a row that repeats its predecessor is marked unchanged, and
                    # one that repeats its uuid and uncorrectable-ECC value is not ue_changed
                    changed = previous != (s.uuid, s.counters)
                    before = (previous[0], previous[1].ecc_uncorrected_total) if previous is not None else None
                    ue_changed = before != (s.uuid, s.counters.ecc_uncorrected_total)
                    previous = (s.uuid, s.counters)
                    c = s.counters
                    rows.append(
                        (
                            node_id,
                            index,
                            s.uuid,
                            "real",
                            stored(s.sampled_at),
                            changed,
                            ue_changed,
                            *(getattr(c, key) for key in HEALTH_KEYS),
                        )
                    )
            conn.exec_driver_sql(statement, rows)
            written += len(rows)
        # the bulk load bypassed the store: its hour and day buckets, as the migration does
        rebuild_buckets(conn, NOW - timedelta(days=days), NOW + timedelta(seconds=1))
    return written


def naive(engine: sa.Engine, settings: PredictionSettings, since: datetime) -> tuple[int, int]:
    """Read every card's whole series; evaluate the rules and scan for failures in Python."""
    params = rule_params(settings)
    t = gpu_health_samples
    with engine.connect() as conn:
        cards = conn.execute(
            sa.select(t.c.node_id, t.c.gpu_index, t.c.uuid).where(t.c.source == "real").distinct()
        ).all()
        predicted = failed = 0
        for node_id, index, uuid in cards:
            rows = conn.execute(
                sa.select(t)
                .where(
                    t.c.node_id == node_id,
                    t.c.gpu_index == index,
                    t.c.source == "real",
                    t.c.uuid.is_not_distinct_from(uuid),
                    t.c.sampled_at <= NOW,
                )
                .order_by(t.c.sampled_at, t.c.id)
            ).all()
            samples = [
                StoredSample(
                    CardKey(NodeId(r.node_id), r.gpu_index, "real"),
                    r.uuid,
                    r.sampled_at,
                    Counters(**{k: getattr(r, k) for k in HEALTH_KEYS}),
                )
                for r in rows
            ]
            if not samples:
                continue
            latest = samples[-1]
            boundaries = {i: _as_of(samples, i) for i in boundary_instants(latest.sampled_at, params)}
            view = CardView(Card(NodeId(node_id), index, uuid, "real"), latest, boundaries, _decreases(samples))
            predicted += evaluate(view, params).predicts
            ue = [s.counters.ecc_uncorrected_total for s in samples if s.counters.ecc_uncorrected_total is not None]
            failed += any(b > a for a, b in pairwise(ue))
    return predicted, failed


def _as_of(samples: Sequence[StoredSample], instant: datetime) -> StoredSample | None:
    found = None
    for s in samples:
        if s.sampled_at > instant:
            break
        found = s
    return found


def _decreases(samples: Sequence[StoredSample]) -> dict[str, datetime | None]:
    out: dict[str, datetime | None] = {}
    for key in ("ecc_corrected_total", "remapped_rows_pending", "retired_pages"):
        last = None
        known = [(s.sampled_at, getattr(s.counters, key)) for s in samples if getattr(s.counters, key) is not None]
        for (_, a), (at, b) in pairwise(known):
            if b < a:
                last = at
        out[key] = last
    return out


def measure(url: str, cards: int, days: float) -> dict[str, float]:
    engine = create_db_engine(url)
    upgrade_database(engine)
    started = time.perf_counter()
    rows = build_fleet(engine, cards, days)
    build = time.perf_counter() - started
    settings = PredictionSettings.load(alert_enabled="false")
    clock = FakeClock(NOW)
    worker = PredictionWorker(
        predictions=SqlPredictionStore(engine),
        alerts=SqlAlertStore(engine),
        nodes=SqlNodeStore(engine),
        leases=SqlLeaseStore(engine),
        settings=settings,
        clock=clock,
    )
    first = worker.tick()
    clock.advance(1800)
    second = worker.tick()
    store = SqlPredictionStore(engine)
    since = NOW - timedelta(days=180)
    stats: list[float] = []
    for _ in range(2):  # the first call after the ticks, and again with its own pages cached
        started = time.perf_counter()
        counts, _ = store.statistics(
            source="real", scope=NodeScope(None), since=since, now=clock.now(), window_days=[7, 30]
        )
        stats.append(time.perf_counter() - started)
    started = time.perf_counter()
    naive_predicted, naive_failed = naive(engine, settings, since)
    naive_seconds = time.perf_counter() - started
    created = first.predictions_created.get("real", 0)
    assert naive_predicted == created, (naive_predicted, created)  # both implementations agree
    assert naive_failed == counts[7].failed_cards, (naive_failed, counts[7].failed_cards)
    engine.dispose()
    return {
        "rows": rows,
        "build": build,
        "tick1": first.seconds,
        "tick2": second.seconds,
        "stats": stats[0],
        "stats2": stats[1],
        "naive": naive_seconds,
        "predictions": created,
        "failed": counts[7].failed_cards,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cards", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--days", type=float, default=37)
    parser.add_argument("--postgres", action="store_true", help="run on a private PostgreSQL server too")
    parser.add_argument("--no-sqlite", action="store_true", help="skip SQLite (with --postgres)")
    args = parser.parse_args()
    backends: list[tuple[str, PostgresServer | None]] = [] if args.no_sqlite else [("sqlite", None)]
    if args.postgres:
        postgres = PostgresServer()
        postgres.start()
        backends.append(("postgresql", postgres))
    print(f"prediction worker and statistics, {args.days:g} days of 5-minute samples per card")
    print(
        f"{'backend':<11} {'cards':>6} {'rows':>10} {'tick 1 s':>9} {'tick 2 s':>9} {'stats s':>8} {'stats 2 s':>9} "
        f"{'naive s':>8} {'naive/tick':>10} {'predictions':>11} {'failed':>6}"
    )
    try:
        for name, server in backends:
            for cards in args.cards:
                with tempfile.TemporaryDirectory(prefix="hf-bench-") as workdir:
                    url = server.create_database() if server else f"sqlite:///{workdir}/bench.db"
                    r = measure(url, cards, args.days)
                print(
                    f"{name:<11} {cards:>6} {r['rows']:>10.0f} {r['tick1']:>9.2f} {r['tick2']:>9.2f} "
                    f"{r['stats']:>8.2f} {r['stats2']:>9.2f} {r['naive']:>8.2f} {r['naive'] / r['tick1']:>10.1f} "
                    f"{r['predictions']:>11.0f} {r['failed']:>6.0f}",
                    flush=True,
                )
    finally:
        for _, server in backends:
            if server is not None:
                server.close()


if __name__ == "__main__":
    main()
