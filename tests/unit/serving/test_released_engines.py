"""NodeManagers in front of engines of either protocol profile: discovery, registration, correlation.

The engines are the simulator's in-process fakes speaking ``vllm-released`` (vLLM 0.32/0.33) or
``scale-down`` (PR #46370); the NodeManager is told neither and finds out (``engine-protocol.md``).
"""

from __future__ import annotations

import asyncio

from heteroflow.contracts.engine_protocol import EngineStatusEntry
from heteroflow.contracts.serving import FtFlags, FtStatusRequest, GuardRequest, NmApplyRequest
from heteroflow.serving.controller.core import readiness
from heteroflow.serving.node_manager import commands

from .harness import Harness, run_instance

FAST = FtFlags(enable_dp_scale_down_proxy=True, enable_fast_recovery=True)


def test_a_released_engine_is_discovered_and_registered_as_unable_to_scale_down() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        first = h.controller.registrations[0]
        assert first.ft_capability.protocol_profile is None  # registered before the engines were ready
        profile = pod.nm.discovered_profile()
        assert profile is not None
        assert profile.name == "vllm-0.32"
        beats = len(h.controller.heartbeats)
        await pod.nm.controller_once()
        again = h.controller.registrations[-1]
        assert again.pod_id == "pod-a"
        capability = again.ft_capability
        assert (capability.protocol_profile, capability.scale_down_supported, capability.retry_supported) == (
            "vllm-0.32",
            False,
            True,
        )
        assert len(h.controller.heartbeats) == beats + 1  # the step's heartbeat still goes out
        await pod.nm.controller_once()
        assert h.controller.registrations[-1] is again  # once known, registered once

    run_instance(scenario, profile_name="vllm-0.32")


def test_the_same_discovery_finds_the_scale_down_profile() -> None:
    async def scenario(h: Harness) -> None:
        await h.pods["b"].nm.controller_once()
        capability = h.controller.registrations[-1].ft_capability
        assert capability.protocol_profile == "vllm-0.34"
        assert capability.scale_down_supported

    run_instance(scenario, profile_name="vllm-0.34")


def test_discovery_registers_elastic_ep_where_the_engines_serve_it() -> None:
    async def scenario(h: Harness) -> None:
        await h.pods["a"].nm.controller_once()
        capability = h.controller.registrations[-1].ft_capability
        assert (capability.protocol_profile, capability.scale_down_supported) == ("vllm-0.34", True)
        assert capability.elastic_ep_supported

    run_instance(scenario, profile_name="vllm-0.34", elastic_ep=True)


def test_without_elastic_ep_routes_the_capability_says_so() -> None:
    async def scenario(h: Harness) -> None:
        await h.pods["a"].nm.controller_once()
        assert not h.controller.registrations[-1].ft_capability.elastic_ep_supported

    run_instance(scenario, profile_name="vllm-0.34")


async def _drive(h: Harness, work: asyncio.Future[object] | asyncio.Task[object], *, within: float) -> None:
    """Let fake engine time pass until ``work`` is done (a request to a faulted engine needs steps)."""
    waited = 0.0
    while not work.done():
        await h.settle()
        h.cluster.clock.advance(0.1)
        waited += 0.1
        assert waited < within, "work not done in time"
    await work


def test_a_failed_retry_is_correlated_by_the_engines_own_id_and_ends_the_wait() -> None:
    async def scenario(h: Harness) -> None:
        pod = h.pods["a"]
        h.cluster.kill_worker(3)  # rank 3 (pod b) dies: a retry of ranks 0-2 cannot gather every member
        aborted = asyncio.ensure_future(h.traffic([0, 1, 2]))
        await _drive(h, aborted, within=30)

        async def unhealthy() -> bool:
            answer = await pod.nm.ft_status(FtStatusRequest(endpoint_ids=[0, 1]))
            return all(e.status is not None and e.status.status == "unhealthy" for e in answer.entries)

        await h.cluster.eventually(unhealthy, within=30, what="pod a's engines unhealthy")
        pod.nm.ft_guard(GuardRequest(request_id="round-1", lease_sec=600))
        answer = await pod.nm.ft_apply(NmApplyRequest(instruction="retry", request_id="round-1", endpoint_ids=[0, 1]))
        assert answer.accepted
        engine_ids = {eid: c.engine_id for eid, c in pod.nm._commands.items()}
        assert set(engine_ids) == {0, 1}
        assert all(engine_id != "round-1" for engine_id in engine_ids.values())  # the engine's own uuids

        running = await pod.nm.ft_status(FtStatusRequest(endpoint_ids=[0, 1]))
        assert [e.status.ft_state if e.status else None for e in running.entries] == ["recovering", "recovering"]

        async def failed() -> bool:
            entries = (await pod.nm.ft_status(FtStatusRequest(endpoint_ids=[0, 1]))).entries
            return all(e.status is not None and e.status.ft_error for e in entries)

        await h.cluster.eventually(failed, within=120, what="the retry fails on both survivors")
        entries = (await pod.nm.ft_status(FtStatusRequest(endpoint_ids=[0, 1]))).entries
        for entry in entries:
            assert entry.status is not None
            assert entry.status.last_ft_request_id == "round-1"  # the round's id, not the engine's
            assert entry.status.ft_state == "failed"  # inferred: the profile sends none
        verdict = readiness.after_apply(
            entries,
            survivors=[0, 1],
            request_id="round-1",
            limits=readiness.PollLimits(deadline=h.cluster.clock.monotonic() + 600),
            now=h.cluster.clock.monotonic(),
        )
        assert verdict.verdict == "fail"  # at once, not at the deadline

    run_instance(scenario, flags=FAST, profile_name="vllm-0.32")


def test_an_outcome_dropped_by_the_next_push_is_kept_until_the_engine_is_healthy() -> None:
    tracked = commands.track(round_id="r1", engine_id="u-1", instruction="retry", profile=None)
    tracked = commands.CommandTrack(
        round_id=tracked.round_id, engine_id="u-1", instruction="retry", infer_ft_state=True
    )
    running = EngineStatusEntry(id=0, status="unhealthy", fault_info="RuntimeError")
    tracked_after, entry = commands.correlate(tracked, running)
    assert (entry.ft_state, entry.last_ft_request_id) == ("recovering", None)
    failed = running.model_copy(update={"last_ft_request_id": "u-1", "ft_error": "Timed out"})
    tracked_after, entry = commands.correlate(tracked_after, failed)
    assert (entry.last_ft_request_id, entry.ft_error, entry.ft_state) == ("r1", "Timed out", "failed")
    assert tracked_after is not None
    assert tracked_after.outcome == "Timed out"
    pushed = EngineStatusEntry(id=0, status="unhealthy", fault_info="RuntimeError")  # the push dropped both
    tracked_after, entry = commands.correlate(tracked_after, pushed)
    assert (entry.last_ft_request_id, entry.ft_error, entry.ft_state) == ("r1", "Timed out", "failed")
    healthy = EngineStatusEntry(id=0, status="healthy")
    _, entry = commands.correlate(tracked_after, healthy)
    assert entry == healthy  # a healthy engine's entry is never given a stale failure


def test_an_echoing_engine_keeps_its_own_ft_state_and_ids() -> None:
    tracked = commands.CommandTrack(round_id="r1", engine_id="r1", instruction="scale_down", infer_ft_state=False)
    entry = EngineStatusEntry(id=2, status="unhealthy", last_ft_request_id="r1", ft_state="recovering")
    _, seen = commands.correlate(tracked, entry)
    assert seen == entry
    assert commands.correlate(None, entry) == (None, entry)
