"""No token reaches a log line: every route of every service is called with known tokens — right, wrong and of
the wrong kind, in the Authorization header, in the query string and in credential-named body fields — while
structlog and the standard library log at debug level into captured stderr and stdout
(``core/logs.py`` sets logging up as every process does).

The real processes are in ``test_processes.py``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import structlog

from heteroflow.contracts.serving import COORDINATOR_SET_PATH, NM_FT_GUARD_PATH, REGISTER_PATH
from heteroflow.core.ids import NodeId
from heteroflow.core.logs import configure_logging
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings, AlertNotifier
from heteroflow.storage.alert_store import AlertRecord
from tests.security.routes import endpoints
from tests.security.services import API_KEY, CLUSTER_TOKEN, PATH_VALUES, WRONG_TOKEN, Service, auth

PLATFORM_TOKENS = ("admin", "agent", "nodes:read", "tenant:nodes:read", "tenant:admin")
"""The platform tokens sent (one per kind of holder; every scope is exercised by the route tests)."""

CREDENTIAL_FIELDS = ("token", "cluster_token", "api_key", "authorization", "password", "secret")


@dataclass(frozen=True)
class Acting:
    """A request that makes a service act and log ``event``, sent with its ``credential``."""

    credential: str
    path: str
    body: dict[str, Any]
    event: str


CAPABILITY = {
    "engine_ft_enabled": True,
    "scale_down_supported": True,
    "external_lb": True,
    "auto_recovery_enabled": False,
    "eplb_enabled": True,
    "num_redundant_experts": 0,
    "num_logical_experts": 1,
    "slots_per_rank": 1,
    "tp_size": 1,
}
REGISTRATION = {
    "pod_id": "pod-log",
    "pod_ip": "127.0.0.1",
    "node_manager_url": "http://nm-log",
    "instance_id": "inst-log",
    "dp_size": 1,
    "endpoints": [{"id": 0, "ip": "127.0.0.1", "port": 8100}],
    "ft_capability": CAPABILITY,
}
NODE = {"hostname": "log-1", "vendor": "nvidia", "gpu_count": 1}
VIEW = {
    "instance_id": "inst-log",
    "model": "m",
    "generation": 0,
    "endpoints": [{"id": 0, "ip": "10.0.0.1", "port": 80}],
}
ACTING = {
    "platform": Acting("agent", "/api/v1/nodes/register", NODE, "node.registered"),
    "controller": Acting("cluster", REGISTER_PATH, REGISTRATION, "controller.pod_registered"),
    "node_manager": Acting("cluster", NM_FT_GUARD_PATH, {"request_id": "r-log", "lease_sec": 5}, "ft.guard"),
    "coordinator": Acting("cluster", COORDINATOR_SET_PATH, VIEW, "coordinator.view_changed"),
    "engine_sim": Acting("cluster", "/sim/faults", {"kind": "slow_rebuild", "delay_sec": 0}, "engine.fault_injected"),
}
"""One request per service that acts and logs, so that the service's own log lines are shown to be captured: a
test that captured nothing would prove nothing."""


class DebugLogs:
    """Debug logging as a HeteroFlow process sets it up (``configure_logging``), into pytest's captured streams.

    ``start`` is called from the test itself: the capture fixtures replace ``sys.stderr`` only once the test runs,
    and the log set-up binds the stream it finds."""

    def __init__(self, capfd: pytest.CaptureFixture[str]) -> None:
        self._capfd = capfd

    def start(self) -> None:
        configure_logging(level="debug", json=True)
        # SQLAlchemy keeps its own loggers at WARNING: open them, so that every statement and its parameters are
        # searched too (tokens are stored and looked up by their digest, never in clear)
        logging.getLogger("sqlalchemy.engine").setLevel(logging.INFO)
        # the test's own HTTP client logs each URL it sends, query string included: that is the caller's log
        logging.getLogger("httpx2").setLevel(logging.WARNING)

    def read(self) -> str:
        return "".join(self._capfd.readouterr())


@pytest.fixture
def debug_logs(capfd: pytest.CaptureFixture[str]) -> Iterator[DebugLogs]:
    root = logging.getLogger()
    saved_root = (list(root.handlers), root.level)
    touched = [logging.getLogger(name) for name in ("httpx", "httpx2", "sqlalchemy.engine")]
    saved_levels = [logger.level for logger in touched]
    try:
        yield DebugLogs(capfd)
    finally:
        for logger, level in zip(touched, saved_levels, strict=True):
            logger.setLevel(level)
        root.handlers[:] = saved_root[0]
        root.setLevel(saved_root[1])
        structlog.reset_defaults()


def secrets_of(service: Service, platform: Service) -> dict[str, str]:
    known = {name: service.tokens[name] for name in PLATFORM_TOKENS} if service.name == "platform" else service.tokens
    return known | {
        "unknown": WRONG_TOKEN,
        "cluster": CLUSTER_TOKEN,
        "api_key": API_KEY,
        "platform admin": platform.tokens["admin"],
    }


def test_no_token_reaches_a_log_line(service: Service, platform: Service, debug_logs: DebugLogs) -> None:
    secrets = secrets_of(service, platform)
    debug_logs.start()
    structlog.get_logger("tests.security").debug("security.capture_probe")
    for endpoint in endpoints(service.app):
        path = endpoint.path(PATH_VALUES)
        takes_body = endpoint.method in ("POST", "PUT", "PATCH")
        for token in secrets.values():
            body: dict[str, Any] = {"json": dict.fromkeys(CREDENTIAL_FIELDS, token)} if takes_body else {}
            service.client.request(endpoint.method, path, headers=auth(token), **body)
            service.client.request(endpoint.method, path, headers={"Authorization": f"Basic {token}"})
        service.client.request(endpoint.method, path, params={"token": secrets["cluster"], "access_token": WRONG_TOKEN})
    acting = ACTING[service.name]
    acted = service.client.post(acting.path, json=acting.body, headers=auth(service.tokens[acting.credential]))
    assert acted.status_code < 300, f"{service.name} {acting.path}: {acted.status_code} {acted.text[:300]}"
    printed = debug_logs.read()
    assert "security.capture_probe" in printed, "debug logging is not captured: this test would prove nothing"
    assert acting.event in printed, f"{service.name}'s own log line {acting.event!r} was not captured"
    leaked = [name for name, token in secrets.items() if token in printed]
    assert not leaked, f"{service.name} logged the {leaked} token(s)"


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


def test_an_alert_receiver_is_logged_by_its_origin_only(debug_logs: DebugLogs) -> None:
    """A webhook URL is a credential: chat hooks carry theirs in the path or the query, others as a password."""
    url = "https://hook-user:hook-password@hooks.example:8443/services/T0/B0/path-secret?token=query-secret"

    async def scenario() -> AlertNotifier:
        notifier = AlertNotifier(
            AlertDeliverySettings.load(webhook_url=url, alertmanager_url=url, max_attempts=1),
            transport=httpx.MockTransport(lambda _: httpx.Response(500)),
        )
        notifier.start()
        notifier.submit("raised", ALERT)
        await asyncio.wait_for(notifier.drained(), 10)
        await notifier.stop()
        return notifier

    debug_logs.start()
    assert asyncio.run(scenario()).status().dropped_total == 2
    printed = debug_logs.read()
    assert "alert.delivery_gave_up" in printed
    assert "https://hooks.example:8443" in printed
    leaked = [secret for secret in ("hook-password", "path-secret", "query-secret") if secret in printed]
    assert not leaked, f"the receiver's credential was logged: {leaked}"
