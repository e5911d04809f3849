"""A node-level GPU_FAULT_PREDICTED alert with several predicted cards for the alerts page's browser tests and
screenshots: on the seeded server's ``gpu-other`` (tenant other, so that the acme pages' alerts stay as they are),
a trend on GPU 1 and a remap failure on GPU 3 join the open alert of GPU 0, which rises to CRITICAL."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from heteroflow.core.ids import NodeId
from heteroflow.health.alerts import GPU_FAULT_PREDICTED, PredictedFault, predicted_fault_message
from heteroflow.health.samples import Card
from heteroflow.platform.auth import parse_scopes
from heteroflow.storage.alert_store import CARD_ADDED
from heteroflow.storage.prediction_store import PredictionRecord
from heteroflow.storage.token_store import SqlTokenStore
from tests.web.seed import Seeded

JOINED = (
    (1, ("corrected_ecc_growth",), "trend signal [corrected_ecc_growth]: corrected ECC grew from 10 to 90 in 3 days"),
    (3, ("remap_failure",), "strong signal [remap_failure]: row remapping failure 1 > 0 (spare rows exhausted)"),
)


@dataclass(frozen=True, slots=True)
class MultiCardAlert:
    alert_id: str
    node_id: str
    operator: str
    """tenant other: nodes:read + alerts:write"""


def seed_multi_card_alert(seeded: Seeded) -> MultiCardAlert:
    """Idempotent: a second call finds the cards already joined."""
    ctx = seeded.ctx
    node_id = NodeId(seeded.nodes["gpu-other"])
    alert = ctx.alerts.open_alert(node_id, GPU_FAULT_PREDICTED)
    assert alert is not None, "the seed's worker tick raises gpu-other's alert"
    known = {c.gpu_index for c in ctx.predictions.alert_cards({alert.id: node_id}).get(alert.id, [])}
    for index, signals, evidence in JOINED:
        if index in known:
            continue
        t0 = alert.created_at + timedelta(milliseconds=index)  # just after the alert was raised, before any test
        record = PredictionRecord(
            id=f"multi-card-{index}",
            card=Card(node_id=node_id, gpu_index=index, uuid=f"GPU-other-{index}", source="real"),
            rule_version="v1-ecc-growth",
            window_days=7,
            t0=t0,
            window_end=t0 + timedelta(days=7),
            status="pending",
            signals=signals,
            evidence=evidence,
            created_at=t0,
            judged_at=None,
            conclusion=None,
            alert_id=alert.id,
        )
        ctx.predictions.insert(record)
        severity = "CRITICAL" if "remap_failure" in signals else "WARN"
        note = predicted_fault_message(
            PredictedFault(
                node_name="gpu-other",
                gpu_index=index,
                uuid=record.card.uuid,
                window_days=7,
                rule_version="v1-ecc-growth",
                evidence=evidence,
            )
        )
        ctx.alerts.join(alert.id, severity=severity, note=note, now=t0, action=CARD_ADDED)
    tokens = SqlTokenStore(ctx.engine)
    other = tokens.ensure_tenant("other", now=seeded.now)[0]
    operator = tokens.create_token(
        name="web-test", scopes=parse_scopes("nodes:read,alerts:write"), tenant_id=other, now=seeded.now
    )[1]
    return MultiCardAlert(alert_id=alert.id, node_id=node_id, operator=operator)
