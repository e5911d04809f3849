"""Random controller traffic against one NodeManager through its HTTP routes (hypothesis state machine).

Engines are a recording stub (every apply 202), processes are fakes,
time is a :class:`FakeClock`. Invariants: no route ever answers 5xx other than the documented 502; an
engine never receives two applies of one round; a committed rank never reappears in a heartbeat or a
fault report; a refused finalize never changes who holds the guard.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from heteroflow.contracts.serving import (
    NM_ENGINES_START_PATH,
    NM_FT_APPLY_PATH,
    NM_FT_FINALIZE_PATH,
    NM_FT_GUARD_PATH,
    FtFlags,
)
from heteroflow.core.testing import FakeClock
from heteroflow.serving.node_manager.assembly import create_app
from heteroflow.serving.node_manager.daemon import NodeManager, PodIdentity
from heteroflow.serving.node_manager.engines import HttpEngineClient
from heteroflow.serving.node_manager.settings import NodeManagerSettings
from heteroflow.serving.node_manager.testing import TEST_CLUSTER_TOKEN, FakeController, FakeLauncher

from .harness import instance_spec

IDS = st.sampled_from(["r1", "r2"])
RANKS = st.frozensets(st.integers(0, 3), max_size=3)
ALLOWED = {200, 202, 400, 409, 502}


class NodeManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.applies: list[tuple[int, str]] = []
        self.controller = FakeController(flags=FtFlags(enable_dp_scale_down_proxy=True))
        self.launcher = FakeLauncher()
        self.engines = {
            eid: httpx.AsyncClient(transport=httpx.MockTransport(self._engine), base_url=f"http://engine-{eid}")
            for eid in (0, 1)
        }
        self.nm = NodeManager(
            spec=instance_spec((0, 1)),
            settings=NodeManagerSettings.load(cluster_token=TEST_CLUSTER_TOKEN),
            pod=PodIdentity(pod_id="pod", pod_ip="127.0.0.1", node_manager_url="http://nm"),
            controller=self.controller,
            engines=HttpEngineClient(self.engines.__getitem__, ft_path_prefix="/v1"),
            launcher=self.launcher,
            clock=self.clock,
        )
        self.http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(self.nm, cluster_token=TEST_CLUSTER_TOKEN)),
            base_url="http://nm",
            headers={"Authorization": f"Bearer {TEST_CLUSTER_TOKEN}"},
        )
        self.run(self.nm.start(loops=False))
        self.run(self.nm.controller_once())
        for eid in (0, 1):
            self.nm.supervisor.mark_ready(eid)
        self.committed: set[int] = set()
        self.accepted = 0
        self.reports_at_commit: dict[int, int] = {}

    def _engine(self, request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/fault_tolerance/apply"
        body = json.loads(request.content)
        self.applies.append((int(request.url.host.rsplit("-", 1)[1]), body["request_id"]))
        return httpx.Response(202, json={"message": "poll", "request_id": body["request_id"]})

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        response: httpx.Response = self.run(self.http.post(path, json=body))
        assert response.status_code in ALLOWED, (path, body, response.status_code, response.text)
        return response

    def teardown(self) -> None:
        self.run(self.http.aclose())
        self.run(self.nm.close())
        for client in self.engines.values():
            self.run(client.aclose())
        self.loop.close()

    @rule(seconds=st.sampled_from([0.5, 4.0, 40.0]))
    def tick(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule(request_id=IDS, lease=st.sampled_from([5.0, 30.0, 3600.0]))
    def guard(self, request_id: str, lease: float) -> None:
        self.post(NM_FT_GUARD_PATH, {"request_id": request_id, "lease_sec": lease})

    @rule(request_id=IDS, removed=RANKS)
    def apply(self, request_id: str, removed: frozenset[int]) -> None:
        response = self.post(
            NM_FT_APPLY_PATH,
            {"instruction": "scale_down", "request_id": request_id, "params": {"removed_dp_ranks": sorted(removed)}},
        )
        if response.status_code in (202, 502) and "results" in response.json():
            self.accepted += response.status_code == 202

    @rule(request_id=IDS, removed=RANKS)
    def guard_and_apply(self, request_id: str, removed: frozenset[int]) -> None:
        """What a round does most: guard, then apply at once (the other rules interleave around it)."""
        self.guard(request_id, 30.0)
        self.apply(request_id, removed)

    @rule(request_id=IDS, commit=st.booleans(), retired=RANKS)
    def finalize(self, request_id: str, commit: bool, retired: frozenset[int]) -> None:
        owner_before = self.nm.service_state.owner
        response = self.post(
            NM_FT_FINALIZE_PATH, {"request_id": request_id, "commit": commit, "retired_endpoint_ids": sorted(retired)}
        )
        if response.status_code == 502:
            assert self.nm.service_state.owner == owner_before
        elif commit:
            for rank in retired - self.committed:
                self.reports_at_commit[rank] = len(self.controller.reports_for(rank))
            self.committed |= retired

    @rule(endpoint_id=st.sampled_from([0, 1]))
    def engine_dies(self, endpoint_id: int) -> None:
        proc = self.launcher.current(endpoint_id)
        proc.exit(1)
        self.run(self.nm.supervise_once())

    @rule()
    def relaunch(self) -> None:
        """The controller's EngineRelaunch: start what is not running; ready at once (fake processes). The
        survivors start as a world of their own, which must hold the 4 logical experts in 2 slots a rank."""
        before = self.nm.status()
        response: httpx.Response = self.run(self.http.post(NM_ENGINES_START_PATH, json={}))
        if 0 < 2 * (4 - len(self.committed)) < 4:  # one rank left: its 2 slots cannot hold 4 experts
            assert response.status_code == 409, response.text
            assert response.json()["error"] == "launch_refused"
            assert self.nm.status().retired == before.retired  # refused before anything changed
            return
        assert response.status_code == 200, response.text
        for eid in response.json()["started_endpoint_ids"]:
            self.nm.supervisor.mark_ready(eid)

    @rule()
    def heartbeat(self) -> None:
        self.run(self.nm.controller_once())
        beat = self.controller.heartbeats[-1].request
        assert not set(beat.endpoint_ids) & self.committed
        assert set(beat.retired_endpoint_ids) == self.committed & {0, 1}

    @invariant()
    def an_engine_never_gets_two_applies_of_one_round(self) -> None:
        assert len(self.applies) == len(set(self.applies))

    @invariant()
    def committed_ranks_are_never_reported_again(self) -> None:
        for rank, count in self.reports_at_commit.items():
            assert len(self.controller.reports_for(rank)) == count


NodeManagerMachine.TestCase.settings = settings(max_examples=40, stateful_step_count=25)
TestNodeManagerMachine = NodeManagerMachine.TestCase
