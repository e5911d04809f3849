"""PostgreSQL stops mid-run: heartbeats keep answering 2xx; when it returns, samples resume (H-22). The prediction
worker skips its ticks while it cannot check its lease, says so in its status, and ticks again when it returns."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from heteroflow.core.clock import SystemClock
from heteroflow.storage.db import create_db_engine, upgrade_database
from heteroflow.storage.schema import gpu_health_samples
from heteroflow.storage.testing import PostgresServer
from tests.support.harness import running_server
from tests.support.polling import until

pytestmark = pytest.mark.postgres

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.timeout(120)
def test_heartbeats_survive_a_database_outage_and_samples_resume(pg_server: PostgresServer) -> None:
    if not pg_server.running:
        pg_server.start()
    engine = create_db_engine(pg_server.create_database(), connect_timeout_sec=2)
    upgrade_database(engine)

    def corrected_values() -> list[int]:
        with engine.connect() as conn:
            query = sa.select(gpu_health_samples.c.ecc_corrected_total).order_by(gpu_health_samples.c.id)
            return list(conn.scalars(query))

    try:
        with running_server(engine, start=T0) as h:
            agent = h.token("agent")
            reader = h.token("nodes:read")
            node = h.register(agent, "gpu-1")
            h.beat(agent, node, [{"index": 0, "uuid": "G", "ecc_corrected_total": 1}])
            h.drain()
            assert corrected_values() == [1]

            pg_server.stop()
            for value in (2, 3):
                h.clock.advance(120)  # past the token and node cache times: they cannot be re-checked
                response = h.beat(agent, node, [{"index": 0, "uuid": "G", "ecc_corrected_total": value}])
                assert response.status_code == 200, response.text
            xid = h.beat(agent, node, [], xid_events=[{"index": 0, "xid": 48, "occurred_at": T0.isoformat()}])
            assert xid.status_code == 200
            assert xid.json()["xid_events"]["retry"] is True  # the agent keeps the event
            until(lambda: h.ctx.ingestor.status().write_failures_total >= 1, within=30, what="a failure")
            h.maintain()
            assert h.ctx.liveness.status().flush_failures_total == 1
            assert h.get(reader, "/api/v1/gpu-health/samples", node_id=node, gpu_index=0).status_code == 503

            pg_server.start()
            until(lambda: h.ctx.ingestor.status().pending_readings == 0, within=60, what="the backlog")
            h.drain()
            assert corrected_values() == [1, 2, 3]
            h.maintain()
            assert h.ctx.liveness.status().unflushed_nodes == 0
            again = h.beat(agent, node, [], xid_events=[{"index": 0, "xid": 48, "occurred_at": T0.isoformat()}])
            assert again.json()["xid_events"] == {"received": 1, "stored": 1, "rejected": [], "retry": False}
            listing = h.get(reader, f"/api/v1/nodes/{node}").json()
            assert listing["online"] is True
    finally:
        if not pg_server.running:
            pg_server.start()
        engine.dispose()


@pytest.mark.timeout(120)
def test_the_prediction_worker_skips_its_ticks_during_a_database_outage_says_so_and_resumes(
    pg_server: PostgresServer,
) -> None:
    if not pg_server.running:
        pg_server.start()
    engine = create_db_engine(pg_server.create_database(), connect_timeout_sec=2)
    upgrade_database(engine)
    fast = {"lease_seconds": 0.6, "tick_minutes": 0.001}  # a lease check every 0.2 s, a tick due every 0.06 s
    try:
        with running_server(engine, clock=SystemClock(), prediction=fast, run_worker=True) as h:
            admin, agent = h.token("admin"), h.token("agent")
            node = h.register(agent, "gpu-worker")
            worker = h.ctx.worker
            until(lambda: worker.status().ticks_total >= 2, within=30, what="the worker ticking")
            assert h.get(admin, "/api/v1/server/status").status_code == 200  # the admin token is now cached

            pg_server.stop()
            beat = h.beat(agent, node, [{"index": 0, "uuid": "G", "ecc_corrected_total": 1}])
            assert beat.status_code == 200, beat.text  # the main path does not depend on the worker
            until(lambda: worker.status().ticks_skipped_total >= 1, within=30, what="a skipped tick")
            ticks_at_first_skip = worker.status().ticks_total
            until(lambda: worker.status().ticks_skipped_total >= 3, within=30, what="more skipped ticks")
            during = worker.status()
            assert during.ticks_total == ticks_at_first_skip  # skipped, not run
            assert not during.leader
            assert during.last_skip is not None
            assert during.last_skip.reason.startswith("the lease could not be checked: StoreUnavailableError")
            shown = h.get(admin, "/api/v1/server/status").json()["prediction_worker"]
            assert shown["ticks_skipped_total"] >= 3
            assert shown["last_skip"]["reason"].startswith("the lease could not be checked")

            pg_server.start()
            until(
                lambda: worker.status().leader and worker.status().ticks_total > ticks_at_first_skip,
                within=60,
                what="ticks after the database returned",
            )
            after = worker.status()
            assert after.last_error is None
            skipped = after.ticks_skipped_total
            until(lambda: worker.status().ticks_total >= after.ticks_total + 2, within=30, what="steady ticks")
            assert worker.status().ticks_skipped_total == skipped  # no skip is reported once it ticks again
    finally:
        if not pg_server.running:
            pg_server.start()
        engine.dispose()
