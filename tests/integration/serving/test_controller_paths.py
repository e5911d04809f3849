"""The controller's other paths over real NodeManagers and fake engines: idle service (A2), pod stops
(A5-A7), fast recovery (A8), feature off (A18), and the beyond-the-anchor guarantees F-51, F-52, F-54, F-57."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx

from heteroflow.contracts.engine_protocol import SCALE_ELASTIC_EP_PATH
from heteroflow.contracts.serving import (
    NM_ENGINES_RESTART_PATH,
    NM_FT_APPLY_PATH,
    NM_FT_FINALIZE_PATH,
    NM_FT_GUARD_PATH,
    NM_FT_PROBE_PATH,
    NM_FT_STATUS_PATH,
)
from heteroflow.engine_sim import conformance
from heteroflow.engine_sim.backend import FaultKind
from tests.integration.serving.controller_harness import Plane, loop_now, run_plane
from tests.integration.serving.test_controller_rounds import events, reconfiguring, scaled_down


def test_a2_idle_survivors_never_start_a_round_and_the_collection_times_out(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        ops_before = len(plane.coordinator.ops)
        plane.cluster.kill_worker(1)  # no traffic: the survivors never meet the fault and stay HEALTHY
        status = await plane.until(reconfiguring, within=15, what="collection timeout → reconfiguration")
        assert status["last_error"] == "COLLECTION_TIMEOUT"
        assert status["fallback_strategy"] == "InstanceReconfiguration"
        assert status["rounds"] == []  # no scale-down round ever started
        dels = [ids for op, ids in plane.coordinator.ops[ops_before:] if op == "DEL"]
        # the dead rank withdrawn at its first report, then only the fallback's withdrawal, never a round's
        assert dels[0] == [1]
        assert plane.coordinator.faulted[-1][0] == [1]
        assert dels[1:] in ([], [[0, 2, 3]])
        for nm in plane.node_managers.values():
            assert nm.service_state.owner is None  # never guarded

    run_plane(scenario, tmp_path)


def test_f54_nudged_idle_survivors_meet_the_fault_and_scale_down(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        plane.cluster.kill_worker(1)  # idle: only the nudge makes the survivors notice
        status = await plane.until(scaled_down([1]), within=15, what="the nudge leads to a round")
        assert status["alive_dp_ranks"] == [0, 2, 3]

    run_plane(scenario, tmp_path, ft={"nudge_idle_survivors": True})


def test_a5_a7_only_fully_committed_pods_are_stopped_once_with_scale_up(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.kill_and_traffic(1)
        first = await plane.until(scaled_down([1]), within=20, what="rank 1 committed")
        assert events(await plane.round(first["request_id"]), "pod_stop") == []  # A5: pod a still serves rank 0
        await plane.kill_and_traffic(0)
        second = await plane.until(scaled_down([0, 1]), within=20, what="pod a emptied")
        stops = events(await plane.round(second["request_id"]), "pod_stop")
        assert [(e["pod_id"], e["ok"]) for e in stops] == [("pod-a", True)]  # A7: once, and only pod a
        supervisor = plane.node_managers["a"].supervisor
        assert not supervisor.running(0)  # its engines were really stopped
        assert not supervisor.running(1)

    run_plane(scenario, tmp_path, ft={"enable_dp_scale_up": True})


def test_a6_a_fully_emptied_pod_is_kept_without_scale_up(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        await plane.kill_and_traffic(0, 1)
        status = await plane.until(scaled_down([0, 1]), within=20, what="pod a emptied")
        assert events(await plane.round(status["request_id"]), "pod_stop") == []

    run_plane(scenario, tmp_path)


def test_a18_feature_off_is_the_baseline(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        status = await plane.until(
            lambda s: s["published_endpoints"] == [0, 1, 2, 3], within=10, what="the baseline view is published"
        )
        assert status["phase"] == "DISABLED"
        assert status["can_serve"] is False  # F-40: can_serve is a scale-down notion; the view is still published
        assert plane.coordinator.published() == [0, 1, 2, 3]
        for name in plane.node_managers:
            response = await plane.nm_post(name, NM_FT_STATUS_PATH, {"endpoint_ids": [0]})
            assert response.status_code == 404
        await plane.kill_and_traffic(1)
        status = await plane.until(
            lambda s: s["engine_statuses"].get("1") == "dead", within=10, what="the controller heard of rank 1"
        )
        assert status["phase"] == "DISABLED"
        assert status["rounds"] == []

    run_plane(scenario, tmp_path, ft={"enable_dp_scale_down": False}, assembled=lambda s: s["phase"] == "DISABLED")


def test_f51_transient_query_errors_are_tolerated_up_to_the_limit(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        failures = 0

        async def one_unreachable_poll(pod: str, request: httpx.Request) -> httpx.Response | None:
            nonlocal failures
            if request.url.path == NM_FT_STATUS_PATH and pod == "b" and failures < 1 and plane.in_round():
                failures += 1
                raise httpx.ConnectError("injected", request=request)
            return None

        plane.hooks.append(one_unreachable_poll)
        await plane.kill_and_traffic(1)
        status = await plane.until(scaled_down([1]), within=20, what="the round survives one lost poll")
        timeline = await plane.round(status["request_id"])
        assert any("error:unreachable" in e["entries"].values() for e in events(timeline, "status_poll"))

    run_plane(scenario, tmp_path, ft={"max_transient_query_errors": 1})


def test_f52_a_failed_completion_probe_fails_the_round_before_commit(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        async def probe_fails(pod: str, request: httpx.Request) -> httpx.Response | None:
            if request.url.path == NM_FT_PROBE_PATH and pod == "b":
                body: dict[str, Any] = {
                    "request_id": "x",
                    "ok": False,
                    "results": [{"endpoint_id": 2, "ok": False, "detail": "injected: no completion"}],
                }
                return httpx.Response(200, json=body)
            return None

        plane.hooks.append(probe_fails)
        await plane.kill_and_traffic(1)
        status = await plane.until(reconfiguring, within=20, what="the probe failure fails the round")
        assert "completion probe of rank 2 failed" in (status["last_error"] or "")
        assert status["dead_committed"] == []
        timeline = await plane.round(status["rounds"][-1])
        assert [e["commit"] for e in events(timeline, "finalize")] == [False, False]  # aborted, never committed

    run_plane(scenario, tmp_path)


def test_f57_a_missed_commit_is_sent_again_and_a_lost_node_manager_reconfigures(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        attempts = {"b": 0}

        async def finalize_lost_once(pod: str, request: httpx.Request) -> httpx.Response | None:
            if request.url.path == NM_FT_FINALIZE_PATH and pod == "b" and b'"commit":true' in request.content:
                attempts["b"] += 1
                if attempts["b"] == 1:
                    raise httpx.ReadTimeout("injected", request=request)
            return None

        plane.hooks.append(finalize_lost_once)
        await plane.kill_and_traffic(1)
        status = await plane.until(scaled_down([1]), within=20, what="committed after a second finalize")
        timeline = await plane.round(status["request_id"])
        assert [e["pod_id"] for e in events(timeline, "finalize_failed")] == ["pod-b"]
        assert {e["pod_id"] for e in events(timeline, "finalize")} == {"pod-a", "pod-b"}
        assert plane.node_managers["b"].service_state.retired == {1}

        plane.hooks.clear()

        async def finalize_always_lost(pod: str, request: httpx.Request) -> httpx.Response | None:
            if request.url.path == NM_FT_FINALIZE_PATH and pod == "b" and b'"commit":true' in request.content:
                raise httpx.ConnectError("injected", request=request)
            return None

        plane.hooks.append(finalize_always_lost)
        await plane.kill_and_traffic(2)
        status = await plane.until(reconfiguring, within=20, what="a lost NodeManager at commit")
        assert "never acknowledged finalize(commit)" in (status["last_error"] or "")
        assert status["dead_committed"] == [1, 2]  # what the engines committed stays committed

    run_plane(scenario, tmp_path)


def test_a8_all_unhealthy_with_fast_recovery_retries_and_recovers(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        baseline = await conformance.outputs(plane.cluster, 0)
        plane.cluster.backends[3].inject(FaultKind.TRANSIENT)  # every rank unhealthy, nobody dead
        await conformance.traffic(plane.cluster, [0, 1, 2, 3])
        await plane.until(lambda s: s["running_strategy"] == "fast_recovery", within=10, what="fast recovery starts")
        status = await plane.until(
            lambda s: s["running_strategy"] is None and s["engine_statuses"] == {},
            within=20,
            what="fast recovery ends",
        )
        assert status["phase"] == "NORMAL"  # never a scale-down, never a reconfiguration
        assert status["rounds"] == []
        assert await conformance.outputs(plane.cluster, 0) == baseline
        timelines = (await plane.http.get("/controller/fault_tolerance/rounds")).json()
        [recovery] = [t for t in timelines if t["kind"] == "fast_recovery"]
        assert recovery["outcome"] == "succeeded"
        timeline = await plane.round(recovery["request_id"])
        assert {e["body"]["instruction"] for e in events(timeline, "apply")} == {"retry"}

    run_plane(scenario, tmp_path, ft={"enable_fast_recovery": True, "fast_recovery_stability_sec": 0.3})


def test_a8_a_failed_fast_recovery_reconfigures_and_never_scales_down(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        async def refuse_retry(pod: str, request: httpx.Request) -> httpx.Response | None:
            if request.url.path == NM_FT_APPLY_PATH:
                return httpx.Response(502, json={"error": "apply_rejected", "detail": "injected"})
            return None

        plane.hooks.append(refuse_retry)
        plane.cluster.backends[3].inject(FaultKind.TRANSIENT)
        await conformance.traffic(plane.cluster, [0, 1, 2, 3])
        status = await plane.until(reconfiguring, within=20, what="reconfiguration after the failed retry")
        assert status["fallback_strategy"] == "InstanceReconfiguration"
        assert status["rounds"] == []  # no scale-down round

    run_plane(scenario, tmp_path, ft={"enable_fast_recovery": True, "fast_recovery_stability_sec": 0.3})


def test_a8_no_fast_recovery_of_a_world_elastic_ep_resized_the_fallback_relaunches_it(tmp_path: Path) -> None:
    """vLLM 0.34 plans a ``retry`` over the ranks its engines were launched with, as a ``scale_down``: after an
    elastic EP resize outside HeteroFlow (here one that failed after asking for 2 ranks, which leaves the world
    unknown) no retry is sent; the fast recovery fails at once and the whole-instance relaunch follows."""

    async def scenario(plane: Plane) -> None:
        resize = await plane.cluster.client(0).post(SCALE_ELASTIC_EP_PATH, json={"new_data_parallel_size": 2})
        assert resize.status_code == 500, resize.text
        await plane.until(
            lambda s: any(r["elastic_ep_resized"] for pod in s["pods"] for r in pod["ranks"]),
            within=10,
            what="rank 0 marked resized",
        )
        plane.cluster.backends[3].inject(FaultKind.TRANSIENT)  # every rank unhealthy, nobody dead
        await conformance.traffic(plane.cluster, [0, 1, 2, 3])
        status = await plane.until(reconfiguring, within=20, what="reconfiguration instead of a retry")
        assert status["fallback_strategy"] == "InstanceReconfiguration"
        assert status["rounds"] == []  # no scale-down round either
        timelines = (await plane.http.get("/controller/fault_tolerance/rounds")).json()
        [recovery] = [t for t in timelines if t["kind"] == "fast_recovery"]
        assert recovery["outcome"] == "failed"
        timeline = await plane.round(recovery["request_id"])
        assert "elastic EP resized the world of ranks [0]" in events(timeline, "failed")[0]["error"]
        assert not events(timeline, "apply")  # no retry reached any engine

    run_plane(
        scenario,
        tmp_path,
        ft={"enable_fast_recovery": True, "fast_recovery_stability_sec": 0.3},
        elastic_ep=True,
        spec_extra={"enable_elastic_ep": True},
    )


def test_the_controller_collects_missing_evidence_instead_of_waiting_for_the_pollers(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        # the NodeManagers' own pollers are slowed to a minute: only the process death (ProcessSupervisor,
        # 0.1 s) arrives by itself; the survivors' UNHEALTHY can only come from the controller's collection
        plane.cluster.backends[1].inject(FaultKind.KILL_PROCESS)
        plane.cluster.cores[1].exit_requested.set()  # the process is gone: its port refuses, its pid exited
        await conformance.traffic(plane.cluster, [0, 2, 3])
        status = await plane.until(scaled_down([1]), within=10, what="a round from collected evidence")
        timeline = await plane.round(status["request_id"])
        assert events(timeline, "decided")[0]["survivors"] == [0, 2, 3]

    run_plane(scenario, tmp_path, node_manager_poll_sec=60.0)


def test_f58_a_refused_lease_renewal_fails_the_round_before_commit(tmp_path: Path) -> None:
    """The guard is renewed every third of its lease while the round runs (8.2 s lease with these timings:
    2 x 1 s deadlines + 3 x 2 s requests + 2 x 0.1 s polls, so a renewal 2.7 s in). Pod b's NodeManager is slow
    (its apply answers 1.2 s late) and refuses the renewal; its probe is held until that refusal."""

    async def scenario(plane: Plane) -> None:
        guards = {"a": 0, "b": 0}
        refused = asyncio.Event()

        async def slow_pod_b(pod: str, request: httpx.Request) -> httpx.Response | None:
            if request.url.path == NM_FT_GUARD_PATH:
                guards[pod] += 1
                if pod == "b" and guards[pod] > 1:
                    refused.set()
                    return httpx.Response(503, json={"error": "unavailable", "detail": "injected: renewal refused"})
            elif pod == "b" and request.url.path == NM_FT_APPLY_PATH:
                await asyncio.sleep(1.2)  # the injected fault: a slow NodeManager (below the 2 s request timeout)
            elif pod == "b" and request.url.path == NM_FT_PROBE_PATH:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(refused.wait(), timeout=1.5)
            return None

        plane.hooks.append(slow_pod_b)
        await plane.kill_and_traffic(1)
        status = await plane.until(reconfiguring, within=30, what="the refused renewal fails the round")
        assert refused.is_set()
        assert "lease renewal failed on pod pod-b" in (status["last_error"] or "")
        assert status["dead_committed"] == []  # never committed
        timeline = await plane.round(status["request_id"])
        assert {e["pod_id"] for e in events(timeline, "guard_renewal_failed")} == {"pod-b"}
        finalized = events(timeline, "finalize")
        assert sorted({e["pod_id"] for e in finalized}) == ["pod-a", "pod-b"]
        assert all(e["commit"] is False for e in finalized)  # aborted everywhere
        assert guards["a"] >= 2  # pod a's renewal went through: only b refused

    run_plane(
        scenario,
        tmp_path,
        ft={"execution_deadline_sec": 1.0, "request_timeout_sec": 2.0, "poll_interval_sec": 0.1},
    )


def test_fallbacks_converge_bounded_attempts_then_intervention_required(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        restarts: list[float] = []

        async def refuse(pod: str, request: httpx.Request) -> httpx.Response | None:
            if request.url.path == NM_FT_APPLY_PATH:
                return httpx.Response(502, json={"error": "apply_rejected", "detail": "injected"})
            if request.url.path == NM_ENGINES_RESTART_PATH:
                restarts.append(loop_now())
                return httpx.Response(503, json={"error": "unavailable", "detail": "injected: the card is gone"})
            return None

        plane.hooks.append(refuse)
        plane.cluster.backends[3].inject(FaultKind.TRANSIENT)
        await conformance.traffic(plane.cluster, [0, 1, 2, 3])
        status = await plane.until(
            lambda s: bool(s.get("intervention_required")), within=30, what="INTERVENTION_REQUIRED"
        )
        assert status["phase"] == "RECONFIGURING"
        assert status["intervention_required"].startswith("INTERVENTION_REQUIRED: 2 whole-instance relaunches")
        assert status["last_error"] == status["intervention_required"]
        attempts = len(restarts)
        assert attempts >= 2  # one restart call per pod and attempt, two attempts
        metrics = plane.controller.metrics.render().decode()
        assert 'heteroflow_controller_intervention_required{instance_id="inst-1"} 1.0' in metrics
        # it stays there: no further relaunch is attempted
        deadline = loop_now() + 2.5
        while loop_now() < deadline:
            assert len(restarts) == attempts
            await asyncio.sleep(0.1)  # watching for a relaunch that must not come

    run_plane(
        scenario,
        tmp_path,
        ft={
            "enable_fast_recovery": True,
            "fast_recovery_stability_sec": 0.3,
            "fallback_max_attempts": 2,
            "fallback_attempt_window_sec": 600,
        },
    )
