"""Two ``heteroflow controller`` processes on one real etcd, active/standby (``docs/controller.md``).

Only the lease holder acts; the standby answers ``503 not_leader`` and is not ready. When the leader dies, the
standby takes over within the lease TTL (plus a poll and the NodeManagers' re-registration), restores from the
persisted runtime, and: a committed instance stays SCALED_DOWN_RUNNING with nothing re-applied or relaunched; a
round in flight becomes RECONFIGURING with its fallback, never a replayed apply.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from heteroflow.cli.controller import leader_election
from heteroflow.core.clock import SystemClock
from heteroflow.serving.controller.config import ControllerSettings
from heteroflow.serving.controller.crash_hook import CRASH_EXIT_CODE
from heteroflow.serving.controller.store import EtcdFtRuntimeStore, SqliteFtRuntimeStore
from tests.integration.serving.controller_harness import ProcessPlane, run_process_plane

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

TTL = 2
TAKEOVER_SLACK_SEC = 4.0
"""Beyond the TTL: the standby's poll, its start (loading the runtimes) and the NodeManagers' re-registration."""


async def leadership(plane: ProcessPlane, index: int) -> dict[str, Any] | None:
    response = await plane.get("/controller/leadership", index=index)
    return None if response is None else dict(response.json())


async def until_standby(plane: ProcessPlane, index: int, *, leader: str) -> None:
    start = time.monotonic()
    while True:
        found = await leadership(plane, index)
        if found is not None and found["role"] == "standby" and found["leader_id"] == leader:
            return
        if time.monotonic() - start > 30:
            raise TimeoutError(f"controller {index} is not a standby of {leader}: {found}")
        await asyncio.sleep(0.05)


async def assert_standby_refuses(plane: ProcessPlane, index: int, *, leader_url: str) -> None:
    ready = await plane.get("/ready", index=index)
    assert ready is not None
    assert ready.status_code == 503
    refused = await plane.get("/controller/fault_tolerance/status", index=index)
    assert refused is not None
    assert refused.status_code == 503
    assert refused.json()["error"] == "not_leader"
    assert leader_url in refused.json()["detail"]


def test_leader_killed_while_idle_standby_takes_over_and_serving_does_not_change(
    tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    async def scenario(plane: ProcessPlane) -> None:
        plane.start_controller(index=0)
        await plane.until(lambda s: s["phase"] == "NORMAL", within=30, what="the leader assembles the instance")
        plane.start_controller(index=1)
        await until_standby(plane, 1, leader="controller-0")
        await assert_standby_refuses(plane, 1, leader_url=plane.url_of(0))
        ready = await plane.get("/ready", index=0)
        assert ready is not None
        assert ready.status_code == 200

        await plane.kill_and_traffic(1)
        committed = await plane.until(
            lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["dead_committed"] == [1],
            within=30,
            what="the leader commits rank 1 dead",
        )
        applies = list(plane.applies)
        launched = {pod: len(launcher.launched) for pod, launcher in plane.launchers.items()}
        retired = {pod: nm.service_state.retired for pod, nm in plane.node_managers.items()}
        assert frozenset({1}) in retired.values()

        plane.stop_controller(0)
        killed = time.monotonic()
        status = await plane.until(
            lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and "generation" in s,  # assembled again
            within=TTL + 30,
            what="the standby takes over with the committed runtime",
            index=1,
        )
        took = time.monotonic() - killed
        assert took <= TTL + TAKEOVER_SLACK_SEC, took
        assert status["dead_committed"] == [1]
        assert status["generation"] == committed["generation"]
        assert "controller.runtime_restored" in plane.controller_log(1)
        ready = await plane.get("/ready", index=1)
        assert ready is not None
        assert ready.status_code == 200
        # nothing re-applied, no engine relaunched: serving went on as it was
        assert plane.applies == applies
        assert {pod: len(launcher.launched) for pod, launcher in plane.launchers.items()} == launched
        assert {pod: nm.service_state.retired for pod, nm in plane.node_managers.items()} == retired

    run_process_plane(
        scenario,
        tmp_path,
        store_url=f"etcd://{etcd_endpoint}?prefix={etcd_prefix}",
        controllers=2,
        controller_settings={"lease_ttl_sec": TTL},
    )


def test_leader_killed_mid_round_standby_falls_back_and_never_applies_again(
    tmp_path: Path, etcd_endpoint: str, etcd_prefix: str
) -> None:
    async def scenario(plane: ProcessPlane) -> None:
        plane.start_controller(index=0, crash_at="after_apply")  # the leader dies right after its apply
        await plane.until(lambda s: s["phase"] == "NORMAL", within=30, what="the leader assembles the instance")
        plane.start_controller(index=1)
        await until_standby(plane, 1, leader="controller-0")

        await plane.kill_and_traffic(1)
        assert await plane.exited(within=30, index=0) == CRASH_EXIT_CODE, plane.controller_log(0)
        died = time.monotonic()
        applied = list(plane.applies)
        assert len(applied) == 2  # one round, applied at both pods
        round_id = applied[0][1]

        status = await plane.until(
            lambda s: s["phase"] == "RECONFIGURING" and "generation" in s,
            within=TTL + 30,
            what="the standby takes over and falls back",
            index=1,
        )
        assert time.monotonic() - died <= TTL + TAKEOVER_SLACK_SEC
        assert status["fallback_strategy"] == "InstanceReconfiguration"
        assert status["pending_removed_ranks"] == []
        await plane.until(
            lambda s: all(len(launcher.launched) >= 4 for launcher in plane.launchers.values()),
            within=30,
            what="the fallback relaunches the engines",
            index=1,
        )
        for nm in plane.node_managers.values():
            assert nm.service_state.retired == frozenset()
        assert plane.applies == applied  # the new leader never applies the old round again
        assert {rid for _, rid in plane.applies} == {round_id}

    run_process_plane(
        scenario,
        tmp_path,
        store_url=f"etcd://{etcd_endpoint}?prefix={etcd_prefix}",
        controllers=2,
        controller_settings={"lease_ttl_sec": TTL},
    )


def test_leader_election_is_on_for_etcd_and_refused_on_the_embedded_store(tmp_path: Path) -> None:
    clock = SystemClock()
    sqlite = SqliteFtRuntimeStore(tmp_path / "ft.db", timeout_sec=1.0)
    assert leader_election(ControllerSettings.load(), sqlite, clock=clock) is None
    with pytest.raises(ValueError, match="single-controller"):
        leader_election(ControllerSettings.load(leader_election=True), sqlite, clock=clock)

    etcd = EtcdFtRuntimeStore("127.0.0.1:2379", prefix="/hf/ft/runtime/", timeout_sec=1.0)
    election = leader_election(ControllerSettings.load(controller_id="c-1", lease_ttl_sec=5), etcd, clock=clock)
    assert election is not None
    assert election.key == "/hf/ft/runtime-leader"  # beside the runtimes, never read as one
    assert election.claim.controller_id == "c-1"
    assert election.ttl_sec == 5
    assert leader_election(ControllerSettings.load(leader_election=False), etcd, clock=clock) is None
