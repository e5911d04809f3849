"""The five HTTP services of HeteroFlow, in process, one of each per test module."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from fastapi import FastAPI

from heteroflow.platform.auth import Scope
from tests.security.services import (
    Service,
    controller_service,
    coordinator_service,
    engine_sim_service,
    node_manager_service,
    platform_server,
)

_SETTINGS_PREFIXES = ("HETEROFLOW_", "GPU_HEALTH_", "GPU_METRICS_", "GPU_MEMORY_HIGH_", "GPU_WEAK_")

SERVICES = ["platform", "controller", "node_manager", "coordinator", "engine_sim"]
TENANT = "security-tenant"


@pytest.fixture(scope="module")
def _clean_settings_environment() -> Iterator[None]:
    """Module-scoped services load their settings before the per-test environment cleaning runs."""
    with pytest.MonkeyPatch.context() as patch:
        for name in list(os.environ):
            if name.startswith(_SETTINGS_PREFIXES):
                patch.delenv(name)
        yield


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory, _clean_settings_environment: None) -> Iterator[Service]:
    """The platform server with one tenant-less token per scope (``admin``, ``nodes:read`` …) and the same
    scopes bound to a tenant (``tenant:admin`` …)."""
    with platform_server(tmp_path_factory.mktemp("platform")) as harness:
        tokens = {scope.value: harness.token(scope.value) for scope in Scope}
        tokens |= {f"tenant:{scope.value}": harness.token(scope.value, tenant=TENANT) for scope in Scope}
        app = harness.client.app
        assert isinstance(app, FastAPI)
        yield Service("platform", app, harness.client, tokens)


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory, _clean_settings_environment: None) -> Iterator[Service]:
    with controller_service(tmp_path_factory.mktemp("controller")) as service:
        yield service


@pytest.fixture(scope="module")
def node_manager(_clean_settings_environment: None) -> Iterator[Service]:
    with node_manager_service() as service:
        yield service


@pytest.fixture(scope="module")
def coordinator(_clean_settings_environment: None) -> Iterator[Service]:
    with coordinator_service() as service:
        yield service


@pytest.fixture(scope="module")
def engine_sim(_clean_settings_environment: None) -> Iterator[Service]:
    with engine_sim_service() as service:
        yield service


@pytest.fixture(params=SERVICES)
def service(request: pytest.FixtureRequest) -> Service:
    """Each of the five services in turn."""
    found: Service = request.getfixturevalue(request.param)
    return found
