"""Retention (H-24): the cadence of cleanup, its own task, and an invalid retention setting."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from heteroflow.health.settings import HealthStorageSettings
from heteroflow.storage.schema import gpu_health_samples
from tests.conftest import StatementCounter
from tests.support.harness import running_server

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def count_rows(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(gpu_health_samples)).scalar_one())


def test_cleanup_runs_once_per_n_written_rows_and_deletes_only_expired_ones(
    engine: Engine, statements: StatementCounter
) -> None:
    with running_server(engine, start=T0, health={"cleanup_every_writes": 5, "retention_days": 30}) as h:
        agent = h.token("agent")
        node = h.register(agent, "n1")
        # four old rows, 40 days before "now" once the clock has moved
        for value in range(4):
            h.beat(agent, node, [{"index": 0, "uuid": "G", "ecc_corrected_total": value}])
            h.clock.advance(1)
            h.drain()
        assert statements.matching("DELETE") == []  # 4 writes: no cleanup yet
        h.clock.advance(40 * 86400)
        h.beat(agent, node, [{"index": 0, "uuid": "G", "ecc_corrected_total": 99}])  # the 5th write
        h.drain()
        h.client.portal.call(h.ctx.ingestor.cleanup_finished)  # type: ignore[union-attr]
        status = h.ctx.ingestor.status()
        assert status.cleanup_runs_total == 1
        assert status.cleanup_deleted_total == 4
        assert len(statements.matching("DELETE FROM GPU_HEALTH_SAMPLES")) == 1  # and the buckets it cut
        assert count_rows(engine) == 1


def test_a_deployment_without_health_writes_never_runs_the_delete(engine: Engine, statements: StatementCounter) -> None:
    with running_server(engine, start=T0, health={"cleanup_every_writes": 1}) as h:
        agent = h.token("agent")
        node = h.register(agent, "n1")
        for _ in range(20):
            h.beat(agent, node, [{"index": 0, "temperature_c": 50}])  # no health counters at all
            h.clock.advance(5)
        h.drain()
        assert h.ctx.ingestor.status().cleanup_runs_total == 0
    assert statements.matching("DELETE") == []


@pytest.mark.parametrize("bad", ["0", "-3", "abc", "1.5", ""])
def test_invalid_retention_falls_back_to_180_days_and_keeps_younger_rows(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("GPU_HEALTH_RETENTION_DAYS", bad)
    monkeypatch.setenv("HETEROFLOW_GPU_HEALTH_CLEANUP_EVERY_WRITES", "3")
    settings = HealthStorageSettings.load()
    assert settings.retention_days == 180
    assert any("GPU_HEALTH_RETENTION_DAYS" in w for w in settings.config_warnings)
    assert settings.cleanup_every_writes == 3
    with running_server(engine, start=T0 - timedelta(days=200)) as h:
        agent = h.token("agent")
        node = h.register(agent, "n1")
        # beats 200 and 100 days ago, on a server clock of that time (an agent time that far from the server's
        # clock is a wrong clock and is not believed)
        for value, age_days in enumerate((200, 100)):
            h.clock.advance((T0 - timedelta(days=age_days) - h.clock.now()).total_seconds())
            answer = h.beat(
                agent,
                node,
                [
                    {
                        "index": 0,
                        "uuid": "G",
                        "ecc_corrected_total": value,
                        "sampled_at": (T0 - timedelta(days=age_days)).isoformat(),
                    }
                ],
            )
            assert answer.status_code == 200, answer.text
            h.drain()
        h.clock.advance((T0 - h.clock.now()).total_seconds())
        answer = h.beat(agent, node, [{"index": 0, "uuid": "G", "ecc_corrected_total": 7}])
        assert answer.status_code == 200, answer.text
        h.drain()
        h.client.portal.call(h.ctx.ingestor.cleanup_finished)  # type: ignore[union-attr]
        assert h.ctx.ingestor.status().offered_total == 3, h.ctx.ingestor.status()
        assert h.ctx.ingestor.status().cleanup_deleted_total == 1  # only the 200-day-old row
    assert count_rows(engine) == 2
