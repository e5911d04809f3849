"""Fixtures for the serving integration tests: a real etcd (the controller's production FtRuntimeStore)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from heteroflow.serving.controller.store.testing import EtcdServer, EtcdUnavailableError


def start_etcd() -> EtcdServer:
    """A started etcd; skips when the binary is missing here, fails when it is missing in CI."""
    try:
        server = EtcdServer()
    except EtcdUnavailableError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"etcd is required in CI: {exc}")
        pytest.skip(str(exc))
    try:
        server.start()
    except BaseException:
        server.close()
        raise
    return server


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One etcd for the session; tests isolate themselves by key prefix (:func:`etcd_prefix`)."""
    server = start_etcd()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def etcd_endpoint(etcd_server: EtcdServer) -> str:
    """The shared etcd's ``host:port``, started again if an earlier test left it stopped."""
    etcd_server.resume()
    etcd_server.start()
    return etcd_server.endpoint


@pytest.fixture
def etcd_prefix() -> str:
    """A key prefix no other test uses."""
    return f"/heteroflow-test/{uuid.uuid4().hex}/"


@pytest.fixture
def own_etcd_server() -> Iterator[EtcdServer]:
    """An etcd for this test alone: outage tests stop or freeze it without disturbing the shared one."""
    server = start_etcd()
    try:
        yield server
    finally:
        server.close()
