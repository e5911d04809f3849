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
