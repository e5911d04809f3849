"""The whole control plane over engines that speak released vLLM's protocol (the simulator's
``vllm-released`` profile; ``tests/vllm`` does the same with real vLLM ranks).

The NodeManagers discover the profile and register it; a dead rank cannot be scaled down: the gate refuses
with ENGINE_SCALE_DOWN_UNSUPPORTED and the frozen fallback relaunches every engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from heteroflow.engine_sim import conformance
from tests.integration.serving.controller_harness import Plane, run_plane


def test_released_engines_are_refused_scale_down_and_the_fallback_restores_them(tmp_path: Path) -> None:
    async def scenario(plane: Plane) -> None:
        status = await plane.until(
            lambda s: s["engine_capability"]["protocol_profile"] == "vllm-0.32",
            within=10,
            what="the discovered profile registered",
        )
        assert status["engine_capability"] == {
            "protocol_profile": "vllm-0.32",
            "scale_down_supported": False,
            "retry_supported": True,
            "elastic_ep_supported": False,
        }
        launched_before = {n: len(plane.launchers[n].launched) for n in plane.launchers}
        plane.cluster.kill_worker(1)
        # one request per survivor meets the broken collective: aborted (200); a survivor that already saw the
        # fault lets a new request hang (released vLLM refuses nothing), so the traffic is bounded
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(conformance.traffic(plane.cluster, [0, 2, 3]), 10)

        def refused(s: dict[str, Any]) -> bool:
            return "ENGINE_SCALE_DOWN_UNSUPPORTED" in s["gate"]["reason_codes"] and bool(s["rounds"])

        status = await plane.until(refused, within=30, what="the gate refuses scale-down")
        assert status["gate"]["allowed"] is False
        timeline = await plane.round(status["rounds"][-1])
        assert [e for e in timeline["events"] if e["kind"] == "apply"] == []  # no scale_down ever sent
        await plane.until(
            lambda s: all(len(plane.launchers[n].launched) >= launched_before[n] + 2 for n in plane.launchers),
            within=30,
            what="every engine relaunched by the whole-instance fallback",
        )
        for nm in plane.node_managers.values():
            assert nm.service_state.retired == frozenset()  # a full rebuild: nothing retired
        # (the in-process fakes do not come back from a relaunch; tests/vllm shows real ranks serving again)

    run_plane(scenario, tmp_path, profile_name="vllm-0.32")
