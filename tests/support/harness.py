"""An in-process platform server on a real database, a fake clock and starlette's TestClient."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx2 as httpx
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from heteroflow.core.clock import Clock, SystemClock
from heteroflow.core.testing import FakeClock
from heteroflow.health.metrics_settings import GpuMetricsSettings
from heteroflow.health.prediction_settings import PredictionSettings
from heteroflow.health.settings import HealthStorageSettings
from heteroflow.platform.auth import parse_scopes
from heteroflow.platform.nodes import NODE_CREDENTIAL_HEADER
from heteroflow.platform_server.alert_delivery import AlertDeliverySettings
from heteroflow.platform_server.assembly import build_context, create_app
from heteroflow.platform_server.context import ServerContext
from heteroflow.platform_server.maintenance import maintain
from heteroflow.platform_server.settings import ServerSettings
from heteroflow.storage.token_store import SqlTokenStore

_CREDENTIALS: dict[str, str] = {}


class Harness:
    def __init__(self, client: TestClient, ctx: ServerContext, clock: Clock) -> None:
        self.client = client
        self.ctx = ctx
        self._clock = clock
        self.credentials = _CREDENTIALS
        """Node id or (token, hostname) → the node credential its registration issued. Shared by every harness:
        an agent keeps its credential whichever server (of several on one database) it talks to."""

    @property
    def clock(self) -> FakeClock:
        """The server's clock, for the test to move (a harness on the system clock has none to move)."""
        assert isinstance(self._clock, FakeClock), "this server runs on the system clock"
        return self._clock

    def openapi(self) -> dict[str, Any]:
        """The server's OpenAPI document (the test client knows its app only as an ASGI callable)."""
        app = self.client.app
        assert isinstance(app, FastAPI)
        return app.openapi()

    def token(self, scopes: str, *, tenant: str | None = None) -> str:
        store = SqlTokenStore(self.ctx.engine)
        now = SystemClock().now()
        tenant_id = store.ensure_tenant(tenant, now=now)[0] if tenant else None
        return store.create_token(name="test", scopes=parse_scopes(scopes), tenant_id=tenant_id, now=now)[1]

    @staticmethod
    def auth(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    def register(self, token: str, hostname: str, **fields: Any) -> str:
        """Register as an agent does: the node's credential kept from its first registration, sent again."""
        body = {"hostname": hostname, "vendor": "nvidia", "model": "H100", "gpu_count": 8, **fields}
        headers = self.auth(token)
        known = self.credentials.get(f"{token}|{hostname}")
        if known is not None:
            headers[NODE_CREDENTIAL_HEADER] = known
        response = self.client.post("/api/v1/nodes/register", json=body, headers=headers)
        assert response.status_code == 200, response.text
        node_id: str = response.json()["node_id"]
        issued = response.json().get("node_credential")
        if issued:
            self.credentials[f"{token}|{hostname}"] = self.credentials[node_id] = issued
        return node_id

    def node_auth(self, token: str, node_id: str) -> dict[str, str]:
        """The headers of a heartbeat for ``node_id``: the agent token and the node's credential."""
        headers = self.auth(token)
        if node_id in self.credentials:
            headers[NODE_CREDENTIAL_HEADER] = self.credentials[node_id]
        return headers

    def beat(self, token: str, node_id: str, stats: list[dict[str, Any]], **extra: Any) -> httpx.Response:
        return self.client.post(
            f"/api/v1/nodes/{node_id}/heartbeat",
            json={"gpu_stats": stats, **extra},
            headers=self.node_auth(token, node_id),
        )

    def drain(self) -> None:
        """Wait until the health writer has processed every offered reading."""
        self.client.portal.call(self.ctx.ingestor.drained)  # type: ignore[union-attr]

    def flush_metrics(self) -> None:
        """One flush of the GPU metrics side path (closed minutes written, GPU_MEMORY_HIGH decided)."""
        self.client.portal.call(self.ctx.metrics_recorder.flush)  # type: ignore[union-attr]

    def maintain(self) -> None:
        """One round of the server's periodic upkeep (liveness flush, node and token re-confirmation)."""
        self.client.portal.call(maintain, self.ctx)  # type: ignore[union-attr]

    def get(self, token: str, path: str, **params: Any) -> httpx.Response:
        return self.client.get(path, params=params, headers=self.auth(token))


@contextlib.contextmanager
def running_server(
    engine: Engine,
    *,
    start: datetime | None = None,
    health: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    prediction: dict[str, Any] | None = None,
    delivery: dict[str, Any] | None = None,
    gpu_metrics: dict[str, Any] | None = None,
    clock: Clock | None = None,
    run_worker: bool = False,
) -> Iterator[Harness]:
    """A server on ``engine`` whose liveness flusher never fires by itself (tests flush explicitly).

    Its heartbeat gate never sheds for the event loop's lag: that lag is real time (the loop's timer), not the
    test's clock, and in a suite on two busy cores one stall of the whole process (a collection of a large heap,
    the process descheduled) refused the beats sent right after it. The shedding itself is tested on the gate
    (tests/unit/core/test_admission.py) and against a real server process (tests/load). Nor does it block an
    address for its 401s: every test client shares one address and many tests send refused tokens on purpose; the
    block is tested on its own (tests/unit/core/test_auth_failures.py, tests/security/test_tenant_attacks.py)."""
    clock = clock or FakeClock(start)
    settings = ServerSettings.load(
        **{
            "database_url": str(engine.url),
            "liveness_flush_seconds": 3600.0,
            "heartbeat_shed_lag_seconds": 3600.0,
            "max_failed_credentials": 1_000_000,
            **(server or {}),
        }
    )
    ctx = build_context(
        settings=settings,
        health_settings=HealthStorageSettings.load(**(health or {})),
        prediction_settings=PredictionSettings.load(**(prediction or {})),
        delivery_settings=AlertDeliverySettings.load(**(delivery or {})),
        metrics_settings=GpuMetricsSettings.load(**{"flush_seconds": 3600.0, **(gpu_metrics or {})}),
        clock=clock,
        engine=engine,
    )
    with TestClient(create_app(ctx, run_worker=run_worker)) as client:
        yield Harness(client, ctx, clock)
