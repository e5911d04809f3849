"""When a scaled-down instance may be restored to its configured size (``restore.py``): only once every retired
rank's capacity is back."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import cast

import pytest

from heteroflow.core.testing import FakeClock
from heteroflow.serving.controller.config import FaultToleranceConfig
from heteroflow.serving.controller.core.normalizer import HardwareFault
from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import RequestId, ranks
from heteroflow.serving.controller.instance import Instance, PodState, RestoreState
from heteroflow.serving.controller.ports import StrategyPorts
from heteroflow.serving.controller.restore import CapacityPorts, auto_due, refusal

from .helpers import INSTANCE, registration, runtime, snapshot, topology

LOST_AFTER = 30.0
CARD_OF_RANK_2 = HardwareFault(node_name="n2", card="Ascend910-0", fault_code="XID79", level=6)
"""Rank 2's card (pod b on n2 holds ranks 2, 3 on Ascend910-0 and -1)."""


def scaled_down(*dead: int) -> Instance:
    return Instance(
        instance_id=INSTANCE,
        topology=topology(),
        runtime=replace(
            runtime(), phase=FtPhase.SCALED_DOWN_RUNNING, dead_committed=ranks(dead), request_id=RequestId("sd-1")
        ),
    )


def ports(clock: FakeClock, *, silent: dict[str, float] | None = None, **ft: object) -> SimpleNamespace:
    pods = {
        pod_id: PodState(
            registration=registration(pod_id, ids), last_seen=clock.monotonic() - (silent or {}).get(pod_id, 0.0)
        )
        for pod_id, ids in (("pod-a", (0, 1)), ("pod-b", (2, 3)))
    }
    return SimpleNamespace(clock=clock, pods=pods, ft=FaultToleranceConfig.load(enable_dp_scale_down=True, **ft))


def beat(ctrl: SimpleNamespace) -> None:
    """Every pod heard from now."""
    for pod in ctrl.pods.values():
        pod.last_seen = ctrl.clock.monotonic()


def why(inst: Instance, ctrl: SimpleNamespace) -> str | None:
    return refusal(cast(CapacityPorts, ctrl), inst, pod_lost_after_sec=LOST_AFTER)


def test_a_scaled_down_quiet_instance_with_every_pod_up_and_no_standing_fault_may_be_restored() -> None:
    assert why(scaled_down(2), ports(FakeClock())) is None


@pytest.mark.parametrize("phase", [FtPhase.NORMAL, FtPhase.RECONFIGURING, FtPhase.SCALING_DOWN])
def test_an_instance_not_running_scaled_down_has_nothing_to_restore(phase: FtPhase) -> None:
    inst = scaled_down(2)
    inst.runtime = replace(inst.runtime, phase=phase)
    assert "nothing to restore" in (why(inst, ports(FakeClock())) or "")


def test_a_running_strategy_or_pending_evidence_comes_first() -> None:
    inst = scaled_down(2)
    inst.strategy.running = "scale_down"
    assert why(inst, ports(FakeClock())) == "a scale_down strategy is running for the instance"
    inst.strategy.running = None
    inst.evidence.snapshot = snapshot({1: "unhealthy"})
    assert "fault evidence is pending" in (why(inst, ports(FakeClock())) or "")


def test_a_pod_not_registered_or_silent_means_its_capacity_is_not_back() -> None:
    ctrl = ports(FakeClock(), silent={"pod-b": LOST_AFTER + 5})
    assert why(scaled_down(2), ctrl) == "pod pod-b has been silent for 35 s"
    del ctrl.pods["pod-b"]
    assert "pod pod-b is not registered" in (why(scaled_down(2), ctrl) or "")


def test_a_standing_fault_on_a_retired_ranks_card_refuses_until_the_card_is_replaced() -> None:
    inst = scaled_down(2)
    inst.standing.faults[CARD_OF_RANK_2.key] = CARD_OF_RANK_2
    said = why(inst, ports(FakeClock()))
    assert said is not None
    assert said.startswith("capacity is not back:")
    del inst.standing.faults[CARD_OF_RANK_2.key]  # the source reported the (replaced) card healthy
    assert why(inst, ports(FakeClock())) is None


def test_the_policy_is_off_by_default_waits_its_delay_and_does_not_retry_a_failed_restore_of_the_same_round() -> None:
    clock = FakeClock()
    inst = scaled_down(2)
    off = ports(clock)
    assert auto_due(cast(StrategyPorts, off), inst, pod_lost_after_sec=LOST_AFTER) is False
    on = ports(clock, auto_restore=True, auto_restore_delay_sec=60.0)
    assert auto_due(cast(StrategyPorts, on), inst, pod_lost_after_sec=LOST_AFTER) is False  # the delay starts
    clock.advance(59.0)
    beat(on)
    assert auto_due(cast(StrategyPorts, on), inst, pod_lost_after_sec=LOST_AFTER) is False
    clock.advance(1.0)
    beat(on)
    assert auto_due(cast(StrategyPorts, on), inst, pod_lost_after_sec=LOST_AFTER) is True
    # a break (a strategy running) restarts the delay
    inst.strategy.running = "scale_down"
    assert auto_due(cast(StrategyPorts, on), inst, pod_lost_after_sec=LOST_AFTER) is False
    inst.strategy.running = None
    assert auto_due(cast(StrategyPorts, on), inst, pod_lost_after_sec=LOST_AFTER) is False
    # a failed restore of this degraded instance is not tried again by the policy; a later round's is
    inst.restores.last = RestoreState(
        state="failed",
        request_id="rs-1",
        requested_by="auto_restore",
        ranks=(2,),
        started_at=clock.now(),
        started_monotonic=clock.monotonic(),
        degraded_round="sd-1",
    )
    clock.advance(120.0)
    beat(on)
    assert auto_due(cast(StrategyPorts, on), inst, pod_lost_after_sec=LOST_AFTER) is False
    inst.runtime = replace(inst.runtime, request_id=RequestId("sd-2"), dead_committed=ranks((1, 2)))
    assert auto_due(cast(StrategyPorts, on), inst, pod_lost_after_sec=LOST_AFTER) is True
