"""Alert delivery to a real HTTP receiver on loopback: webhook and Alertmanager, retries, a dead receiver."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from heteroflow.core.ids import NodeId
from heteroflow.core.testing import free_port
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings, AlertNotifier
from heteroflow.storage.alert_store import AlertRecord

ALERT = AlertRecord(
    id="a-1",
    type="GPU_FAULT_PREDICTED",
    severity="WARN",
    node_id=NodeId("n-1"),
    node_name="gpu-1",
    tenant_id=None,
    status="open",
    message="Memory fault predicted on gpu-1 GPU 0",
    created_at=datetime(2026, 5, 1, tzinfo=UTC),
    resolved_at=None,
    resolved_by=None,
    resolution=None,
    backlog_since=None,
)


class Receiver:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.received: list[tuple[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    failing = receiver.failures > 0
                    receiver.failures -= 1
                    if not failing:
                        receiver.received.append((self.path, body))
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(failures=3)
    yield r
    r.close()


def test_events_reach_webhook_and_alertmanager_through_failures(receiver: Receiver) -> None:
    async def scenario() -> AlertNotifier:
        settings = AlertDeliverySettings.load(
            webhook_url=f"{receiver.url}/hook", alertmanager_url=f"{receiver.url}/am", retry_initial_seconds=0.02
        )
        notifier = AlertNotifier(settings)
        notifier.start()
        await asyncio.to_thread(notifier.submit, "raised", ALERT)  # from a worker thread, as the worker does
        await asyncio.wait_for(notifier.drained(), 20)
        await notifier.stop()
        return notifier

    notifier = asyncio.run(scenario())
    paths = dict(receiver.received)
    assert set(paths) == {"/hook", "/am/api/v2/alerts"}
    assert paths["/hook"]["event"] == "raised"
    assert paths["/hook"]["alert"]["node_name"] == "gpu-1"
    [am] = paths["/am/api/v2/alerts"]
    assert am["labels"]["alertname"] == "GPU_FAULT_PREDICTED"
    assert am["labels"]["severity"] == "warning"
    assert "endsAt" not in am
    status = notifier.status()
    assert status.delivered_total == 2
    assert status.failed_attempts_total == 3
    assert status.dropped_total == 0


def test_a_dead_receiver_never_blocks_and_events_are_given_up_and_counted() -> None:
    async def scenario() -> tuple[AlertNotifier, float]:
        dead = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
        notifier = AlertNotifier(
            AlertDeliverySettings.load(webhook_url=dead, max_attempts=3, retry_initial_seconds=0.01)
        )
        notifier.start()
        started = time.perf_counter()
        for _ in range(50):
            notifier.submit("raised", ALERT)
        submitted = time.perf_counter() - started
        await asyncio.wait_for(notifier.drained(), 30)
        await notifier.stop()
        return notifier, submitted

    notifier, submitted = asyncio.run(scenario())
    assert submitted < 0.5  # submitting is a queue operation, whatever the receiver does
    assert notifier.status().dropped_total == 50
    assert notifier.status().failed_attempts_total == 150


def test_without_targets_nothing_is_queued() -> None:
    async def scenario() -> AlertNotifier:
        notifier = AlertNotifier(AlertDeliverySettings.load())
        notifier.start()
        notifier.submit("raised", ALERT)
        await asyncio.wait_for(notifier.drained(), 5)
        await notifier.stop()
        return notifier

    assert asyncio.run(scenario()).status().queued == 0
