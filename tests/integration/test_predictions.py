"""The prediction worker, backfill, alerts and statistics on SQLite and PostgreSQL (H-33…H-62, H-70)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from heteroflow.core.ids import NodeId, Source
from heteroflow.health.counters import Counters
from heteroflow.health.gpu_metrics import Aggregate, MinuteRow
from heteroflow.health.samples import CardKey, HealthReading
from heteroflow.health.simulation import Profile, series
from heteroflow.health.weak_signals import WeakSignalParams, weak_signals
from heteroflow.storage.health_store import SqlHealthSampleStore
from heteroflow.storage.metrics_store import SqlGpuMetricsStore
from tests.support.harness import Harness, running_server
from tests.support.polling import until

NOW = datetime(2026, 5, 20, 12, 0, 0, 654321, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture
def harness(engine: Engine) -> Iterator[Harness]:
    with running_server(engine, start=NOW) as h:
        yield h


def write(
    h: Harness,
    node: str,
    index: int,
    rows: Sequence[tuple[datetime, str | None, Mapping[str, int | None]]],
    source: Source = "real",
) -> None:
    key = CardKey(node_id=NodeId(node), gpu_index=index, source=source)
    SqlHealthSampleStore(h.ctx.engine).insert(
        [HealthReading(key=key, uuid=uuid, sampled_at=at, counters=Counters(**c)) for at, uuid, c in rows]
    )


def write_profile(
    h: Harness, node: str, index: int, profile: Profile, *, days: float = 10, source: Source = "real"
) -> None:
    key = CardKey(node_id=NodeId(node), gpu_index=index, source=source)
    SqlHealthSampleStore(h.ctx.engine).insert(
        [
            HealthReading(key=key, uuid=s.uuid, sampled_at=s.sampled_at, counters=s.counters)
            for s in series(profile, card=index, start=h.clock.now() - days * DAY, end=h.clock.now())
        ]
    )


def predictions(h: Harness, token: str, **params: Any) -> dict[str, Any]:
    response = h.get(token, "/api/v1/gpu-health/predictions", **params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def alerts(h: Harness, token: str, **params: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = h.get(token, "/api/v1/alerts", **params).json()["items"]
    return items


def uuid_of(index: int) -> str:
    return f"SIM-degrading-{index:04d}"


def test_degrading_cards_predict_once_per_window_with_one_alert_per_node(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "gpu-a")
    write_profile(harness, node, 0, "degrading")
    write_profile(harness, node, 1, "degrading")
    write_profile(harness, node, 2, "healthy")
    report = harness.ctx.worker.tick()
    assert report.predictions_created == {"real": 2}
    body = predictions(harness, reader)
    assert body["total"] == 2
    assert body["current_rule_version"] == "v1-ecc-growth"
    item = body["items"][0]
    assert item["status"] == "pending"
    assert item["window_days"] == 7
    assert item["signals"] == ["corrected_ecc_growth"]
    assert datetime.fromisoformat(item["window_end"]) - datetime.fromisoformat(item["t0"]) == 7 * DAY
    assert datetime.fromisoformat(item["t0"]) <= NOW
    [alert] = alerts(harness, reader)
    assert alert["type"] == "GPU_FAULT_PREDICTED"
    assert alert["severity"] == "WARN"
    assert "predicted" in alert["message"]
    # beside the English texts, their stable codes and parameters (a page renders them in its own language)
    assert [line["code"] for line in item["evidence_lines"]] == ["evidence.corrected_growth"]
    assert item["evidence_lines"][0]["signal"] == "corrected_ecc_growth"
    assert alert["message_code"]["code"] == "alert.fault_predicted"
    assert alert["message_code"]["params"]["node"] == "gpu-a"
    assert alert["message_code"]["text"] == alert["message"]
    assert {line["code"] for line in alert["message_evidence"]} == {"evidence.corrected_growth"}
    stats = harness.get(reader, "/api/v1/gpu-health/prediction-stats").json()
    band = stats["windows"][0]
    assert [c["text"] for c in band["insufficient_codes"]] == band["insufficient"]
    assert band["insufficient_codes"][0]["code"] == "stats.matured"
    # later ticks, new samples: no second prediction while the window is open
    harness.clock.advance(3600)
    write_profile(harness, node, 0, "degrading", days=0.04)
    assert harness.ctx.worker.tick().predictions_created == {}
    assert predictions(harness, reader)["total"] == 2


def test_simulated_predictions_exist_but_never_alert_or_count(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "sim-1", source="simulated")
    write_profile(harness, node, 0, "degrading", source="simulated")
    write_profile(harness, node, 1, "healthy", source="simulated")
    assert harness.ctx.worker.tick().predictions_created == {"simulated": 1}
    assert alerts(harness, reader) == []
    assert predictions(harness, reader)["total"] == 0
    assert predictions(harness, reader, source="simulated")["total"] == 1
    real = harness.get(reader, "/api/v1/gpu-health/prediction-stats").json()
    assert real["monitorable_cards"] == 0
    assert all(w["pending"] == 0 for w in real["windows"])
    assert harness.get(reader, "/api/v1/gpu-health/prediction-stats", source="all").status_code == 400


def test_prediction_stats_say_which_source_they_report_when_the_other_has_predictions(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    before = harness.get(reader, "/api/v1/gpu-health/prediction-stats").json()
    assert (before["source"], before["other_source"]) == ("real", None)  # nothing elsewhere: nothing to say
    node = harness.register(agent, "sim-1", source="simulated")
    write_profile(harness, node, 0, "degrading", source="simulated")
    assert harness.ctx.worker.tick().predictions_created == {"simulated": 1}
    real = harness.get(reader, "/api/v1/gpu-health/prediction-stats").json()
    assert real["source"] == "real"
    assert real["other_source"] == {
        "source": "simulated",
        "predictions": 1,
        "note": "These statistics are of real predictions only; 1 simulated prediction(s) exist in the period: "
        "ask with source=simulated.",
        "note_code": "stats.other_source",
    }
    simulated = harness.get(reader, "/api/v1/gpu-health/prediction-stats", source="simulated").json()
    assert simulated["source"] == "simulated"
    assert simulated["windows"][0]["pending"] == 1
    assert simulated["other_source"] is None  # no real prediction exists
    # another tenant's reader sees neither the predictions nor that they exist
    outsider = harness.token("nodes:read", tenant="team-b")
    assert harness.get(outsider, "/api/v1/gpu-health/prediction-stats").json()["other_source"] is None


def test_backfill_hit_keeps_the_alert_open_until_a_manual_resolve(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    operator = harness.token("alerts:write,nodes:read")
    node = harness.register(agent, "gpu-b")
    write_profile(harness, node, 0, "degrading")
    harness.ctx.worker.tick()
    t0 = datetime.fromisoformat(predictions(harness, reader)["items"][0]["t0"])
    write(
        harness,
        node,
        0,
        [
            (t0 + 2 * DAY, uuid_of(0), {"ecc_uncorrected_total": 0}),
            (t0 + 3 * DAY, uuid_of(0), {"ecc_uncorrected_total": 4}),
        ],
    )
    harness.clock.advance(8 * 86400)
    report = harness.ctx.worker.tick()
    assert report.judged == {"hit": 1}
    item = predictions(harness, reader, status="hit")["items"][0]
    assert "uncorrectable ECC grew from 0 to 4" in item["conclusion"]
    assert item["conclusion_code"]["code"] == "conclusion.hit_growth"
    assert item["conclusion_code"]["params"]["label_code"] == "uncorrectable_ecc"
    [alert] = alerts(harness, reader)
    assert alert["status"] == "open"  # a hit is never resolved by the system
    assert alert["backlog"] is True  # open for more than 72 h: operations backlog, no exemption
    harness.ctx.worker.tick()
    assert alerts(harness, reader)[0]["status"] == "open"

    url = f"/api/v1/alerts/{alert['id']}/resolve"
    assert harness.client.post(url, json={"reason": "x"}, headers=harness.auth(reader)).status_code == 403
    assert harness.client.post(url, json={"reason": ""}, headers=harness.auth(operator)).status_code == 422
    done = harness.client.post(url, json={"reason": "card replaced"}, headers=harness.auth(operator))
    assert done.status_code == 200, done.text
    detail = done.json()
    assert detail["alert"]["status"] == "resolved"
    assert detail["alert"]["resolution"] == "card replaced"
    assert detail["alert"]["resolved_by"].startswith("token:test:")
    # the tick after the window predicted the card again (its uncorrectable ECC grew): that joins the open alert
    assert [e["action"] for e in detail["history"]] == ["raised", "card_predicted_again", "backlog", "resolved"]
    assert detail["alert"]["severity"] == "CRITICAL"
    # a typed reason has no code (shown as written); the system's notes have theirs
    assert detail["alert"]["resolution_code"] == {"code": None, "params": {}, "text": "card replaced"}
    assert [(e["note_code"] or {}).get("code") for e in detail["history"]] == [
        "alert.fault_predicted",
        "alert.fault_predicted",
        "history.backlog",
        None,
    ]
    assert harness.client.post(url, json={"reason": "again"}, headers=harness.auth(operator)).status_code == 409


def test_all_miss_resolves_by_the_system_and_voided_does_not(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    missed = harness.register(agent, "gpu-miss")
    silent = harness.register(agent, "gpu-silent")
    write_profile(harness, missed, 0, "degrading")
    write_profile(harness, silent, 0, "degrading")
    harness.ctx.worker.tick()
    t0 = datetime.fromisoformat(predictions(harness, reader, node_id=missed)["items"][0]["t0"])
    write(harness, missed, 0, [(t0 + 4 * DAY, uuid_of(0), {"ecc_uncorrected_total": 0, "ecc_corrected_total": 1})])
    harness.clock.advance(8 * 86400)
    report = harness.ctx.worker.tick()
    assert report.judged == {"miss": 1, "voided": 1}
    by_node = {a["node_id"]: a for a in alerts(harness, reader)}
    assert by_node[missed]["status"] == "resolved"
    assert by_node[missed]["resolved_by"] == "system"
    assert by_node[missed]["resolution"] == "window expired, no uncorrectable-ECC growth"
    assert by_node[silent]["status"] == "open"  # nothing observed: no claim of recovery
    voided = predictions(harness, reader, status="voided")["items"][0]
    assert "no sample inside the window" in voided["conclusion"]


def test_window_edges_at_microsecond_precision(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "gpu-edge")
    t0 = NOW - timedelta(microseconds=1)
    for index in (0, 1):
        write(harness, node, index, [(t0, f"G{index}", {"ecc_uncorrected_total": 1})])
    harness.ctx.worker.tick()
    end = t0 + 7 * DAY
    write(harness, node, 0, [(end, "G0", {"ecc_uncorrected_total": 2})])  # exactly t0 + N: inside
    write(
        harness,
        node,
        1,
        [
            (end - timedelta(microseconds=1), "G1", {"ecc_uncorrected_total": 1}),
            (end + timedelta(microseconds=1), "G1", {"ecc_uncorrected_total": 2}),
        ],
    )  # just outside
    harness.clock.advance(7 * 86400 + 1)
    harness.ctx.worker.tick()
    status = {
        i["gpu_index"]: i["status"]
        for i in predictions(harness, reader, node_id=node)["items"]
        if datetime.fromisoformat(i["t0"]) == t0
    }
    assert status == {0: "hit", 1: "miss"}


def test_a_future_dated_sample_never_moves_t0_or_voids_the_prediction(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "gpu-skew")
    write(
        harness,
        node,
        0,
        [(NOW - DAY, "G", {"ecc_uncorrected_total": 1}), (NOW + 2 * DAY, "G", {"ecc_uncorrected_total": 1})],
    )  # the agent's clock is ahead
    harness.ctx.worker.tick()
    [item] = predictions(harness, reader)["items"]
    assert datetime.fromisoformat(item["t0"]) == NOW - DAY
    harness.clock.advance(7 * 86400)
    harness.ctx.worker.tick()
    assert predictions(harness, reader)["items"][-1]["status"] == "miss"


def test_statistics_stay_null_until_the_evidence_suffices(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "gpu-stats")
    start = NOW - 9 * DAY
    # card 0 fails (a strict uncorrectable step) and card 1 does not
    write(harness, node, 0, [(start + DAY * d, "G0", {"ecc_uncorrected_total": 0 if d < 5 else 3}) for d in range(10)])
    write(harness, node, 1, [(start + DAY * d, "G1", {"ecc_uncorrected_total": 0}) for d in range(10)])
    body = harness.get(reader, "/api/v1/gpu-health/prediction-stats").json()
    assert [w["window_days"] for w in body["windows"]] == [7, 30]
    seven = body["windows"][0]
    assert seven["precision"] is None
    assert seven["recall"] is None
    assert seven["insufficient"] == ["0 of ≥ 20 matured predictions (hit + miss; voided excluded)"]
    assert seven["failed_cards"] == 1
    assert seven["missed_cards"] == 1
    assert body["monitorable_cards"] == 2
    assert body["span_days"] == 9.0
    assert body["card_days"] == 18.0
    assert "experimental" in body["disclaimer"]

    # 20 matured predictions, one of them holding card 0's failure
    store = harness.ctx.predictions
    from heteroflow.health.predictions import Judgement
    from heteroflow.health.samples import Card
    from heteroflow.storage.prediction_store import PredictionRecord

    for k in range(20):
        card = Card(NodeId(node), 0 if k == 0 else 1, "G0" if k == 0 else "G1", "real")
        t0 = start + timedelta(days=4) if k == 0 else start + timedelta(hours=k)
        record = PredictionRecord(
            f"p{k}", card, "v1-ecc-growth", 7, t0, t0 + 7 * DAY, "pending", ("x",), "e", NOW, None, None, None
        )
        assert store.insert(record)
        store.record_judgement(f"p{k}", Judgement("hit" if k < 5 else "miss", "c"), now=NOW)
    body = harness.get(reader, "/api/v1/gpu-health/prediction-stats").json()
    seven = body["windows"][0]
    assert seven["insufficient"] == []
    assert seven["precision"] == 0.25
    assert seven["recall"] == 1.0
    assert seven["predicted_cards"] == 1
    assert body["windows"][1]["precision"] is None  # the 30-day band has its own predictions: none


def test_two_workers_overlapping_make_one_prediction_and_one_judgement_each(engine: Engine) -> None:
    with running_server(engine, start=NOW) as first, running_server(engine, start=NOW) as second:
        agent, reader = first.token("agent"), first.token("nodes:read")
        node = first.register(agent, "gpu-race")
        for index in range(4):
            write_profile(first, node, index, "degrading")
        barrier = threading.Barrier(2)
        reports: list[Any] = []

        def tick(h: Harness) -> None:
            barrier.wait()
            reports.append(h.ctx.worker.tick())

        def both() -> None:
            threads = [threading.Thread(target=tick, args=(h,)) for h in (first, second)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)

        both()
        assert predictions(first, reader)["total"] == 4
        assert sum(r.predictions_created.get("real", 0) for r in reports) == 4
        assert len(alerts(first, reader)) == 1
        reports.clear()
        for h in (first, second):
            h.clock.advance(8 * 86400)
        both()
        assert sum(sum(r.judged.values()) for r in reports) == 4
        assert predictions(first, reader, status="voided")["total"] == 4


def test_the_lease_has_one_holder_and_expires(harness: Harness) -> None:
    from heteroflow.storage.lease_store import SqlLeaseStore

    leases = SqlLeaseStore(harness.ctx.engine)
    ttl = timedelta(seconds=90)
    assert leases.acquire("w", holder="a", now=NOW, ttl=ttl)
    assert not leases.acquire("w", holder="b", now=NOW + timedelta(seconds=30), ttl=ttl)
    assert leases.acquire("w", holder="a", now=NOW + timedelta(seconds=60), ttl=ttl)  # renewal
    assert leases.holder("w", now=NOW + timedelta(seconds=100)) == "a"
    assert leases.acquire("w", holder="b", now=NOW + timedelta(seconds=151), ttl=ttl)  # a died: b takes over
    assert not leases.acquire("w", holder="a", now=NOW + timedelta(seconds=152), ttl=ttl)


def test_deleting_a_node_sweeps_its_open_alerts_and_tenants_see_only_theirs(harness: Harness) -> None:
    agent = harness.token("agent", tenant="t1")
    own = harness.token("nodes:read,nodes:write,alerts:write", tenant="t1")
    other = harness.token("nodes:read,alerts:write", tenant="t2")
    node = harness.register(agent, "gpu-t1")
    write_profile(harness, node, 0, "degrading")
    harness.ctx.worker.tick()
    [alert] = alerts(harness, own)
    assert alerts(harness, other) == []
    assert harness.get(other, f"/api/v1/alerts/{alert['id']}").status_code == 404
    assert (
        harness.client.post(
            f"/api/v1/alerts/{alert['id']}/resolve", json={"reason": "r"}, headers=harness.auth(other)
        ).status_code
        == 404
    )
    assert predictions(harness, other)["total"] == 0
    assert harness.client.delete(f"/api/v1/nodes/{node}", headers=harness.auth(own)).status_code == 204
    swept = harness.get(own, f"/api/v1/alerts/{alert['id']}").json()
    assert swept["alert"]["status"] == "resolved"
    assert swept["alert"]["resolution"] == "node deleted"


def test_the_alert_switch_is_fail_open(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    for value, expected in (("garbage", 1), ("false", 0)):
        monkeypatch.setenv("GPU_FAULT_PREDICTED_ALERT_ENABLED", value)
        with running_server(engine, start=NOW) as h:
            agent, reader = h.token("agent"), h.token("nodes:read")
            node = h.register(agent, f"gpu-switch-{value}")
            write_profile(h, node, 0, "degrading")
            h.ctx.worker.tick()
            assert len(alerts(h, reader, node_id=node)) == expected


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"offset": -1}, "offset"),
        ({"offset": 2**63}, "offset"),  # once an OverflowError of the database driver, a 500
        ({"offset": 10_000_001}, "offset"),
        ({"status": "done"}, "status"),
        ({"source": "all"}, "source"),
    ],
)
def test_prediction_list_parameters_get_400(harness: Harness, params: dict[str, Any], message: str) -> None:
    reader = harness.token("nodes:read")
    response = harness.get(reader, "/api/v1/gpu-health/predictions", **params)
    assert response.status_code == 400
    assert message in response.json()["detail"]


def test_server_status_shows_the_worker_and_the_delivery(harness: Harness) -> None:
    admin = harness.token("admin")
    harness.ctx.worker.tick()
    body = harness.get(admin, "/api/v1/server/status").json()
    assert body["prediction_worker"]["ticks_total"] == 1
    assert body["prediction_worker"]["last_tick"]["predictions_created"] == {}
    assert body["alert_delivery"]["queued"] == 0


def test_only_the_lease_holder_ticks_and_a_dead_holder_is_replaced(engine: Engine) -> None:
    import time

    from heteroflow.core.clock import SystemClock
    from heteroflow.platform_server.prediction_worker import LEASE_NAME
    from heteroflow.storage.lease_store import SqlLeaseStore

    # a holder that died without releasing: its lease must run out before anyone else ticks
    SqlLeaseStore(engine).acquire(LEASE_NAME, holder="ghost", now=SystemClock().now(), ttl=timedelta(seconds=2))
    fast = {"lease_seconds": 0.6, "tick_minutes": 0.001}
    with (
        running_server(engine, clock=SystemClock(), prediction=fast, run_worker=True) as a,
        running_server(engine, clock=SystemClock(), prediction=fast, run_worker=True) as b,
    ):
        workers = [a.ctx.worker, b.ctx.worker]
        started = time.monotonic()
        until(lambda: any(w.status().ticks_total for w in workers), within=20, what="a take-over of the expired lease")
        assert time.monotonic() - started >= 1.0  # not before the ghost's lease ran out
        until(lambda: sum(w.status().ticks_total for w in workers) >= 3, within=20, what="three ticks")
        statuses = [w.status() for w in workers]
        assert [s.leader for s in statuses].count(True) == 1
        assert [bool(s.ticks_total) for s in statuses].count(True) == 1  # the follower never ticked


def test_the_holder_renews_its_lease_during_a_tick_longer_than_the_lease(engine: Engine) -> None:
    import threading
    import time

    from heteroflow.core.clock import SystemClock

    lease = 2.0  # renewed every 0.67 s: a renewal would have to be late by 1.3 s for the lease to lapse
    fast = {"lease_seconds": lease, "tick_minutes": 0.001}
    ticking: list[str] = []
    finished = threading.Event()

    def slow_tick(name: str) -> Callable[[], None]:
        def tick() -> None:
            ticking.append(name)
            finished.wait(timeout=20)  # held until the test has watched two lease lifetimes go by

        return tick

    with (
        running_server(engine, clock=SystemClock(), prediction=fast, run_worker=True) as a,
        running_server(engine, clock=SystemClock(), prediction=fast, run_worker=True) as b,
    ):
        # stub ticks returning no report: the worker discards what a tick returns
        a.ctx.worker.tick = slow_tick("a")  # type: ignore[method-assign, assignment]
        b.ctx.worker.tick = slow_tick("b")  # type: ignore[method-assign, assignment]
        until(lambda: ticking, within=20, what="a tick")
        started = time.monotonic()
        while time.monotonic() - started < 2 * lease:
            assert len(ticking) == 1, ticking  # the other server never took the lease while the tick ran
            time.sleep(0.02)
        finished.set()
        statuses = [a.ctx.worker.status(), b.ctx.worker.status()]
        assert [s.leader for s in statuses].count(True) == 1


# -- the weak-signal layer (temperature and power from the metrics history) ------------------------------------


def write_weak_metrics(h: Harness, node: str, index: int, uuid: str, *, day_start: datetime, power: float) -> None:
    """One day of anomalous metrics: 40 hot minutes and 70 busy minutes at ``power`` watts."""
    key = CardKey(node_id=NodeId(node), gpu_index=index, source="real")

    def agg(value: float) -> Aggregate:
        return Aggregate(min=value, avg=value, max=value, count=12)

    rows = [
        MinuteRow(
            key=key,
            uuid=uuid,
            minute=day_start + timedelta(minutes=m),
            samples=12,
            values={"temperature_c": agg(95.0), "utilization_pct": agg(100.0), "power_w": agg(power)},
        )
        for m in range(70)
    ]
    SqlGpuMetricsStore(h.ctx.engine).insert(rows)


def test_a_card_with_only_weak_signals_for_30_days_is_never_predicted(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "hot-node")
    store = SqlGpuMetricsStore(harness.ctx.engine)
    for day in range(30):
        harness.clock.advance(86_400)
        now = harness.clock.now()
        flat = {"ecc_uncorrected_total": 0, "ecc_corrected_total": 5, "retired_pages": 0}
        write(harness, node, 0, [(now - timedelta(hours=h), "GPU-hot", flat) for h in (23, 12, 0)])
        write_weak_metrics(
            harness, node, 0, "GPU-hot", day_start=now - timedelta(hours=2), power=300.0 if day < 29 else 450.0
        )
        assert harness.ctx.worker.tick().predictions_created == {}
    # the history really carries both weak signals: the gate, not a missing input, kept the card unpredicted
    now = harness.clock.now()
    rows = store.read(node_id=NodeId(node), gpu_index=0, source="real", since=now - 7 * DAY, until=now)
    codes = {s.code for s in weak_signals(rows, uuid="GPU-hot", t0=now, params=WeakSignalParams())}
    assert codes == {"temperature_high", "power_shift"}
    assert predictions(harness, reader)["total"] == 0
    assert alerts(harness, reader, type="GPU_FAULT_PREDICTED") == []


def test_weak_signals_ride_along_as_evidence_on_a_strong_prediction(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "hot-node")
    now = harness.clock.now()
    for day in range(7, 0, -1):
        write_weak_metrics(harness, node, 0, "GPU-bad", day_start=now - day * DAY - timedelta(hours=3), power=300.0)
    write_weak_metrics(harness, node, 0, "GPU-bad", day_start=now - timedelta(hours=2), power=450.0)
    write_weak_metrics(harness, node, 0, "GPU-old", day_start=now - timedelta(hours=5), power=999.0)  # other card
    write(harness, node, 0, [(now - timedelta(minutes=1), "GPU-bad", {"ecc_uncorrected_total": 3})])
    assert harness.ctx.worker.tick().predictions_created == {"real": 1}
    (item,) = predictions(harness, reader)["items"]
    assert item["signals"] == ["uncorrectable_ecc", "temperature_high", "power_shift"]
    assert "weak signal [power_shift]" in item["evidence"]
    assert "+50%" in item["evidence"]  # 300 W -> 450 W; the other uuid's 999 W is not this card's history


def test_a_card_last_sampled_longer_ago_than_the_window_is_not_predicted_retroactively(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "stale-node")
    now = harness.clock.now()
    write(harness, node, 0, [(now - 10 * DAY, "GPU-stale", {"ecc_uncorrected_total": 2})])  # silent for 10 days
    write(harness, node, 1, [(now - 2 * DAY, "GPU-recent", {"ecc_uncorrected_total": 2})])  # window still open
    report = harness.ctx.worker.tick()
    assert report.cards_stale == 1
    assert report.predictions_created == {"real": 1}
    (item,) = predictions(harness, reader)["items"]
    assert item["gpu_index"] == 1
    assert all(a["status"] == "open" for a in alerts(harness, reader))  # one alert, about the card with an open window
    assert "#1" in alerts(harness, reader)[0]["message"] or "GPU 1" in alerts(harness, reader)[0]["message"]


def _every_half_hour(start: datetime, end: datetime, uuid: str, **counters: int | None) -> list[Any]:
    rows = []
    at = start
    while at <= end:
        rows.append((at, uuid, dict(counters)))
        at += timedelta(minutes=30)
    return rows


def test_one_historic_uncorrectable_error_does_not_predict_forever(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "old-ue-node")
    now = harness.clock.now()
    # card 0: one uncorrectable error 20 days ago, none since; card 1: a new one yesterday
    write(harness, node, 0, _every_half_hour(now - 20 * DAY, now, "GPU-old", ecc_uncorrected_total=1))
    write(harness, node, 1, _every_half_hour(now - 20 * DAY, now - DAY, "GPU-new", ecc_uncorrected_total=1))
    write(
        harness, node, 1, _every_half_hour(now - DAY + timedelta(minutes=30), now, "GPU-new", ecc_uncorrected_total=2)
    )
    assert harness.ctx.worker.tick().predictions_created == {"real": 1}
    (item,) = predictions(harness, reader)["items"]
    assert item["gpu_index"] == 1
    assert "grew from 1 to 2" in item["evidence"]
    assert "lifetime total 2" in item["evidence"]


def test_a_card_predicted_at_first_sight_is_not_predicted_again_without_new_errors(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "first-sight")
    start = harness.clock.now()
    write(harness, node, 0, [(start - timedelta(minutes=1), "GPU-a", {"ecc_uncorrected_total": 1})])
    assert harness.ctx.worker.tick().predictions_created == {"real": 1}  # no earlier value known: the seed's rule
    harness.clock.advance(8 * 86400)
    write(harness, node, 0, _every_half_hour(start, harness.clock.now(), "GPU-a", ecc_uncorrected_total=1))
    report = harness.ctx.worker.tick()
    assert report.judged == {"miss": 1}
    assert report.predictions_created == {}  # the same old error: no second prediction
    assert [a["status"] for a in alerts(harness, reader)] == ["resolved"]  # so the alert can close
    harness.clock.advance(86400)
    write(harness, node, 0, [(harness.clock.now() - timedelta(minutes=1), "GPU-a", {"ecc_uncorrected_total": 3})])
    assert harness.ctx.worker.tick().predictions_created == {"real": 1}  # new errors: predicted again
    newest = max(predictions(harness, reader)["items"], key=lambda p: p["t0"])
    assert "grew from 1 to 3" in newest["evidence"]


def test_cambricons_unconfirmed_semantics_reach_the_evidence_the_alert_the_recall_and_the_matrix(
    harness: Harness,
) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "mlu-node", vendor="Cambricon", model="MLU370")
    start = harness.clock.now()

    def beat(ue: int) -> None:
        stat = {
            "index": 0,
            "uuid": None,  # cnmon gives no uuid
            "sampled_at": harness.clock.now().isoformat(),
            "ecc_uncorrected_total": ue,
            "semantics_unconfirmed": ["ecc_uncorrected_total", "not-a-key"],
        }
        assert harness.beat(agent, node, [stat]).status_code == 200
        harness.drain()

    beat(0)
    harness.clock.advance(3600)
    beat(3)  # a step: a failure event, read from the Ecc-Error column of unknown meaning
    harness.clock.advance(60)
    assert harness.ctx.worker.tick().predictions_created == {"real": 1}

    (item,) = predictions(harness, reader)["items"]
    assert "semantics unconfirmed" in item["evidence"]
    (alert,) = alerts(harness, reader)
    assert "semantics unconfirmed" in alert["message"]
    (card,) = harness.get(reader, "/api/v1/gpu-health/capabilities").json()["cards"]
    assert card["semantics_unconfirmed"] == ["ecc_uncorrected_total"]
    stats = harness.get(reader, "/api/v1/gpu-health/prediction-stats", since=start.isoformat()).json()
    assert {band["failed_cards"] for band in stats["windows"]} == {1}
    assert {band["unconfirmed_failed_cards"] for band in stats["windows"]} == {1}
    # 0 → 3: the card's first uncorrectable error, so a first failure too
    assert {band["first_failure"]["failed_cards"] for band in stats["windows"]} == {1}


def test_uncorrectable_row_remaps_are_stored_predicted_on_and_counted_as_failures(harness: Harness) -> None:
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "a10-node", model="NVIDIA A10")
    start = harness.clock.now()

    def beat(uncorrectable_remaps: int) -> None:
        stat = {
            "index": 0,
            "uuid": "GPU-a10",
            "sampled_at": harness.clock.now().isoformat(),
            "ecc_uncorrected_total": 0,  # the ECC counter shows nothing
            "ecc_corrected_total": 12,
            "remapped_rows_pending": 1,
            "remapped_rows_failure": 0,
            "remapped_rows_correctable": 0,
            "remapped_rows_uncorrectable": uncorrectable_remaps,
        }
        assert harness.beat(agent, node, [stat]).status_code == 200
        harness.drain()

    beat(4)  # an A10 with 4 uncorrectable remaps and pending=Yes
    (card,) = harness.get(reader, "/api/v1/gpu-health/capabilities").json()["cards"]
    assert card["metrics"]["remapped_rows_uncorrectable"] == "collectable"
    assert card["metrics"]["ecc_sram_uncorrected_total"] == "unknown"  # never sent: unknown, never 0
    samples = harness.get(reader, "/api/v1/gpu-health/samples", node_id=node, gpu_index=0).json()["samples"]
    assert samples[0]["remapped_rows_uncorrectable"] == 4
    assert samples[0]["ecc_sram_corrected_total"] is None

    harness.clock.advance(60)
    assert harness.ctx.worker.tick().predictions_created == {"real": 1}
    (item,) = predictions(harness, reader)["items"]
    assert "uncorrectable_remap" in item["signals"]

    harness.clock.advance(86400)
    beat(5)  # one more row remapped after an uncorrectable error: the failure the prediction was about
    harness.clock.advance(7 * 86400)
    beat(5)
    assert harness.ctx.worker.tick().judged == {"hit": 1}
    judged = predictions(harness, reader)["items"][0]
    assert "rows remapped after uncorrectable errors grew from 4 to 5" in judged["conclusion"]
    stats = harness.get(reader, "/api/v1/gpu-health/prediction-stats", since=start.isoformat()).json()
    assert {band["failed_cards"] for band in stats["windows"]} == {1}
    # the card had 4 uncorrectable remaps before: a recurrence, predicted on a card that had already failed
    seven = next(band for band in stats["windows"] if band["window_days"] == 7)
    assert (seven["hit"], seven["first_failure"]["hit"], seven["first_failure"]["miss"]) == (1, 0, 0)
    assert seven["first_failure"]["failed_cards"] == 0
    assert seven["first_failure"]["precision"] is None  # below the evidence gate: null, never 0
    assert seven["first_failure"]["first_failure"] is None


def test_a_correctable_error_flood_shows_on_the_card_without_a_prediction(harness: Harness) -> None:
    """A steady flood with no uncorrectable error (the field case: billions of CEs, 0 UEs): no prediction, and the
    card carries the flood as weak evidence in the capability matrix until it stops."""
    agent, reader = harness.token("agent"), harness.token("nodes:read")
    node = harness.register(agent, "gb200-node")
    start = harness.clock.now() - timedelta(days=2)
    per_half_hour = 17_700 * 1800
    rows = [
        (
            start + timedelta(minutes=30 * k),
            "GPU-flood",
            {"ecc_corrected_total": k * per_half_hour, "ecc_uncorrected_total": 0},
        )
        for k in range(2 * 48 + 1)
    ]
    write(harness, node, 0, rows)
    harness.clock.advance(60)
    assert harness.ctx.worker.tick().predictions_created == {}  # a weak signal never predicts alone
    (card,) = harness.get(reader, "/api/v1/gpu-health/capabilities").json()["cards"]
    flood = card["ce_flood"]
    assert flood["evidence"]["code"] == "evidence.corrected_flood"
    assert flood["evidence"]["signal"] == "corrected_ecc_flood"
    assert float(flood["evidence"]["params"]["rate"]) == pytest.approx(17_700, rel=0.01)
    # the flood stops: a day later the card's count has not moved, and the flag is gone at the next evaluation
    last = rows[-1][2]["ecc_corrected_total"]
    quiet_start = rows[-1][0]
    write(
        harness,
        node,
        0,
        [
            (
                quiet_start + timedelta(minutes=30 * k),
                "GPU-flood",
                {"ecc_corrected_total": last, "ecc_uncorrected_total": 0},
            )
            for k in range(1, 50)
        ],
    )
    harness.clock.advance(86400)
    harness.ctx.worker.tick()
    (card,) = harness.get(reader, "/api/v1/gpu-health/capabilities").json()["cards"]
    assert card["ce_flood"] is None
