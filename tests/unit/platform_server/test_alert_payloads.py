"""What a webhook and Alertmanager receive of a node-level alert: its cards, its routing labels, a severity rise."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from heteroflow.core.ids import NodeId, TenantId
from heteroflow.health.alerts import AlertedCard, alerted_cards, severity_of
from heteroflow.platform_server.alert_delivery import AlertEventOut, alertmanager_payload, webhook_payload
from heteroflow.storage.alert_store import AlertRecord

T0 = datetime(2026, 5, 20, 12, 0, tzinfo=UTC)


def card(index: int, *signals: str, hours: int = 0) -> AlertedCard:
    return AlertedCard(
        gpu_index=index,
        uuid=f"GPU-{index}",
        source="real",
        prediction_id=f"p{index}-{hours}",
        signals=signals,
        status="pending",
        t0=T0 + timedelta(hours=hours),
        evidence="",
    )


ALERT = AlertRecord(
    id="a1",
    type="GPU_FAULT_PREDICTED",
    severity="CRITICAL",
    node_id=NodeId("n1"),
    node_name="gpu-a",
    tenant_id=TenantId("t1"),
    status="open",
    message="Memory fault predicted …",
    created_at=T0,
    resolved_at=None,
    resolved_by=None,
    resolution=None,
    backlog_since=None,
)


def test_severity_follows_the_signal() -> None:
    assert severity_of(["remap_failure"]) == "CRITICAL"
    assert severity_of(["corrected_ecc_growth", "uncorrectable_ecc"]) == "CRITICAL"
    assert severity_of(["corrected_ecc_growth"]) == "WARN"
    assert severity_of(["pending_remap_growth", "retired_pages_growth"]) == "WARN"


def test_each_card_once_by_its_newest_prediction_most_severe_first() -> None:
    cards = alerted_cards(
        [card(0, "corrected_ecc_growth"), card(2, "corrected_ecc_growth"), card(0, "remap_failure", hours=5)]
    )
    assert [(c.gpu_index, c.severity) for c in cards] == [(0, "CRITICAL"), (2, "WARN")]


def test_alertmanager_gets_routable_labels_and_every_card() -> None:
    cards = (card(3, "remap_failure"), card(0, "corrected_ecc_growth"))
    [posted] = alertmanager_payload(AlertEventOut("raised", ALERT, cards))
    assert posted["labels"] == {
        "alertname": "GPU_FAULT_PREDICTED",
        "severity": "critical",
        "node": "gpu-a",
        "node_id": "n1",
        "heteroflow_alert_id": "a1",
        "tenant": "t1",
        "source": "real",
    }
    assert posted["annotations"]["gpus"] == "0,3"
    assert posted["annotations"]["cards"] == (
        "GPU 3 (GPU-3): CRITICAL remap_failure; GPU 0 (GPU-0): WARN corrected_ecc_growth"
    )
    hook = webhook_payload(AlertEventOut("raised", ALERT, cards))
    assert [c["gpu_index"] for c in hook["alert"]["cards"]] == [3, 0]


def test_a_severity_rise_ends_the_instance_at_the_old_severity() -> None:
    at = T0 + timedelta(hours=2)
    posted = alertmanager_payload(AlertEventOut("card_added", ALERT, (card(1, "remap_failure"),), "WARN", at))
    assert [p["labels"]["severity"] for p in posted] == ["critical", "warning"]
    assert "endsAt" not in posted[0]
    assert posted[1]["endsAt"] == at.isoformat()
    assert {k: v for k, v in posted[1]["labels"].items() if k != "severity"} == {
        k: v for k, v in posted[0]["labels"].items() if k != "severity"
    }
