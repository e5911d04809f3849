"""The NodeManager over the in-process fake instance: routes, rounds, reports, heartbeats (no sockets, no sleeps)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from heteroflow.contracts.serving import (
    NM_ENGINES_RESTART_PATH,
    NM_ENGINES_START_PATH,
    NM_ENGINES_STOP_PATH,
    NM_FT_APPLY_PATH,
    NM_FT_FINALIZE_PATH,
    NM_FT_GUARD_PATH,
    NM_FT_NUDGE_PATH,
    NM_FT_PROBE_PATH,
    NM_FT_STATUS_PATH,
    NM_STATUS_PATH,
    FaultEvidence,
    FtFlags,
    FtStatusRequest,
    HeartbeatRequest,
    RegisterRequest,
)
from heteroflow.engine_sim import conformance
from heteroflow.serving.node_manager.client import (
    ControllerRejectedError,
    ControllerUnavailableError,
    HttpControllerClient,
)
from heteroflow.serving.node_manager.engines import HttpEngineClient
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN, FakeController

from .harness import STORE_PORT, Harness, instance_spec, make_node_manager, run_instance

FT_ROUTES = [NM_FT_STATUS_PATH, NM_FT_APPLY_PATH, NM_FT_GUARD_PATH, NM_FT_FINALIZE_PATH]


async def guard(h: Harness, request_id: str, *, lease: float = 60.0, pods: str = "ab") -> None:
    for name in pods:
        response = await h.pods[name].post(NM_FT_GUARD_PATH, {"request_id": request_id, "lease_sec": lease})
        assert response.status_code == 200, response.text


async def statuses(h: Harness) -> dict[int, dict[str, Any]]:
    found: dict[int, dict[str, Any]] = {}
    for name, pod in h.pods.items():
        ids = sorted(pod.nm.spec.endpoint_ids - pod.nm.service_state.retired)
        if not ids:
            continue
        response = await pod.post(NM_FT_STATUS_PATH, {"endpoint_ids": ids})
        assert response.status_code == 200, (name, response.text)
        for entry in response.json()["entries"]:
            found[entry["endpoint_id"]] = entry
    return found


async def kill_rank_and_make_survivors_unhealthy(h: Harness, victim: int) -> None:
    h.cluster.kill_worker(victim)
    await h.traffic([r for r in range(4) if r != victim])


# == proxy off: the baseline =================================================================================
def test_proxy_off_routes_are_404_and_heartbeats_need_the_complete_set() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        for path in [*FT_ROUTES, NM_FT_PROBE_PATH, NM_FT_NUDGE_PATH]:
            bodies: tuple[object, ...] = ({"request_id": "r", "lease_sec": 5}, {"garbage": True}, [])
            for body in bodies:
                response = await pod.post(path, body)
                assert response.status_code == 404, (path, response.text)
        await pod.nm.controller_once()
        assert h.controller.heartbeats[-1].complete
        assert h.controller.heartbeats[-1].request.endpoint_ids == [0, 1]
        # an engine that dies leaves the set incomplete: the controller's baseline takes over
        pod.launcher.current(1).kill_worker()
        h.cluster.kill_worker(1)
        await pod.nm.supervise_once()
        await pod.nm.controller_once()
        beat = h.controller.heartbeats[-1]
        assert beat.request.endpoint_ids == [0]
        assert not beat.complete
        assert [r.evidence for r in h.controller.reports_for(1)] == [FaultEvidence.ENGINE_DEAD]

    run_instance(scenario, flags=FtFlags(enable_dp_scale_down_proxy=False))


def test_routes_are_404_until_the_controller_registered_us() -> None:
    async def scenario(h: Harness) -> None:
        response = await h.pods["a"].post(NM_FT_GUARD_PATH, {"request_id": "r", "lease_sec": 5})
        assert response.status_code == 404
        await h.pods["a"].nm.controller_once()
        response = await h.pods["a"].post(NM_FT_GUARD_PATH, {"request_id": "r", "lease_sec": 5})
        assert response.status_code == 200

    run_instance(scenario, register=False)


def test_registration_carries_capability_and_endpoints() -> None:
    async def scenario(h: Harness) -> None:
        reg = {r.pod_id: r for r in h.controller.registrations}
        assert [e.id for e in reg["pod-a"].endpoints] == [0, 1]
        assert [e.port for e in reg["pod-b"].endpoints] == [8102, 8103]
        cap = reg["pod-a"].ft_capability
        assert cap == reg["pod-b"].ft_capability
        assert cap.engine_ft_enabled
        assert cap.scale_down_supported
        assert cap.external_lb
        assert cap.eplb_enabled
        assert not cap.auto_recovery_enabled
        assert cap.num_redundant_experts == 4
        assert cap.slots_per_rank == 2

    run_instance(scenario)


def test_every_internal_route_needs_the_cluster_token() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        for token in (None, "wrong"):
            for path in [*FT_ROUTES, NM_ENGINES_STOP_PATH]:
                response = await pod.post(path, {}, token=token)
                assert response.status_code == 401, path
            response = await pod.http.get(NM_STATUS_PATH, headers={"Authorization": f"Bearer {token}"})
            assert response.status_code == 401
        assert (await pod.http.get("/health")).status_code == 200

    run_instance(scenario)


@pytest.mark.parametrize(
    ("path", "body", "status", "fragment"),
    [
        (NM_FT_GUARD_PATH, {"request_id": "r", "lease_sec": 0}, 400, "lease_sec"),
        (NM_FT_GUARD_PATH, {"request_id": "r", "lease_sec": 3600.5}, 400, "lease_sec"),
        (NM_FT_GUARD_PATH, {"request_id": "", "lease_sec": 5}, 400, "request_id"),
        (NM_FT_GUARD_PATH, [1], 400, "object"),
        (NM_FT_STATUS_PATH, {"endpoint_ids": [2]}, 400, "not on pod"),
        (NM_FT_STATUS_PATH, {"endpoint_ids": "0"}, 400, "endpoint_ids"),
        (NM_FT_APPLY_PATH, {"instruction": "scale_up", "request_id": "r"}, 400, "unsupported"),
        (NM_FT_APPLY_PATH, {"instruction": "retry", "request_id": "r"}, 400, "fast_recovery"),
        (NM_FT_APPLY_PATH, {"instruction": "scale_down", "request_id": "r"}, 409, "guard first"),
        (NM_FT_FINALIZE_PATH, {"request_id": "r", "commit": True}, 502, "stale"),
        (NM_FT_FINALIZE_PATH, {"request_id": "r", "commit": 1}, 400, "commit"),
    ],
)
def test_bad_commands_get_a_4xx_or_502_with_a_message(path: str, body: object, status: int, fragment: str) -> None:
    async def scenario(h: Harness) -> None:
        response = await h.pods["a"].post(path, body)
        assert response.status_code == status, response.text
        assert fragment in response.json()["detail"]

    run_instance(scenario)


def test_bad_json_is_a_400() -> None:
    async def scenario(h: Harness) -> None:
        response = await h.pods["a"].http.post(
            NM_FT_GUARD_PATH, content=b"{nope", headers={"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}
        )
        assert response.status_code == 400
        assert "JSON" in response.json()["detail"]

    run_instance(scenario)


@pytest.mark.parametrize(
    ("raw", "status", "fragment"),
    [
        (b"[" * 10_000 + b"]" * 10_000, 400, "nested deeper"),  # a RecursionError, a 500, before the limit
        (b'{"a": ' * 40 + b"1" + b"}" * 40, 400, "nested deeper"),
        (b'{"request_id": "r", "lease_sec": 5, "pad": "' + b"a" * (1 << 20) + b'"}', 413, "larger than"),
        (b'{"request_id": "\xff", "lease_sec": 5}', 400, "not JSON"),
    ],
)
def test_bodies_too_deep_too_large_or_not_text_are_a_4xx(raw: bytes, status: int, fragment: str) -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        headers = {"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"}
        response = await pod.http.post(NM_FT_GUARD_PATH, content=raw, headers=headers)
        assert response.status_code == status, response.text
        assert fragment in response.json()["detail"]
        assert (await pod.http.get("/health")).status_code == 200

    run_instance(scenario)


# == F-1: the poller ===========================================================================================
def test_poller_reports_dead_and_unhealthy_once_each() -> None:
    async def scenario(h: Harness) -> None:
        assert h.controller.reports == []  # healthy engines: nothing to report
        await kill_rank_and_make_survivors_unhealthy(h, 1)
        for _ in range(3):
            await h.poll_all()
        by_rank = {r: [(x.status, x.evidence) for x in h.controller.reports_for(r)] for r in range(4)}
        assert by_rank[1] == [("dead", FaultEvidence.FT_STATUS)]
        for survivor in (0, 2, 3):
            assert by_rank[survivor] == [("unhealthy", FaultEvidence.FT_STATUS)]
        report = h.controller.reports_for(0)[0]
        assert report.engine_status is not None
        assert report.engine_status.id == 0
        assert report.identity is not None
        assert report.pod_id == "pod-a"
        assert report.instance_id == "inst-1"

    run_instance(scenario)


def test_unreachable_status_after_readiness_is_dead_evidence() -> None:
    async def scenario(h: Harness) -> None:
        h.cluster.cores[3].exit_requested.set()  # the port refuses connections; the process 'lives'
        await h.poll_all()
        await h.poll_all()
        reports = h.controller.reports_for(3)
        assert [(r.status, r.evidence) for r in reports] == [("dead", FaultEvidence.FT_UNREACHABLE)]
        endpoint = h.pods["b"].nm.status().endpoints[1]
        assert endpoint.dead_by_unreachability
        assert endpoint.ft_status == "dead"

    run_instance(scenario)


def test_id_mismatch_and_duplicates_are_protocol_errors_never_healthy() -> None:
    async def scenario(h: Harness) -> None:
        # endpoint 1 pointed at engine 2's API server: the answer carries id 2
        nm, _ = make_node_manager(h.cluster, h.controller, (1,), name="x", client_for=lambda _: h.cluster.client(2))
        await nm.start(loops=False)
        await nm.controller_once()
        assert await nm.check_ready(1)
        finding = await nm.poll_once(1)
        assert finding is not None
        assert finding.status == "protocol_error"
        assert "exactly engine 1" in finding.detail
        answer = await nm.ft_status(FtStatusRequest(endpoint_ids=[1]))
        assert answer.entries[0].status is None
        assert answer.entries[0].error == "protocol_error"
        await nm.close()

        def duplicate(request: httpx.Request) -> httpx.Response:
            engines = [{"id": 1, "status": "healthy"}, {"id": 1, "status": "healthy"}]
            return httpx.Response(200, json={"schema_version": 1, "total_engines": 2, "engines": engines})

        dup = httpx.AsyncClient(transport=httpx.MockTransport(duplicate), base_url="http://dup")
        nm2, _ = make_node_manager(h.cluster, h.controller, (1,), name="y", client_for=lambda _: dup)
        await nm2.start(loops=False)
        await nm2.controller_once()
        nm2.supervisor.mark_ready(1)
        finding = await nm2.poll_once(1)
        assert finding is not None
        assert finding.status == "protocol_error"
        assert nm2.status().endpoints[0].ft_status == "protocol_error"
        await nm2.close()
        await dup.aclose()
        reports = [r for r in h.controller.reports if r.pod_id in ("pod-x", "pod-y")]
        assert [r.evidence for r in reports] == [FaultEvidence.FT_PROTOCOL_ERROR] * 2

    run_instance(scenario)


# == F-2: process deaths and the suicide handling ===========================================================
def test_engine_death_is_reported_at_once_and_suicide_waits_for_the_grace() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["b"]
        suicides: list[str] = []
        pod.nm._on_suicide = suicides.append  # the shell's hook; the default stops engines and exits 1
        pod.launcher.current(3).exit(137)
        exits = await pod.nm.supervise_once()
        assert [(e.endpoint_id, e.exit_code) for e in exits] == [(3, 137)]
        (report,) = h.controller.reports_for(3)
        assert report.evidence == FaultEvidence.ENGINE_DEAD
        assert report.exit_code == 137
        assert report.identity is not None
        assert report.identity.pid == pod.launcher.current(3).pid
        assert await pod.nm.supervise_once() == []  # once per incarnation
        h.cluster.clock.advance(59.0)
        await pod.nm.supervise_once()
        assert suicides == []
        assert not pod.nm.exit_requested.is_set()
        h.cluster.clock.advance(1.0)
        await pod.nm.supervise_once()
        assert len(suicides) == 1
        assert "[3]" in suicides[0]
        assert pod.nm.exit_requested.is_set()
        assert not pod.nm.supervisor.running(2)  # the pod's other engines were stopped too

    run_instance(scenario)


def test_a_worker_stopped_past_the_limit_is_reported_dead_and_its_engine_killed() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["b"]
        proc = pod.launcher.current(3)
        proc.worker_stopped = True
        assert await pod.nm.supervise_once() == []  # first seen stopped: the clock starts now
        h.cluster.clock.advance(2.9)
        assert await pod.nm.supervise_once() == []
        proc.worker_stopped = False  # resumed in time: nothing happened
        h.cluster.clock.advance(5.0)
        assert await pod.nm.supervise_once() == []
        proc.worker_stopped = True
        await pod.nm.supervise_once()
        h.cluster.clock.advance(1.5)
        assert await pod.nm.supervise_once() == []  # a resume restarted the count
        h.cluster.clock.advance(1.5)
        (death,) = await pod.nm.supervise_once()
        assert death.endpoint_id == 3
        assert "stopped for 3 s" in death.detail
        assert signal.SIGKILL in proc.signals  # the evidence made true
        (report,) = h.controller.reports_for(3)
        assert report.evidence == FaultEvidence.ENGINE_DEAD
        assert report.status == "dead"
        assert not pod.nm.supervisor.running(3)
        assert pod.nm.supervisor.running(2)
        assert h.controller.reports_for(2) == []

    run_instance(scenario)


def test_a_stopped_worker_is_left_alone_when_the_limit_is_off() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["b"]
        pod.launcher.current(3).worker_stopped = True
        await pod.nm.supervise_once()
        h.cluster.clock.advance(600.0)
        assert await pod.nm.supervise_once() == []
        assert pod.nm.supervisor.running(3)

    run_instance(scenario, settings={"engine_stopped_dead_sec": 0.0})


def test_the_guard_freezes_the_suicide_handling() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["b"]
        await guard(h, "round-1", lease=100.0, pods="b")
        pod.launcher.current(3).kill_worker()
        await pod.nm.supervise_once()
        h.cluster.clock.advance(99.0)
        await pod.nm.supervise_once()
        assert pod.nm.status().suicide_reason is None
        assert pod.nm.status().frozen
        # commit retires rank 3: its death is no longer ours to react to
        response = await pod.post(
            NM_FT_FINALIZE_PATH, {"request_id": "round-1", "commit": True, "retired_endpoint_ids": [3]}
        )
        assert response.status_code == 200
        h.cluster.clock.advance(500.0)
        await pod.nm.supervise_once()
        assert pod.nm.status().suicide_reason is None

    run_instance(scenario)


def test_a_full_rebuild_takes_over_a_retired_dead_engine_without_triggering_the_suicide() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["b"]
        await guard(h, "round-1", lease=100.0, pods="b")
        pod.launcher.current(3).kill_worker()
        await pod.nm.supervise_once()
        committed = await pod.post(
            NM_FT_FINALIZE_PATH, {"request_id": "round-1", "commit": True, "retired_endpoint_ids": [3]}
        )
        assert committed.status_code == 200
        h.cluster.clock.advance(500.0)  # rank 3 died long ago; retired, it does not count
        # the controller's fallback: a full rebuild un-retires rank 3 and restarts the pod's engines, whose stops
        # take a while (a hung engine uses its whole grace); the supervisor keeps checking meanwhile
        release, stopping = threading.Event(), threading.Event()
        stop = pod.nm.supervisor.stop

        def slow_stop(endpoint_id: int, *, grace_sec: float) -> bool:
            stopping.set()
            release.wait(timeout=10)
            return stop(endpoint_id, grace_sec=grace_sec)

        pod.nm.supervisor.stop = slow_stop  # type: ignore[method-assign]
        restart = asyncio.create_task(pod.post(NM_ENGINES_RESTART_PATH, {"retired_endpoint_ids": []}))
        try:
            assert await asyncio.to_thread(stopping.wait, 10)  # the restart is stopping the engines now
            await pod.nm.supervise_once()
            assert pod.nm.status().suicide_reason is None
        finally:
            release.set()
            answer = await restart
            pod.nm.supervisor.stop = stop  # type: ignore[method-assign]
        assert answer.json()["started_endpoint_ids"] == [2, 3]
        await pod.nm.supervise_once()
        assert pod.nm.status().suicide_reason is None
        assert not pod.nm.exit_requested.is_set()

    run_instance(scenario)


# == a whole round through the four routes ===================================================================
def test_scale_down_round_through_both_node_managers() -> None:
    async def scenario(h: Harness) -> None:
        baseline = await conformance.outputs(h.cluster, 0)
        await kill_rank_and_make_survivors_unhealthy(h, 1)
        await h.poll_all()
        await guard(h, "round-1")
        entries = await statuses(h)
        assert entries[1]["status"]["status"] == "dead"
        assert {r: entries[r]["status"]["status"] for r in (0, 2, 3)} == dict.fromkeys((0, 2, 3), "unhealthy")
        assert all(entries[r]["identity"]["pid"] > 0 for r in range(4))
        body = {
            "instruction": "scale_down",
            "request_id": "round-1",
            "params": {"removed_dp_ranks": [1], "dp_master_ip": "127.0.0.1"},
        }
        for name in "ab":
            response = await h.pods[name].post(NM_FT_APPLY_PATH, body)
            assert response.status_code == 202, response.text
            answer = response.json()
            assert answer["accepted"]
            assert {r["http_status"] for r in answer["results"]} == {202}
        assert [r["endpoint_id"] for r in answer["results"]] == [2, 3]
        again = await h.pods["a"].post(NM_FT_APPLY_PATH, body)
        assert again.status_code == 409  # apply is never sent twice

        async def healthy() -> bool:
            found = await statuses(h)
            return all(found[r]["status"]["status"] == "healthy" for r in (0, 2, 3))

        await h.cluster.eventually(healthy, within=5.0, what="survivors healthy")
        for name in "ab":
            commit = {"request_id": "round-1", "commit": True, "retired_endpoint_ids": [1]}
            response = await h.pods[name].post(NM_FT_FINALIZE_PATH, commit)
            assert response.status_code == 200
            assert response.json()["retired_endpoint_ids"] == [1]
            repeat = await h.pods[name].post(NM_FT_FINALIZE_PATH, commit)  # F-57: idempotent
            assert repeat.status_code == 200
            assert repeat.json()["repeated"]
            abort = await h.pods[name].post(NM_FT_FINALIZE_PATH, {"request_id": "round-1", "commit": False})
            assert abort.status_code == 502  # abort after commit refused
        assert await conformance.outputs(h.cluster, 0) == baseline
        # retired ids leave heartbeats, reports and process-death reports
        reports_before = len(h.controller.reports)
        for pod in h.pods.values():
            await pod.nm.controller_once()
        beat_a = next(b for b in reversed(h.controller.heartbeats) if b.request.pod_id == "pod-a")
        assert beat_a.request.endpoint_ids == [0]
        assert beat_a.request.retired_endpoint_ids == [1]
        assert beat_a.complete
        h.pods["a"].launcher.current(1).exit(1)
        await h.pods["a"].nm.supervise_once()
        await h.poll_all()
        assert len(h.controller.reports) == reports_before
        status = h.pods["a"].nm.status()
        assert status.retired == (1,)
        assert status.finalized_rounds == (("round-1", True),)
        assert not status.frozen

    run_instance(scenario)


def test_apply_fills_the_store_port_and_only_engine_defined_params() -> None:
    async def scenario(h: Harness) -> None:
        sent: list[dict[str, Any]] = []

        def engine(request: httpx.Request) -> httpx.Response:
            sent.append(json.loads(request.content))
            return httpx.Response(202, json={"message": "poll status", "request_id": "r"})

        mock = httpx.AsyncClient(transport=httpx.MockTransport(engine), base_url="http://engine")
        pod = h.pods["a"]
        original = pod.nm._engines
        pod.nm._engines = HttpEngineClient(lambda _: mock, ft_path_prefix="/v1")
        try:
            await guard(h, "r", pods="a")
            response = await pod.post(
                NM_FT_APPLY_PATH,
                {"instruction": "scale_down", "request_id": "r", "params": {"removed_dp_ranks": [3, 2]}},
            )
            assert response.status_code == 202
            assert (
                sent
                == [
                    {
                        "instruction": "scale_down",
                        "request_id": "r",
                        "params": {"removed_dp_ranks": [2, 3], "dp_store_port": STORE_PORT},
                    }
                ]
                * 2
            )
        finally:
            pod.nm._engines = original
            await mock.aclose()

    run_instance(scenario)


def test_apply_not_accepted_by_every_engine_is_a_502_with_each_result() -> None:
    async def scenario(h: Harness) -> None:
        await guard(h, "r", pods="a")
        # engines are healthy: they reject the command (202 + ft_error) … but an unreachable one fails
        h.cluster.cores[0].exit_requested.set()
        response = await h.pods["a"].post(
            NM_FT_APPLY_PATH,
            {"instruction": "scale_down", "request_id": "r", "params": {"removed_dp_ranks": [2]}},
        )
        assert response.status_code == 502
        results = {r["endpoint_id"]: r["http_status"] for r in response.json()["results"]}
        assert results == {0: None, 1: 202}

    run_instance(scenario)


def test_retry_only_with_fast_recovery() -> None:
    async def scenario(h: Harness) -> None:
        await guard(h, "r", pods="a")
        response = await h.pods["a"].post(NM_FT_APPLY_PATH, {"instruction": "retry", "request_id": "r"})
        assert response.status_code == 202, response.text
        assert response.json()["instruction"] == "retry"

    run_instance(scenario, flags=FtFlags(enable_dp_scale_down_proxy=True, enable_fast_recovery=True))


# == guard / finalize races through HTTP =====================================================================
def test_two_request_ids_racing_one_wins() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        answers = await asyncio.gather(
            *(pod.post(NM_FT_GUARD_PATH, {"request_id": rid, "lease_sec": 30}) for rid in ("x", "y", "x", "y"))
        )
        codes = [a.status_code for a in answers]
        winner = "x" if codes[0] == 200 else "y"
        assert sorted(codes) == [200, 200, 502, 502]
        assert pod.nm.status().guard_request_id == winner
        renewed = [a.json()["renewed"] for a in answers if a.status_code == 200]
        assert renewed == [False, True]
        assert "guarded by round" in next(a.json()["detail"] for a in answers if a.status_code == 502)

    run_instance(scenario)


def test_lease_expiry_lets_a_new_round_in_and_the_old_one_is_stale() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        await guard(h, "old", lease=10.0, pods="a")
        h.cluster.clock.advance(5.0)
        await guard(h, "old", lease=10.0, pods="a")  # renewal: now until t+15
        h.cluster.clock.advance(9.0)
        refused = await pod.post(NM_FT_GUARD_PATH, {"request_id": "new", "lease_sec": 10})
        assert refused.status_code == 502
        h.cluster.clock.advance(1.0)
        await guard(h, "new", lease=10.0, pods="a")
        for commit in (True, False):
            stale = await pod.post(NM_FT_FINALIZE_PATH, {"request_id": "old", "commit": commit})
            assert stale.status_code == 502
        status = pod.nm.status()
        assert status.guard_request_id == "new"
        assert status.frozen
        apply_old = await pod.post(NM_FT_APPLY_PATH, {"instruction": "scale_down", "request_id": "old"})
        assert apply_old.status_code == 502

    run_instance(scenario)


# == beyond the anchors ======================================================================================
def test_unreachable_dead_rank_is_fenced_at_apply() -> None:
    async def scenario(h: Harness) -> None:
        await kill_rank_and_make_survivors_unhealthy(h, 1)
        h.cluster.cores[1].exit_requested.set()  # … and its status route became unreachable
        await h.poll_all()
        assert h.pods["a"].nm.status().endpoints[1].dead_by_unreachability
        await guard(h, "r")
        response = await h.pods["a"].post(
            NM_FT_APPLY_PATH,
            {"instruction": "scale_down", "request_id": "r", "params": {"removed_dp_ranks": [1], "dp_master_ip": "h"}},
        )
        assert response.status_code == 202, response.text
        assert response.json()["fenced_endpoint_ids"] == [1]
        assert signal.SIGKILL in h.pods["a"].launcher.current(1).signals

    run_instance(scenario)


def test_retired_rank_that_answers_again_is_fenced_and_recorded() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["b"]
        await guard(h, "r", pods="b")
        await pod.post(NM_FT_FINALIZE_PATH, {"request_id": "r", "commit": True, "retired_endpoint_ids": [3]})
        violation = await pod.nm.watch_retired_once(3)  # engine 3 still answers "healthy"
        assert violation is not None
        assert violation.fenced
        assert "healthy" in violation.detail
        assert pod.nm.status().fencing_violations == (violation,)
        assert await pod.nm.watch_retired_once(3) is None  # fenced: silent now

    run_instance(scenario)


def test_probe_needs_the_guard_and_reports_identity() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        refused = await pod.post(NM_FT_PROBE_PATH, {"request_id": "r"})
        assert refused.status_code == 409
        await guard(h, "r", pods="a")
        response = await pod.post(NM_FT_PROBE_PATH, {"request_id": "r", "max_tokens": 2})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["ok"] for r in results] == [True, True]
        assert results[0]["identity"]["pid"] == pod.launcher.current(0).pid
        nudge = await pod.post(NM_FT_NUDGE_PATH, {"request_id": "n"})
        assert nudge.status_code == 400  # nudge_idle_survivors is off by default

    run_instance(scenario)


def test_nudge_sends_one_request_to_idle_survivors() -> None:
    async def scenario(h: Harness) -> None:
        h.cluster.kill_worker(3)
        await h.settle()
        response = await h.pods["a"].post(NM_FT_NUDGE_PATH, {"request_id": "n", "timeout_sec": 1})
        assert response.status_code == 200
        await h.poll_all()
        assert [r.status for r in h.controller.reports_for(0)] == ["unhealthy"]

    run_instance(scenario, flags=FtFlags(enable_dp_scale_down_proxy=True, nudge_idle_survivors=True))


def test_stop_start_and_restart_routes() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        stopped = await pod.post(NM_ENGINES_STOP_PATH, {"endpoint_ids": [1]})
        assert stopped.status_code == 200
        assert stopped.json()["stopped_endpoint_ids"] == [1]
        assert not pod.nm.supervisor.running(1)
        assert await pod.nm.supervise_once() == []  # a stop on request is not a death
        started = await pod.post(NM_ENGINES_START_PATH, {"retired_endpoint_ids": [1], "dp_master_ip": "127.0.0.9"})
        assert started.json() == {"stopped_endpoint_ids": [], "started_endpoint_ids": [], "retired_endpoint_ids": [1]}
        restarted = await pod.post(NM_ENGINES_RESTART_PATH, {"retired_endpoint_ids": []})
        assert restarted.json()["started_endpoint_ids"] == [0, 1]
        argv = list(pod.launcher.current(0).command.argv)
        assert argv[argv.index("--master-addr") + 1] == "127.0.0.9"
        assert "--dead-ranks" not in argv  # a full rebuild empties the retired set
        assert (await pod.post(NM_ENGINES_STOP_PATH, None)).json()["stopped_endpoint_ids"] == [0, 1]

    run_instance(scenario)


def test_a_restart_stops_the_pods_engines_all_at_once() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        # each stop waits until every engine of the pod is being stopped: stops one after another would break the
        # barrier (a hung engine uses its whole grace, which must not add up over the pod's engines)
        barrier = threading.Barrier(len(pod.nm.spec.endpoint_ids), timeout=5)
        stop = pod.nm.supervisor.stop

        def stop_together(endpoint_id: int, *, grace_sec: float) -> bool:
            barrier.wait()
            return stop(endpoint_id, grace_sec=grace_sec)

        pod.nm.supervisor.stop = stop_together  # type: ignore[method-assign]
        try:
            restarted = await pod.post(NM_ENGINES_RESTART_PATH, {"retired_endpoint_ids": []})
        finally:
            pod.nm.supervisor.stop = stop  # type: ignore[method-assign]
        assert restarted.status_code == 200
        assert restarted.json()["stopped_endpoint_ids"] == [0, 1]
        assert restarted.json()["started_endpoint_ids"] == [0, 1]

    run_instance(scenario)


def test_reports_wait_in_the_outbox_while_the_controller_is_down() -> None:
    async def scenario(h: Harness) -> None:
        h.controller.unavailable = True
        pod = h.pods["b"]
        pod.launcher.current(2).exit(9)
        await pod.nm.supervise_once()
        assert pod.nm.status().reports_pending == 1
        h.controller.unavailable = False
        await pod.nm.controller_once()
        assert pod.nm.status().reports_pending == 0
        assert [r.endpoint_id for r in h.controller.reports] == [2]

    run_instance(scenario)


# == the HTTP controller client against the fake controller's routes =========================================
def test_http_controller_client_speaks_the_fake_controllers_routes() -> None:
    async def main() -> None:
        controller = FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True), retired_on_register=[3])
        transport = httpx.ASGITransport(app=controller.app(cluster_token="tok"))
        client = HttpControllerClient("http://controller", cluster_token="tok", transport=transport)
        spec = instance_spec((0, 1))
        answer = await client.register(
            RegisterRequest(
                pod_id="p",
                pod_ip="127.0.0.1",
                node_manager_url="http://nm",
                instance_id=spec.instance_id,
                dp_size=4,
                endpoints=spec.endpoint_infos("127.0.0.1"),
                ft_capability=spec.capability(),
            )
        )
        assert answer.flags.enable_dp_scale_down_proxy
        assert answer.retired_endpoint_ids == [3]
        assert controller.registrations[0].endpoints[1].port == 8101
        bad = HttpControllerClient("http://controller", cluster_token="wrong", transport=transport)
        with pytest.raises(ControllerRejectedError, match="401"):
            await bad.register(controller.registrations[0])
        await client.aclose()
        await bad.aclose()

    asyncio.run(main())


class _Hosts(httpx.AsyncBaseTransport):
    """``down`` refuses connections, ``standby`` answers 503 not_leader, anything else is the fake controller."""

    def __init__(self, controller: httpx.AsyncBaseTransport) -> None:
        self.controller = controller
        self.hosts: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.hosts.append(request.url.host)
        if request.url.host == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.host == "standby":
            return httpx.Response(503, json={"error": "not_leader", "detail": "the leader is http://controller"})
        return await self.controller.handle_async_request(request)


def test_http_controller_client_moves_on_from_a_dead_or_standby_controller_and_stays_with_the_leader() -> None:
    async def main() -> None:
        controller = FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True))
        transport = _Hosts(httpx.ASGITransport(app=controller.app(cluster_token="tok")))
        client = HttpControllerClient(
            "http://down:8500, http://standby:8500,http://controller:8500/", cluster_token="tok", transport=transport
        )
        assert client.urls == ("http://down:8500", "http://standby:8500", "http://controller:8500")
        beat = HeartbeatRequest(
            pod_id="p", instance_id="i", endpoint_ids=[0, 1], expected_endpoint_ids=[0, 1], sent_at=datetime.now(UTC)
        )
        await client.heartbeat(beat)
        assert transport.hosts == ["down", "standby", "controller"]
        await client.heartbeat(beat)
        assert transport.hosts[3:] == ["controller"]  # it stays with the one that answered
        assert client.current_url == "http://controller:8500"

        only_bad = HttpControllerClient("http://down:1,http://standby:2", cluster_token="tok", transport=transport)
        with pytest.raises(ControllerUnavailableError) as failed:
            await only_bad.heartbeat(beat)
        assert "http://down:1: ConnectError" in str(failed.value)
        assert "http://standby:2: HTTP 503" in str(failed.value)
        wrong = HttpControllerClient("http://controller:1,http://down:2", cluster_token="x", transport=transport)
        before = len(transport.hosts)
        with pytest.raises(ControllerRejectedError, match="401"):  # a refusal is final: no failover
            await wrong.heartbeat(beat)
        assert transport.hosts[before:] == ["controller"]
        with pytest.raises(ValueError, match="no controller URL"):
            HttpControllerClient(" , ", cluster_token="tok")
        for c in (client, only_bad, wrong):
            await c.aclose()

    asyncio.run(main())


def test_metrics_are_read_from_the_status() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["b"]
        await guard(h, "r", pods="b")
        assert (await pod.http.get("/metrics")).status_code == 401
        text = (await pod.http.get("/metrics", headers={"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"})).text
        assert 'heteroflow_node_manager_engine_ready{endpoint="2",pod="pod-b"} 1.0' in text
        assert 'heteroflow_node_manager_engine_ft_status{endpoint="3",pod="pod-b",status="healthy"} 1.0' in text
        assert "heteroflow_node_manager_guard_frozen 1.0" in text
        status = (await pod.http.get(NM_STATUS_PATH, headers={"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"})).json()
        assert status["guard_request_id"] == "r"
        assert [e["endpoint_id"] for e in status["endpoints"]] == [2, 3]

    run_instance(scenario)


def test_concurrent_flushes_deliver_each_report_once_in_order() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["b"]
        h.controller.unavailable = True
        for proc in (pod.launcher.current(2), pod.launcher.current(3)):
            proc.exit(1)
        await pod.nm.supervise_once()
        h.controller.unavailable = False
        await asyncio.gather(*(pod.nm.flush_reports() for _ in range(5)), pod.nm.controller_once())
        assert [r.endpoint_id for r in h.controller.reports] == [2, 3]

    run_instance(scenario)
