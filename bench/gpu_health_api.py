"""Latency of the GPU health page's API calls at fleet scale, through the real app (routes, JSON, auth).

Builds N cards of 5-minute samples (``bench/prediction.py``'s fleet: most cards healthy, one in 20 degrading, one
in 50 with a sudden uncorrectable error), lets the prediction worker make its predictions, then times, as the page
calls them (median of 5, after one warm-up call each):

* predictions       - the page's default call (newest first, 50 rows): the baseline;
* this week, strong - ``since`` = 7 days ago, ``status=pending``, ``sort=strong_first`` ("which cards should I
                      replace this week?": one filter and one sort);
* search            - a card search (``q``: part of a node name);
* csv               - the same filtered list as CSV;
* capabilities      - the capability matrix over the default period (the retention days).

Usage::

    .venv/bin/python bench/gpu_health_api.py [--cards 1000] [--days 8] [--postgres [--no-sqlite]]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: bench.prediction

from bench.prediction import NOW, build_fleet
from heteroflow.core.clock import SystemClock
from heteroflow.core.testing import FakeClock
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.assembly import build_context, create_app
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.testing import PostgresServer
from heteroflow.storage.token_store import SqlTokenStore

CALLS = 5


def timed(call: Callable[[], object]) -> float:
    call()  # warm-up: caches, the planner's statistics
    samples = []
    for _ in range(CALLS):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def measure(url: str, cards: int, days: float) -> dict[str, float]:
    engine = create_db_engine(url)
    upgrade_database(engine)
    rows = build_fleet(engine, cards, days)
    clock = FakeClock(NOW)
    ctx = build_context(
        settings=ServerSettings.load(database_url=url),
        health_settings=HealthStorageSettings.load(),
        prediction_settings=PredictionSettings.load(alert_enabled="false"),
        delivery_settings=AlertDeliverySettings.load(),
        clock=clock,
        engine=engine,
    )
    created = ctx.worker.tick().predictions_created.get("real", 0)
    token = SqlTokenStore(engine).create_token(
        name="bench", scopes=parse_scopes("nodes:read"), tenant_id=None, now=SystemClock().now()
    )[1]
    headers = {"Authorization": f"Bearer {token}"}
    week = {"since": (NOW - timedelta(days=7)).isoformat(), "status": "pending", "sort": "strong_first"}
    results: dict[str, float] = {"rows": rows, "predictions_made": created}
    with TestClient(create_app(ctx, migrate=False, run_worker=False)) as client:

        def get(path: str, **params: str | int) -> Callable[[], object]:
            def call() -> object:
                response = client.get(path, params=params, headers=headers)
                assert response.status_code == 200, response.text
                return response

            return call

        listed = client.get("/api/v1/gpu-health/predictions", params={**week, "limit": 50}, headers=headers).json()
        results["week_rows"] = listed["total"]
        results["predictions"] = timed(get("/api/v1/gpu-health/predictions", limit=50))
        results["week"] = timed(get("/api/v1/gpu-health/predictions", limit=50, **week))
        results["search"] = timed(get("/api/v1/gpu-health/predictions", limit=50, q="bench-0001"))
        results["csv"] = timed(get("/api/v1/gpu-health/predictions.csv", **week))
        results["capabilities"] = timed(get("/api/v1/gpu-health/capabilities"))
    engine.dispose()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cards", type=int, nargs="+", default=[1000])
    parser.add_argument("--days", type=float, default=8)
    parser.add_argument("--postgres", action="store_true", help="run on a private PostgreSQL server too")
    parser.add_argument("--no-sqlite", action="store_true", help="skip SQLite (with --postgres)")
    args = parser.parse_args()
    backends: list[tuple[str, PostgresServer | None]] = [] if args.no_sqlite else [("sqlite", None)]
    if args.postgres:
        postgres = PostgresServer()
        postgres.start()
        backends.append(("postgresql", postgres))
    print(f"GPU health API, {args.days:g} days of 5-minute samples per card, median of {CALLS} calls, seconds")
    print(
        f"{'backend':<11} {'cards':>6} {'rows':>9} {'preds':>6} {'week':>5} {'list s':>7} {'week s':>7} "
        f"{'week/list':>9} {'search s':>8} {'csv s':>6} {'caps s':>7}"
    )
    try:
        for name, server in backends:
            for cards in args.cards:
                with tempfile.TemporaryDirectory(prefix="hf-bench-") as workdir:
                    url = server.create_database() if server else f"sqlite:///{workdir}/bench.db"
                    r = measure(url, cards, args.days)
                print(
                    f"{name:<11} {cards:>6} {r['rows']:>9.0f} {r['predictions_made']:>6.0f} {r['week_rows']:>5.0f} "
                    f"{r['predictions']:>7.3f} {r['week']:>7.3f} {r['week'] / r['predictions']:>9.2f} "
                    f"{r['search']:>8.3f} {r['csv']:>6.3f} {r['capabilities']:>7.3f}",
                    flush=True,
                )
    finally:
        for _, server in backends:
            if server is not None:
                server.close()


if __name__ == "__main__":
    main()
