"""Delivery of alert events to a webhook and to a Prometheus Alertmanager, off the worker's path.

The worker only submits events (thread-safe, never blocks, bounded); a background task delivers them with
retries and exponential backoff. A receiver that is down costs retries and, past the bound, dropped events
that are counted — never a stalled worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, Literal
from urllib.parse import urlsplit

import httpx
import structlog
from pydantic import Field

from heteroflow.core.settings import LenientSettings, env_names
from heteroflow.health.alerts import GPU_FAULT_PREDICTED, AlertedCard
from heteroflow.health.gpu_metrics import GPU_MEMORY_HIGH
from heteroflow.http.tls import client_tls
from heteroflow.platform.cards import NODE_CARDS_REFUSED
from heteroflow.storage.alert_store import AlertRecord

_log = structlog.get_logger(__name__)

EventKind = Literal["raised", "card_added", "acknowledged", "resolved", "backlog"]


class AlertDeliverySettings(LenientSettings):
    """Where alert events go. Nothing is delivered when no target is set."""

    webhook_url: str = Field(
        default="",
        validation_alias=env_names("alert_webhook_url"),
        description="POST every alert event as JSON to this URL (default: none).",
    )
    alertmanager_url: str = Field(
        default="",
        validation_alias=env_names("alertmanager_url"),
        description="Base URL of a Prometheus Alertmanager; events go to POST {url}/api/v2/alerts (default: none).",
    )
    max_attempts: int = Field(
        default=8,
        ge=1,
        le=100,
        validation_alias=env_names("alert_delivery_max_attempts"),
        description="Attempts per event and target before it is dropped and counted (default 8).",
    )
    retry_initial_seconds: float = Field(
        default=1.0,
        gt=0,
        validation_alias=env_names("alert_delivery_retry_seconds"),
        description="First retry delay, doubled per attempt up to 60 s (default 1 s).",
    )
    queue_size: int = Field(
        default=10_000,
        ge=1,
        validation_alias=env_names("alert_delivery_queue_size"),
        description="Events waiting for delivery (default 10000); beyond it new events are dropped and counted.",
    )


@dataclass(frozen=True, slots=True)
class AlertEventOut:
    kind: EventKind
    alert: AlertRecord
    cards: tuple[AlertedCard, ...] = ()
    """GPU_FAULT_PREDICTED: every predicted card of the node under the alert, with its signals."""
    previous_severity: str | None = None
    """Set when this event raised the alert's severity (a card with a stronger signal joined)."""
    at: datetime | None = None
    """When the event happened (the old severity's instance ends then)."""


@dataclass(frozen=True, slots=True)
class DeliveryStatus:
    queued: int
    delivered_total: int
    failed_attempts_total: int
    dropped_total: int


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def webhook_payload(event: AlertEventOut) -> dict[str, Any]:
    a = event.alert
    return {
        "event": event.kind,
        "alert": {
            "id": a.id,
            "type": a.type,
            "severity": a.severity,
            "previous_severity": event.previous_severity,
            "status": a.status,
            "node_id": a.node_id,
            "node_name": a.node_name,
            "message": a.message,
            "created_at": a.created_at.isoformat(),
            "acknowledged_at": _iso(a.acknowledged_at),
            "acknowledged_by": a.acknowledged_by,
            "acknowledgement": a.acknowledgement,
            "resolved_at": _iso(a.resolved_at),
            "resolved_by": a.resolved_by,
            "resolution": a.resolution,
            "backlog_since": _iso(a.backlog_since),
            "cards": [
                {
                    "gpu_index": c.gpu_index,
                    "uuid": c.uuid,
                    "source": c.source,
                    "severity": c.severity,
                    "signals": list(c.signals),
                    "prediction_id": c.prediction_id,
                }
                for c in event.cards
            ],
        },
    }


RUNBOOK_PAGES: Final = {
    GPU_FAULT_PREDICTED: "docs/runbooks/platform/GPU_FAULT_PREDICTED.md",
    GPU_MEMORY_HIGH: "docs/runbooks/platform/GPU_MEMORY_HIGH.md",
    NODE_CARDS_REFUSED: "docs/runbooks/platform/NODE_CARDS_REFUSED.md",
}
"""Each platform alert type's runbook, as the path of its page in the repository (as the Prometheus rules'
``runbook_url`` annotations give theirs): sent as the alert's ``runbook_url`` annotation."""


def alertmanager_severity(severity: str) -> str:
    """Alertmanager's usual severity label values: WARN → warning, CRITICAL → critical."""
    return "warning" if severity == "WARN" else severity.lower()


def alertmanager_payload(event: AlertEventOut) -> list[dict[str, Any]]:
    """One alert per node and type, with labels to route on that stay the same for the alert's life (severity
    aside: when a stronger card raises it, the instance at the old severity is ended in the same post, so that
    Alertmanager does not keep a stale warning firing beside the critical one). The cards are annotations."""
    a = event.alert
    labels: dict[str, str] = {
        "alertname": a.type,
        "severity": alertmanager_severity(a.severity),
        "node": a.node_name,
        "node_id": a.node_id,
        "heteroflow_alert_id": a.id,
    }
    if a.tenant_id is not None:
        labels["tenant"] = a.tenant_id
    if event.cards:
        labels["source"] = event.cards[0].source
    annotations: dict[str, str] = {"summary": a.message, "backlog": "true" if a.backlog_since else "false"}
    if event.cards:
        annotations["gpus"] = ",".join(str(c.gpu_index) for c in sorted(event.cards, key=lambda c: c.gpu_index))
        annotations["cards"] = "; ".join(
            f"GPU {c.gpu_index}" + (f" ({c.uuid})" if c.uuid else "") + f": {c.severity} {','.join(c.signals)}"
            for c in event.cards
        )
    if a.acknowledged_at is not None:
        annotations["acknowledged"] = f"{a.acknowledged_by} at {a.acknowledged_at.isoformat()}: {a.acknowledgement}"
    alert: dict[str, Any] = {"labels": labels, "annotations": annotations, "startsAt": a.created_at.isoformat()}
    if a.type in RUNBOOK_PAGES:
        annotations["runbook_url"] = RUNBOOK_PAGES[a.type]
    if a.resolved_at is not None:
        alert["endsAt"] = a.resolved_at.isoformat()
    posted = [alert]
    if event.previous_severity is not None and event.previous_severity != a.severity:
        ended = {**labels, "severity": alertmanager_severity(event.previous_severity)}
        posted.append(
            {
                "labels": ended,
                "annotations": annotations,
                "startsAt": a.created_at.isoformat(),
                "endsAt": (event.at or a.created_at).isoformat(),
            }
        )
    return posted


class AlertNotifier:
    def __init__(self, settings: AlertDeliverySettings, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._settings = settings
        self._transport = transport
        self._queue: asyncio.Queue[tuple[AlertEventOut, str, int]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self.delivered_total = 0
        self.failed_attempts_total = 0
        self.dropped_total = 0

    @property
    def targets(self) -> list[str]:
        return [t for t in (self._settings.webhook_url, self._settings.alertmanager_url) if t]

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._queue = asyncio.Queue(maxsize=self._settings.queue_size)
        self._task = asyncio.create_task(self._run(), name="alert-delivery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(
        self,
        kind: EventKind,
        alert: AlertRecord,
        *,
        cards: Sequence[AlertedCard] = (),
        previous_severity: str | None = None,
        at: datetime | None = None,
    ) -> None:
        """Queue an event for every target. Safe from any thread; never blocks."""
        if self._loop is None or self._queue is None or not self.targets:
            return
        event = AlertEventOut(kind, alert, tuple(cards), previous_severity, at)
        on_loop_thread = threading.get_ident() == self._loop_thread
        for target in self.targets:
            if on_loop_thread:
                self._put((event, target, 1))
            else:
                self._loop.call_soon_threadsafe(self._put, (event, target, 1))

    def _put(self, item: tuple[AlertEventOut, str, int]) -> None:
        assert self._queue is not None
        try:
            self._queue.put_nowait(item)
            self._idle.clear()
        except asyncio.QueueFull:
            self.dropped_total += 1
            _log.warning("alert.delivery_dropped", reason="queue full", alert_id=item[0].alert.id)
        self._check_idle()

    def _check_idle(self) -> None:
        if self._queue is not None and self._queue.empty() and self._in_flight == 0:
            self._idle.set()

    def status(self) -> DeliveryStatus:
        queued = (self._queue.qsize() if self._queue else 0) + self._in_flight
        return DeliveryStatus(queued, self.delivered_total, self.failed_attempts_total, self.dropped_total)

    async def drained(self) -> None:
        """Wait until every event has been delivered or given up, retries included (tests, the CLI tick)."""
        await self._idle.wait()

    async def _run(self) -> None:
        assert self._queue is not None
        async with httpx.AsyncClient(timeout=10, transport=self._transport, verify=client_tls()) as client:
            while True:
                event, target, attempt = await self._queue.get()
                self._in_flight += 1
                try:
                    await self._deliver(client, event, target)
                    self.delivered_total += 1
                except (httpx.HTTPError, _RejectedError) as exc:
                    self.failed_attempts_total += 1
                    if attempt >= self._settings.max_attempts:
                        self.dropped_total += 1
                        _log.warning(
                            "alert.delivery_gave_up",
                            target=receiver_origin(target),
                            alert_id=event.alert.id,
                            error=str(exc)[:200],
                        )
                    else:
                        delay = min(60.0, self._settings.retry_initial_seconds * 2 ** (attempt - 1))
                        self._retry_later(delay, (event, target, attempt + 1))
                finally:
                    self._in_flight -= 1
                    self._queue.task_done()
                    self._check_idle()

    def _retry_later(self, delay: float, item: tuple[AlertEventOut, str, int]) -> None:
        assert self._loop is not None
        self._in_flight += 1

        def requeue() -> None:
            self._in_flight -= 1
            self._put(item)

        self._loop.call_later(delay, requeue)

    async def _deliver(self, client: httpx.AsyncClient, event: AlertEventOut, target: str) -> None:
        if target == self._settings.alertmanager_url:
            url = target.rstrip("/") + "/api/v2/alerts"
            body: Any = alertmanager_payload(event)
        else:
            url, body = target, webhook_payload(event)
        response = await client.post(url, json=body, headers={"User-Agent": "heteroflow-alerts"})
        if response.status_code >= 300:
            raise _RejectedError(f"{receiver_origin(url)} answered {response.status_code}")


def receiver_origin(url: str) -> str:
    """``scheme://host[:port]`` of a receiver URL, which is all a log line shows of it: webhook URLs carry their
    credential in the path or the query (Slack, Teams, most chat hooks) or as ``user:password@``."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    try:
        port = parts.port
    except ValueError:  # not a number: the receiver is unreachable anyway, and the host says which one
        port = None
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


class _RejectedError(Exception):
    """The receiver answered, but not with success."""
