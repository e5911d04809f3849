"""An instance whose engines' world elastic EP resized is never scaled down (gate ``ELASTIC_EP_RESIZED``).

vLLM 0.34's fault tolerance freezes the DP size at an engine's start, and an elastic EP resize never rebuilds it:
after one, the old ranks and any new rank disagree on the world a ``scale_down`` names. The NodeManagers say so in
their heartbeats (``EngineRank.elastic_ep_resized``); the round's gate refuses, and the fault goes to the frozen
fallback, a relaunch, whose fresh engines report no resize.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from heteroflow.contracts.serving import EngineRank, HeartbeatRequest
from heteroflow.core.testing import FakeClock
from heteroflow.serving.controller.clients import NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig, ControllerSettings, FaultToleranceConfig
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.gate import GateFlags, GateReason, evaluate
from heteroflow.serving.controller.core.ranks import InstanceId
from heteroflow.serving.controller.guard import RoundFailedError
from heteroflow.serving.controller.service import Controller
from heteroflow.serving.controller.status import InstanceStatus, PodStatus, statuses
from heteroflow.serving.controller.store import SqliteFtRuntimeStore
from heteroflow.serving.controller.strategy import ScaleDownRound

from .helpers import INSTANCE, capability, context, registration

ON = GateFlags(enable_fault_tolerance=True, enable_dp_scale_down=True)


def test_the_gate_refuses_a_resized_world_and_says_which_ranks_and_size() -> None:
    result = evaluate(flags=ON, capability=capability(), survivors=3, elastic_ep_resized={2: 6, 0: None})
    assert not result.allowed
    assert result.reason_codes == (GateReason.ELASTIC_EP_RESIZED,)
    assert result.warnings == (
        "elastic EP resized the world of ranks [0, 2] outside HeteroFlow (DP size asked: 6): the engines' fault "
        "tolerance still counts the ranks they were launched with, so no scale_down until the instance is "
        "relaunched",
    )
    # beside the other refusals, in its place before NO_SURVIVOR
    both = evaluate(
        flags=ON, capability=capability(scale_down_supported=False), survivors=0, elastic_ep_resized={1: None}
    )
    assert both.reason_codes == (
        GateReason.ENGINE_SCALE_DOWN_UNSUPPORTED,
        GateReason.ELASTIC_EP_RESIZED,
        GateReason.NO_SURVIVOR,
    )
    assert "(DP size asked" not in both.warnings[-1]  # no size said, none invented


@pytest.mark.parametrize("resized", [None, {}])
def test_no_resize_is_no_refusal(resized: dict[int, int | None] | None) -> None:
    assert evaluate(flags=ON, capability=capability(), survivors=3, elastic_ep_resized=resized).allowed


def beat(clock: FakeClock, *, resized: bool) -> HeartbeatRequest:
    return HeartbeatRequest(
        pod_id="a",
        instance_id=INSTANCE,
        endpoint_ids=[0, 1],
        expected_endpoint_ids=[0, 1],
        sent_at=clock.now(),
        engine_ranks=[
            EngineRank(endpoint_id=0, engine_rank=0, dp_size=4, elastic_ep_resized=resized),
            EngineRank(
                endpoint_id=1,
                engine_rank=1,
                dp_size=4,
                elastic_ep_resized=resized,
                elastic_ep_requested_dp_size=2 if resized else None,
            ),
        ],
    )


def test_the_round_refuses_scale_down_while_a_heartbeat_says_resized_and_admits_it_after_a_relaunch(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        clock = FakeClock()
        controller = Controller(
            config=ControllerConfig(
                settings=ControllerSettings.load(cluster_token="t"),
                ft=FaultToleranceConfig.load(enable_dp_scale_down=True),
            ),
            store=SqliteFtRuntimeStore(tmp_path / "ft.db"),
            node_managers=NodeManagerClient(cluster_token="t"),
            coordinator=None,
            clock=clock,
        )
        await controller.start(loops=False)
        try:
            await controller.register(registration("a", (0, 1)))
            await controller.register(registration("b", (2, 3), node="n2"))
            inst = controller.instances[InstanceId(INSTANCE)]
            controller.heartbeat(beat(clock, resized=True))  # an operator shrank the world to 2 ranks

            ctx = context(inst.runtime, dead=(3,))
            controller.set_runtime(inst, rt.start_round(inst.runtime, ctx))
            with pytest.raises(RoundFailedError, match="gate refused: ELASTIC_EP_RESIZED"):
                ScaleDownRound(controller, inst, ctx)._gate_and_plan()
            gate = inst.runtime.gate
            assert gate is not None
            assert (gate.allowed, gate.reason_codes) == (False, (GateReason.ELASTIC_EP_RESIZED,))
            assert "ranks [0, 1]" in gate.warnings[0]
            assert "(DP size asked: 2)" in gate.warnings[0]
            status = statuses(controller)[0]
            assert isinstance(status, InstanceStatus)
            assert (status.gate.allowed, status.gate.reason_codes) == (False, ["ELASTIC_EP_RESIZED"])
            pod = status.pods[0]
            assert isinstance(pod, PodStatus)
            assert pod.pod_id == "a"
            assert [(r.rank, r.elastic_ep_resized, r.elastic_ep_requested_dp_size) for r in pod.ranks] == [
                (0, True, None),
                (1, True, 2),
            ]

            # the fallback relaunched the engines: fresh worlds, no resize in the next heartbeat
            controller.heartbeat(beat(clock, resized=False))
            plan = ScaleDownRound(controller, inst, ctx)._gate_and_plan()
            assert plan.roles
            gate = inst.runtime.gate
            assert gate is not None
            assert gate.allowed
        finally:
            await controller.close()

    asyncio.run(main())
