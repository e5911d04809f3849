"""What the engines can do, as the controller's core sees it: the gate and the instance's agreed capability."""

from __future__ import annotations

import pytest

from heteroflow.contracts.serving import EndpointInfo, FtCapability, RegisterRequest
from heteroflow.serving.controller.core import gate
from heteroflow.serving.controller.core.errors import CapabilityMismatchError
from heteroflow.serving.controller.core.gate import GateFlags, GateReason
from heteroflow.serving.controller.core.topology import resolve_instance

FLAGS = GateFlags(enable_fault_tolerance=True, enable_dp_scale_down=True)


def capability(**changes: object) -> FtCapability:
    base = FtCapability(
        engine_ft_enabled=True,
        scale_down_supported=True,
        external_lb=True,
        auto_recovery_enabled=False,
        eplb_enabled=True,
        num_redundant_experts=4,
        num_logical_experts=4,
        slots_per_rank=2,
        tp_size=1,
        protocol_profile="vllm-0.34",
    )
    return base.model_copy(update=changes)


def registration(pod: str, ranks: list[int], cap: FtCapability) -> RegisterRequest:
    return RegisterRequest(
        pod_id=pod,
        pod_ip="127.0.0.1",
        node_manager_url=f"http://{pod}",
        instance_id="i",
        dp_size=4,
        endpoints=[EndpointInfo(id=r, ip="127.0.0.1", port=8000 + r) for r in ranks],
        ft_capability=cap,
    )


def test_a_released_vllm_is_refused_scale_down_with_its_reason() -> None:
    released = capability(protocol_profile="vllm-0.32", scale_down_supported=False)
    result = gate.evaluate(flags=FLAGS, capability=released, survivors=3)
    assert not result.allowed
    assert result.reason_codes == (GateReason.ENGINE_SCALE_DOWN_UNSUPPORTED,)
    assert gate.evaluate(flags=FLAGS, capability=capability(), survivors=3).allowed


def test_pods_whose_engines_speak_different_profiles_fail_closed() -> None:
    topology = resolve_instance(
        [
            registration("a", [0, 1], capability()),
            registration("b", [2, 3], capability(protocol_profile="vllm-0.32", scale_down_supported=False)),
        ]
    )
    assert topology.capability.protocol_profile == "mixed"
    assert not topology.capability.scale_down_supported
    result = gate.evaluate(flags=FLAGS, capability=topology.capability, survivors=3)
    assert GateReason.CAPABILITY_MISMATCH in result.reason_codes
    assert GateReason.ENGINE_SCALE_DOWN_UNSUPPORTED in result.reason_codes


def test_a_pod_not_yet_discovered_adds_its_flags_not_a_profile() -> None:
    topology = resolve_instance(
        [registration("a", [0, 1], capability()), registration("b", [2, 3], capability(protocol_profile=None))]
    )
    assert topology.capability.protocol_profile == "vllm-0.34"
    assert gate.evaluate(flags=FLAGS, capability=topology.capability, survivors=3).allowed


def test_configured_fields_must_still_agree() -> None:
    with pytest.raises(CapabilityMismatchError):
        resolve_instance(
            [registration("a", [0, 1], capability()), registration("b", [2, 3], capability(eplb_enabled=False))]
        )
