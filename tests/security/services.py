"""Every HeteroFlow HTTP service, built in process on its shipped fakes, each behind starlette's TestClient.

The serving services' objects are started inside the TestClient's own event loop (``client.portal``), so that one
synchronous client drives every service the same way and a module-scoped fixture can share one across tests.

The token values are fixed and recognisable, so that the log tests can search captured output for them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from heteroflow.contracts.serving import FtFlags
from heteroflow.core.clock import SystemClock
from heteroflow.engine_sim.assembly import create_app as engine_app
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.serving.controller.assembly import create_app as controller_app
from heteroflow.serving.controller.clients import NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig, ControllerSettings, FaultToleranceConfig
from heteroflow.serving.controller.service import Controller
from heteroflow.serving.controller.store import SqliteFtRuntimeStore
from heteroflow.serving.coordinator.assembly import create_app as coordinator_app
from heteroflow.serving.coordinator.service import Coordinator
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.testing import TEST_API_KEY, TEST_API_KEY_SHA256
from heteroflow.serving.node_manager.assembly import create_app as node_manager_app
from heteroflow.serving.node_manager.daemon import NodeManager, PodIdentity
from heteroflow.serving.node_manager.engines import HttpEngineClient
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.spec import InstanceSpec
from heteroflow.serving.node_manager.testing import FakeController, fake_cluster_launcher
from heteroflow.storage.db import create_db_engine, upgrade_database
from tests.support.harness import Harness, running_server

CLUSTER_TOKEN = "hf-security-cluster-token-5b0e7c2a"
"""The cluster token every internal service of these tests is configured with."""

WRONG_TOKEN = "hf_security-wrong-token-8d41f9e6"
"""A well-formed bearer token that no service knows."""

API_KEY = TEST_API_KEY
"""The Coordinator's OpenAI API key (its sha256 is configured, the key itself never)."""

MISSING_ID = "00000000-0000-4000-8000-000000000000"
"""A well-formed id that names nothing: node and alert ids are uuid4 strings."""

PATH_VALUES = {
    "node_id": MISSING_ID,
    "alert_id": MISSING_ID,
    "request_id": "sd-security-1",
    "instance_id": "inst-security-1",
    "path": "app.js",
}
"""Plausible path parameters, by name: ids shaped like real ones (so that the route, not the router, answers) and
an asset that exists under the web shell's ``ui/`` folder."""


@dataclass
class Service:
    """One running service: its app, a client on it, and the credentials it knows."""

    name: str
    app: FastAPI
    client: TestClient
    tokens: dict[str, str] = field(default_factory=dict)
    """Named credentials this service accepts (``cluster``, ``api_key``, or the platform's scope tokens)."""


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def sqlite_engine(folder: Path) -> Engine:
    engine = create_db_engine(f"sqlite:///{folder / 'heteroflow.db'}")
    upgrade_database(engine)
    return engine


@contextlib.contextmanager
def platform_server(folder: Path, *, start: datetime | None = None) -> Iterator[Harness]:
    """The platform server on a fresh SQLite database (real stores, fake clock, worker not started)."""
    engine = sqlite_engine(folder)
    try:
        with running_server(engine, start=start) as harness:
            yield harness
    finally:
        engine.dispose()


@contextlib.contextmanager
def controller_service(folder: Path) -> Iterator[Service]:
    """The controller, acting (started without its loops), with the cluster token."""
    config = ControllerConfig(
        settings=ControllerSettings.load(cluster_token=CLUSTER_TOKEN),
        ft=FaultToleranceConfig.load(enable_dp_scale_down=True),
    )
    controller = Controller(
        config=config,
        store=SqliteFtRuntimeStore(folder / "ft.db"),
        node_managers=NodeManagerClient(cluster_token=CLUSTER_TOKEN),
        coordinator=None,
        clock=SystemClock(),
    )
    app = controller_app(controller, cluster_token=CLUSTER_TOKEN)
    with TestClient(app) as client:
        portal = client.portal
        assert portal is not None
        portal.call(functools.partial(controller.start, loops=False))
        try:
            yield Service("controller", app, client, {"cluster": CLUSTER_TOKEN})
        finally:
            portal.call(controller.close)


@contextlib.contextmanager
def node_manager_service() -> Iterator[Service]:
    """One pod's NodeManager over two in-process fake engines, registered with a recording controller."""
    cluster = FakeEngineCluster(dp_size=2, num_experts=4, num_redundant_experts=4, cluster_token=CLUSTER_TOKEN)
    spec = InstanceSpec.model_validate(
        {
            "instance_id": "inst-security",
            "dp_size": 2,
            "dp_master_ip": "127.0.0.1",
            "dp_rpc_port": 29500,
            "dp_store_port": 29600,
            "num_logical_experts": 4,
            "num_redundant_experts": 4,
            "endpoints": [{"id": 0, "port": 8100}, {"id": 1, "port": 8101}],
        }
    )
    nm = NodeManager(
        spec=spec,
        settings=NodeManagerSettings.load(cluster_token=CLUSTER_TOKEN),
        pod=PodIdentity(pod_id="pod-security", pod_ip="127.0.0.1", node_manager_url="http://nm-security"),
        controller=FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True)),
        engines=HttpEngineClient(cluster.client, ft_path_prefix=cluster.prefix),
        launcher=fake_cluster_launcher(cluster),
        clock=cluster.clock,
    )
    app = node_manager_app(nm, cluster_token=CLUSTER_TOKEN)
    with TestClient(app) as client:
        portal = client.portal
        assert portal is not None
        portal.call(cluster.start)
        try:
            portal.call(functools.partial(nm.start, loops=False))
            portal.call(nm.controller_once)  # registered: the FT routes are live, not the proxy-off 404
            yield Service("node_manager", app, client, {"cluster": CLUSTER_TOKEN})
        finally:
            portal.call(nm.close)
            portal.call(cluster.close)


@contextlib.contextmanager
def coordinator_service() -> Iterator[Service]:
    """The Coordinator with the cluster token (management) and one API key (OpenAI routes); the route tests send
    every wrong key from one address, so its 401s never block it (that block: tests/security/test_tenant_attacks.py)."""
    settings = CoordinatorSettings.load(
        cluster_token=CLUSTER_TOKEN, api_key_hashes=TEST_API_KEY_SHA256, max_failed_keys=1_000_000
    )
    app = coordinator_app(Coordinator(settings=settings))
    with TestClient(app) as client:
        yield Service("coordinator", app, client, {"cluster": CLUSTER_TOKEN, "api_key": API_KEY})


@contextlib.contextmanager
def engine_sim_service() -> Iterator[Service]:
    """Rank 0 of a two-rank in-process engine simulator, configured with the cluster token."""
    cluster = FakeEngineCluster(dp_size=2, num_experts=4, num_redundant_experts=4, cluster_token=CLUSTER_TOKEN)
    app = engine_app(
        cluster.cores[0],
        model_name="heteroflow-sim-moe",
        ft_path_prefix=cluster.prefix,
        cluster_token=CLUSTER_TOKEN,
        max_tokens_limit=16,
    )
    with TestClient(app) as client:
        portal = client.portal
        assert portal is not None
        portal.call(cluster.start)
        try:
            yield Service("engine_sim", app, client, {"cluster": CLUSTER_TOKEN})
        finally:
            portal.call(cluster.close)
