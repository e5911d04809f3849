"""The FtRuntimeStore on a real etcd that stops in the middle of a round (F-50, F-27).

Before commit a failed write-ahead aborts the round before apply (fail safe). After commit nothing rolls back:
the instance stays SCALED_DOWN_RUNNING with ``last_error``, the persist is retried, and the controller
recovers on its own when etcd returns: the next fault then gets a normal round (write-ahead, one apply per pod,
commit persisted).
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from heteroflow.contracts.serving import NM_FT_FINALIZE_PATH, NM_FT_STATUS_PATH
from heteroflow.serving.controller.core.ranks import InstanceId
from heteroflow.serving.controller.store import EtcdFtRuntimeStore
from heteroflow.serving.controller.store.testing import EtcdServer
from tests.integration.serving.controller_harness import Plane, run_plane
from tests.integration.serving.test_controller_rounds import events, reconfiguring
from tests.support.polling import eventually

pytestmark = pytest.mark.timeout(90)


async def stored(etcd: EtcdServer, prefix: str) -> dict[str, object]:
    """What a fresh store object reads back (what a restarted controller would restore)."""
    store = EtcdFtRuntimeStore(etcd.endpoint, prefix=prefix, timeout_sec=2.0)
    try:
        found = await store.load(InstanceId("inst-1"))
    finally:
        await store.close()
    assert found is not None
    record = found.record
    return {"phase": record.phase.value, "dead_committed": sorted(record.dead_committed)}


def test_etcd_down_before_apply_fails_the_round_safely(
    tmp_path: Path, own_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    etcd, prefix = own_etcd_server, etcd_prefix

    async def scenario(plane: Plane) -> None:
        stopped = False

        async def stop_etcd_at_first_poll(pod: str, request: httpx.Request) -> httpx.Response | None:
            nonlocal stopped
            if request.url.path == NM_FT_STATUS_PATH and not stopped and plane.in_round():
                stopped = True
                etcd.stop()  # the write-ahead before apply will find no store
            return None

        plane.hooks.append(stop_etcd_at_first_poll)
        await plane.kill_and_traffic(1)
        status = await plane.until(reconfiguring, within=20, what="the round fails safe")
        timeline = await plane.round(status["rounds"][-1])
        assert events(timeline, "apply") == []  # nothing was dispatched to an engine
        assert "write-ahead (before apply) failed" in (status["last_error"] or "")
        assert status["persist_pending"] is True
        assert status["store_error"]
        assert {e["pod_id"] for e in events(timeline, "finalize") if not e["commit"]} == {"pod-a", "pod-b"}
        etcd.start()
        status = await plane.until(
            lambda s: not s["persist_pending"] and s["store_error"] is None, within=20, what="the store is caught up"
        )
        assert (await stored(etcd, prefix))["phase"] == "RECONFIGURING"

    run_plane(
        scenario,
        tmp_path,
        store=lambda: EtcdFtRuntimeStore(etcd.endpoint, prefix=prefix, timeout_sec=1.0),
        virtual_time=False,  # etcd answers over a socket: its timeouts are real time
    )


def test_etcd_down_after_commit_keeps_the_scale_down_and_recovers(
    tmp_path: Path, own_etcd_server: EtcdServer, etcd_prefix: str
) -> None:
    etcd, prefix = own_etcd_server, etcd_prefix

    async def scenario(plane: Plane) -> None:
        stopped = False

        async def stop_etcd_at_commit(pod: str, request: httpx.Request) -> httpx.Response | None:
            nonlocal stopped
            if request.url.path == NM_FT_FINALIZE_PATH and b'"commit":true' in request.content and not stopped:
                stopped = True
                etcd.stop()
            return None

        plane.hooks.append(stop_etcd_at_commit)
        await plane.kill_and_traffic(1)
        status = await plane.until(
            lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["last_error"] is not None,
            within=20,
            what="committed with the store down",
        )
        assert status["dead_committed"] == [1]
        assert "persist after commit failed" in status["last_error"]
        assert status["persist_pending"] is True
        # serving goes on: the survivors, withdrawn while they reported unhealthy, are published again after the
        # commit (the SET may land just after the status shows the commit)
        await eventually(
            lambda: plane.coordinator.published() == [0, 2, 3], within=10, what="the survivors published again"
        )
        etcd.start()
        status = await plane.until(
            lambda s: not s["persist_pending"] and s["last_error"] is None, within=20, what="the retried persist"
        )
        assert status["phase"] == "SCALED_DOWN_RUNNING"
        assert await stored(etcd, prefix) == {"phase": "SCALED_DOWN_RUNNING", "dead_committed": [1]}

        # recovered: the next fault gets a normal round, its write-ahead and commit land in etcd
        rounds_before = len(status["rounds"])
        await plane.kill_and_traffic(2)
        status = await plane.until(
            lambda s: s["phase"] == "SCALED_DOWN_RUNNING" and s["dead_committed"] == [1, 2] and s["can_serve"],
            within=20,
            what="a normal second round",
        )
        assert len(status["rounds"]) == rounds_before + 1
        assert status["last_error"] is None
        assert status["persist_pending"] is False
        assert status["store_error"] is None
        timeline = await plane.round(status["rounds"][-1])
        assert sorted(e["pod_id"] for e in events(timeline, "apply")) == ["pod-a", "pod-b"]  # once per pod
        assert {e["pod_id"] for e in events(timeline, "finalize") if e["commit"]} == {"pod-a", "pod-b"}
        await eventually(lambda: plane.coordinator.published() == [0, 3], within=10, what="the survivors published")
        assert await stored(etcd, prefix) == {"phase": "SCALED_DOWN_RUNNING", "dead_committed": [1, 2]}

    run_plane(
        scenario,
        tmp_path,
        store=lambda: EtcdFtRuntimeStore(etcd.endpoint, prefix=prefix, timeout_sec=1.0),
        virtual_time=False,  # etcd answers over a socket: its timeouts are real time
    )
