"""An elastic EP resize done outside HeteroFlow is seen by the NodeManager and carried to the controller.

vLLM 0.34's fault tolerance freezes the DP size at the engine's start and an elastic EP resize never rebuilds
it, so an instance whose world was resized cannot be scaled down soundly. The NodeManager reads
``POST /is_scaling_elastic_ep`` of each engine that runs with elastic EP, once per status poll; a resize that
ran or runs marks the endpoint (status, heartbeat) until its engine is started again. The engines are the
simulator's in-process fakes; the elastic EP answers are injected in front of them, as vLLM 0.34 words them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from heteroflow.contracts.engine_protocol import (
    ELASTIC_EP_OBSERVABILITY_PATHS,
    ELASTIC_EP_RETIRED_TEXT,
    ELASTIC_EP_SCALING_TEXT,
    IS_SCALING_ELASTIC_EP_PATH,
)
from heteroflow.contracts.serving import EngineRank, EnginesStartRequest, FtFlags
from heteroflow.core.testing import FakeClock
from heteroflow.engine_sim.testing import FakeEngineCluster
from heteroflow.serving.node_manager.daemon import NodeManager
from heteroflow.serving.node_manager.engines import EngineProtocolError, HttpEngineClient
from heteroflow.serving.node_manager.metrics import NodeManagerMetrics
from heteroflow.serving.node_manager.testing import FakeController, FakeLauncher

from .harness import make_node_manager

EPOCH = "9f1c2b7e4d3a4e0f8a6b5c4d3e2f1a0b"


def vllm_status(phase: str, requested: int | None, *, error: str | None = None) -> dict[str, Any]:
    """``POST /is_scaling_elastic_ep``'s body as vLLM 0.34 sends it."""
    return {
        "is_scaling_elastic_ep": phase in ("preparing", "committing"),
        "phase": phase,
        "epoch": None if phase == "idle" else EPOCH,
        "error": error,
        "requested_data_parallel_size": requested,
    }


class ElasticEpAnswers(httpx.AsyncBaseTransport):
    """Answers ``POST /is_scaling_elastic_ep`` with :attr:`answer` (status code, body) and counts the asks;
    every other request goes to the engine behind."""

    def __init__(self, engine: httpx.AsyncClient, answer: tuple[int, object]) -> None:
        self._engine = engine
        self.answer = answer
        self.asked = 0
        self.gate: tuple[int, object] | None = None
        """When set, vLLM's elastic EP gate: this answer for every path but ``/health`` and the status route."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self.gate is not None and request.url.path not in ELASTIC_EP_OBSERVABILITY_PATHS:
            code, body = self.gate
            return httpx.Response(code, json=body)
        if request.url.path == IS_SCALING_ELASTIC_EP_PATH:
            self.asked += 1
            code, body = self.answer
            if isinstance(body, str):
                return httpx.Response(code, text=body)
            return httpx.Response(code, json=body)
        forwarded = await self._engine.send(request)
        content = await forwarded.aread()
        return httpx.Response(forwarded.status_code, headers=forwarded.headers, content=content)


Scenario = Callable[[NodeManager, dict[int, ElasticEpAnswers], FakeLauncher], Awaitable[None]]


def run(
    scenario: Scenario,
    *,
    elastic_ep: bool = True,
    discover: bool = False,
    inject: bool = True,
    at_start: tuple[int, object] = (200, vllm_status("idle", None)),
) -> None:
    """Pod ``a`` (ranks 0 and 1) of a 4-rank instance, launched with ``enable_elastic_ep`` when ``elastic_ep``;
    the engines answer the elastic EP route with ``at_start`` (at discovery too) until a test says otherwise.
    Its fake processes are not bound to the engines, so a restart starts them again while the engines serve."""

    async def main() -> None:
        cluster = FakeEngineCluster(dp_size=4, profile_name="vllm-0.34", enable_elastic_ep=True)
        await cluster.start()
        answers: dict[int, ElasticEpAnswers] = {}
        clients: dict[int, httpx.AsyncClient] = {}

        def client_for(rank: int) -> httpx.AsyncClient:
            if not inject:
                return cluster.client(rank)
            if rank not in clients:
                engine = cluster.client(rank)
                answers[rank] = ElasticEpAnswers(engine, at_start)
                clients[rank] = httpx.AsyncClient(
                    transport=answers[rank], base_url=engine.base_url, headers=engine.headers
                )
            return clients[rank]

        nm, launcher = make_node_manager(
            cluster,
            FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True)),
            (0, 1),
            name="a",
            launcher=FakeLauncher(),
            client_for=client_for,
            spec_extra={"enable_elastic_ep": elastic_ep},
            discover=discover,
        )
        try:
            await nm.start(loops=False)
            await cluster.settle()
            for endpoint_id in (0, 1):
                assert await nm.check_ready(endpoint_id)
                await nm.poll_once(endpoint_id)
            await scenario(nm, answers, launcher)
        finally:
            await nm.close()
            for client in clients.values():
                await client.aclose()
            await cluster.close()

    asyncio.run(main())


def marks(nm: NodeManager) -> dict[int, tuple[bool, str | None, int | None]]:
    return {
        e.endpoint_id: (e.elastic_ep_resized, e.elastic_ep_phase, e.elastic_ep_requested_dp_size)
        for e in nm.status().endpoints
    }


def test_a_completed_resize_marks_the_endpoint_in_status_and_heartbeat_until_a_relaunch() -> None:
    async def scenario(nm: NodeManager, answers: dict[int, ElasticEpAnswers], _: FakeLauncher) -> None:
        assert await nm.watch_elastic_ep_once(0) is None  # idle since start: no resize
        assert marks(nm)[0] == (False, None, None)
        answers[0].answer = (200, vllm_status("completed", 2))  # an operator shrank the world to 2 ranks
        reading = await nm.watch_elastic_ep_once(0)
        assert reading is not None
        assert (reading.phase, reading.requested_data_parallel_size) == ("completed", 2)
        assert await nm.watch_elastic_ep_once(1) is None  # rank 1's engine still answers idle here
        assert marks(nm) == {0: (True, "completed", 2), 1: (False, None, None)}
        metrics = NodeManagerMetrics(nm.status).render().decode()
        assert 'heteroflow_node_manager_engine_elastic_ep_resized{endpoint="0",pod="pod-a"} 1.0' in metrics
        assert 'heteroflow_node_manager_engine_elastic_ep_resized{endpoint="1",pod="pod-a"} 0.0' in metrics
        assert nm.heartbeat().engine_ranks == [
            EngineRank(
                endpoint_id=0, engine_rank=0, dp_size=4, elastic_ep_resized=True, elastic_ep_requested_dp_size=2
            ),
            EngineRank(endpoint_id=1, engine_rank=1, dp_size=4),
        ]
        # the mark stays while the engine runs in that world, whatever it answers next
        answers[0].answer = (200, vllm_status("idle", None))
        assert await nm.watch_elastic_ep_once(0) is not None
        answers[0].answer = (503, "External Elastic EP status is temporarily unavailable")
        assert await nm.watch_elastic_ep_once(0) is None
        assert marks(nm)[0][0]
        # a relaunch starts the engines in a fresh world: the mark is gone
        restarted = await nm.start_engines(EnginesStartRequest(), restart=True)
        assert restarted.started_endpoint_ids == [0, 1]
        assert marks(nm)[0] == (False, None, None)
        assert await nm.check_ready(0)
        assert await nm.watch_elastic_ep_once(0) is None
        assert not any(e.elastic_ep_resized for e in nm.heartbeat().engine_ranks)

    run(scenario)


@pytest.mark.parametrize(
    ("answer", "resized"),
    [
        (vllm_status("preparing", 6), True),  # growing, not done yet
        (vllm_status("committing", 3), True),
        (vllm_status("completed", 4), True),  # resized and back to the launch's size: still another world
        (vllm_status("failed", 2, error="Scale failed"), True),  # given up, but it asked for another size
        (vllm_status("failed", 4, error="Scale failed"), False),
        (vllm_status("idle", 4), False),
        (vllm_status("idle", None), False),
    ],
    ids=["preparing", "committing", "completed-same-size", "failed-other-size", "failed-same-size", "idle", "none"],
)
def test_which_answers_mean_a_resize_of_the_launched_world(answer: dict[str, Any], resized: bool) -> None:
    async def scenario(nm: NodeManager, answers: dict[int, ElasticEpAnswers], _: FakeLauncher) -> None:
        answers[1].answer = (200, answer)
        assert (await nm.watch_elastic_ep_once(1) is not None) is resized
        assert marks(nm)[1][0] is resized
        assert nm.heartbeat().engine_ranks[1].elastic_ep_resized is resized

    run(scenario)


@pytest.mark.parametrize(
    "answer",
    [
        (200, {"phase": "resizing"}),
        (200, {"is_scaling_elastic_ep": False}),
        (200, vllm_status("completed", 0)),
        (200, "not json"),
        (404, {"detail": "Not Found"}),
    ],
    ids=["unknown-phase", "no-phase", "size-0", "not-json", "404"],
)
def test_an_odd_answer_marks_nothing(answer: tuple[int, object]) -> None:
    async def scenario(nm: NodeManager, answers: dict[int, ElasticEpAnswers], _: FakeLauncher) -> None:
        answers[0].answer = answer
        with pytest.raises(EngineProtocolError):
            await nm._engines.elastic_ep_status(0, timeout_sec=1.0)
        assert await nm.watch_elastic_ep_once(0) is None
        assert marks(nm)[0] == (False, None, None)

    run(scenario)


def test_an_engine_without_elastic_ep_is_never_asked() -> None:
    """Neither configured nor found at discovery (the route answered 404 then)."""

    async def scenario(nm: NodeManager, answers: dict[int, ElasticEpAnswers], _: FakeLauncher) -> None:
        asked = answers[0].asked  # discovery's one ask
        answers[0].answer = (200, vllm_status("completed", 2))
        assert await nm.watch_elastic_ep_once(0) is None
        assert answers[0].asked == asked
        assert marks(nm)[0] == (False, None, None)

    run(scenario, elastic_ep=False, at_start=(404, {"detail": "Not Found"}))


def test_discovery_alone_enables_the_watch_and_the_simulator_reads_as_no_resize() -> None:
    """Not configured in the spec, but the engines answer the route at discovery (an operator's own flag); the
    simulator's status since start is no resize."""

    async def scenario(nm: NodeManager, _: dict[int, ElasticEpAnswers], __: FakeLauncher) -> None:
        engines = nm._engines
        assert isinstance(engines, HttpEngineClient)
        assert engines.elastic_ep_of(0)
        reading = await engines.elastic_ep_status(0, timeout_sec=1.0)
        assert reading.phase == "idle"
        assert await nm.watch_elastic_ep_once(0) is None
        assert not nm.heartbeat().engine_ranks[0].elastic_ep_resized

    run(scenario, elastic_ep=False, discover=True, inject=False)


def test_the_poll_loop_reads_the_resize_status_once_per_step_after_the_ft_poll() -> None:
    async def scenario(nm: NodeManager, answers: dict[int, ElasticEpAnswers], _: FakeLauncher) -> None:
        answers[0].answer = (200, vllm_status("committing", 3))
        asked, polls = answers[0].asked, nm.status().endpoints[0].polls
        step = asyncio.create_task(nm._endpoint_step(0))
        for _turn in range(10_000):  # the in-process engines answer within a few loop turns; the clock stands still
            if marks(nm)[0][0]:
                break
            await asyncio.sleep(0)
        assert marks(nm)[0] == (True, "committing", 3)
        assert (answers[0].asked, nm.status().endpoints[0].polls) == (asked + 1, polls + 1)
        assert not step.done()  # it waits out the poll interval on the injected clock
        clock = nm._clock
        assert isinstance(clock, FakeClock)
        clock.advance(nm.settings.engine_ft_poll_interval_sec)
        await step
        assert answers[0].asked == asked + 1

    run(scenario)


def test_the_gate_of_a_resize_pauses_the_poll_without_a_fault_or_a_protocol_error() -> None:
    """While a resize commits, and for good on a rank a scale-down retired, vLLM answers the FT status route with
    its gate's 503: the engine is neither faulted nor off-protocol. The poll reports nothing and shows ``paused``;
    the status after the resize is judged against what was seen before it. Any other 503 is still a protocol
    error, and the controller's own status query is refused (it cannot act on a paused engine)."""

    async def scenario(nm: NodeManager, answers: dict[int, ElasticEpAnswers], _: FakeLauncher) -> None:
        for text in (ELASTIC_EP_SCALING_TEXT, ELASTIC_EP_RETIRED_TEXT):
            answers[0].gate = (503, {"error": text})
            assert await nm.poll_once(0) is None
            assert nm.status().endpoints[0].ft_status == "paused"
            entry = await nm._status_entry(0)  # the controller's status query, behind its proxy flag
            assert (entry.error, entry.detail) == ("protocol_error", f"elastic EP: {text}")
        answers[0].gate = None
        assert await nm.poll_once(0) is None  # healthy again, as before the resize: nothing to report
        assert nm.status().endpoints[0].ft_status == "healthy"
        answers[0].gate = (503, {"error": "Service Unavailable"})
        finding = await nm.poll_once(0)
        assert finding is not None
        assert finding.status == "protocol_error"

    run(scenario)
