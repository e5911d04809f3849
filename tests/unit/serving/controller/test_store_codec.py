"""The FtRuntimeStore's JSON codec: every valid record round-trips, nothing else decodes (F-32)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.serving.controller.core.phase import FtPhase
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId, RequestId, ranks
from heteroflow.serving.controller.core.runtime import FallbackStrategy, PersistedRuntime, WriteAheadRecord
from heteroflow.serving.controller.store import SCHEMA_VERSION, StoreCorruptError, decode_runtime, encode_runtime

RANK = st.integers(min_value=0, max_value=2**31).map(DpRank)


@st.composite
def persisted_runtimes(draw: st.DrawFn) -> PersistedRuntime:
    original = draw(st.frozensets(RANK, min_size=1, max_size=12))
    subsets = st.frozensets(st.sampled_from(sorted(original)), max_size=len(original))
    write_ahead = draw(
        st.none()
        | st.builds(
            WriteAheadRecord,
            request_id=st.text(min_size=1, max_size=40).map(RequestId),
            pending_removed=subsets,
            phase=st.sampled_from(FtPhase),
        )
    )
    return PersistedRuntime(
        instance_id=InstanceId(draw(st.text(min_size=1, max_size=40))),
        phase=draw(st.sampled_from(FtPhase)),
        generation=draw(st.integers(min_value=0, max_value=2**63)),
        original_dp_ranks=original,
        dead_committed=draw(subsets),
        fallback=draw(st.none() | st.sampled_from(FallbackStrategy)),
        write_ahead=write_ahead,
    )


@given(persisted_runtimes())
def test_every_record_round_trips(record: PersistedRuntime) -> None:
    data = encode_runtime(record)
    assert decode_runtime(data) == record
    assert decode_runtime(data, instance_id=record.instance_id) == record
    assert json.loads(data)["schema"] == SCHEMA_VERSION


def test_encoding_is_canonical_json_with_sorted_ranks() -> None:
    record = PersistedRuntime(
        instance_id=InstanceId("decode-0"),
        phase=FtPhase.SCALING_DOWN,
        generation=7,
        original_dp_ranks=ranks([3, 0, 2, 1]),
        dead_committed=ranks([1]),
        fallback=FallbackStrategy.ENGINE_RELAUNCH,
        write_ahead=WriteAheadRecord(
            request_id=RequestId("r-42"), pending_removed=ranks([2]), phase=FtPhase.SCALING_DOWN
        ),
    )
    assert encode_runtime(record) == (
        b'{"dead_committed":[1],"fallback":"EngineRelaunch","generation":7,"instance_id":"decode-0",'
        b'"original_dp_ranks":[0,1,2,3],"phase":"SCALING_DOWN","schema":1,'
        b'"write_ahead":{"pending_removed":[2],"phase":"SCALING_DOWN","request_id":"r-42"}}'
    )


def test_a_record_that_would_not_load_back_is_never_encoded() -> None:
    record = PersistedRuntime(
        instance_id=InstanceId("i"),
        phase=FtPhase.NORMAL,
        generation=0,
        original_dp_ranks=ranks([0, 1]),
        dead_committed=ranks([5]),
        fallback=None,
    )
    with pytest.raises(ValueError, match="would not load back"):
        encode_runtime(record)


_MISSING = object()


def valid_document() -> dict[str, Any]:
    return {
        "schema": 1,
        "instance_id": "decode-0",
        "phase": "SCALING_DOWN",
        "generation": 3,
        "original_dp_ranks": [0, 1, 2, 3],
        "dead_committed": [1],
        "fallback": "InstanceReconfiguration",
        "write_ahead": {"request_id": "r-1", "pending_removed": [2], "phase": "SCALING_DOWN"},
    }


def with_changes(**changes: Any) -> bytes:
    document = valid_document()
    for key, value in changes.items():
        if value is _MISSING:
            del document[key]
        else:
            document[key] = value
    return json.dumps(document).encode()


def with_write_ahead(**changes: Any) -> bytes:
    write_ahead = {**valid_document()["write_ahead"], **changes}
    return with_changes(write_ahead=write_ahead)


def test_the_valid_document_used_below_decodes() -> None:
    record = decode_runtime(json.dumps(valid_document()).encode())
    assert record.dead_committed == ranks([1])
    assert record.write_ahead is not None
    assert record.write_ahead.pending_removed == ranks([2])


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"\xff", "not a JSON document", id="not-utf8"),
        pytest.param(b"", "not a JSON document", id="empty"),
        pytest.param(b"{", "not a JSON document", id="truncated"),
        pytest.param(b"[" * 100_000, "not a JSON document", id="deeply-nested"),
        pytest.param(b'{"schema": NaN}', "not a JSON document", id="nan"),
        pytest.param(b'{"schema": 1, "schema": 1}', "not a JSON document", id="repeated-key"),
        pytest.param(b"[]", "must be a JSON object", id="a-list"),
        pytest.param(b"null", "must be a JSON object", id="null"),
        pytest.param(with_changes(schema=2), "schema 1 only", id="future-schema"),
        pytest.param(with_changes(schema="1"), "schema 1 only", id="schema-as-text"),
        pytest.param(with_changes(schema=True), "schema 1 only", id="schema-as-bool"),
        pytest.param(with_changes(schema=_MISSING), "'schema' is None", id="no-schema"),
        pytest.param(with_changes(dead_committed=_MISSING), "lacks 'dead_committed'", id="missing-key"),
        pytest.param(with_changes(extra=1), "unknown 'extra'", id="unknown-key"),
        pytest.param(with_changes(phase="SCALING_UP"), "unknown phase 'SCALING_UP'", id="unknown-phase"),
        pytest.param(with_changes(phase=3), "must be a phase name", id="phase-not-text"),
        pytest.param(with_changes(fallback="Reboot"), "unknown strategy 'Reboot'", id="unknown-fallback"),
        pytest.param(with_changes(original_dp_ranks=[0, -1]), "negative rank -1", id="negative-rank"),
        pytest.param(with_changes(original_dp_ranks=[0, 0, 1]), "repeats rank 0", id="repeated-rank"),
        pytest.param(with_changes(original_dp_ranks=[0, 1.0]), "not an integer rank", id="float-rank"),
        pytest.param(with_changes(original_dp_ranks=[0, True]), "not an integer rank", id="bool-rank"),
        pytest.param(with_changes(original_dp_ranks=[0, "1"]), "not an integer rank", id="text-rank"),
        pytest.param(with_changes(original_dp_ranks="0,1"), "must be a list", id="ranks-not-a-list"),
        pytest.param(
            with_changes(original_dp_ranks=[], dead_committed=[], write_ahead=None), "is empty", id="no-ranks"
        ),
        pytest.param(with_changes(dead_committed=[1, 9]), "[9] are not in 'original_dp_ranks'", id="dead-not-subset"),
        pytest.param(with_changes(generation=-1), "non-negative integer", id="negative-generation"),
        pytest.param(with_changes(generation=1.5), "non-negative integer", id="float-generation"),
        pytest.param(with_changes(instance_id=""), "non-empty string", id="empty-instance-id"),
        pytest.param(with_changes(instance_id=7), "non-empty string", id="numeric-instance-id"),
        pytest.param(with_changes(write_ahead=[]), "'write_ahead' must be a JSON object", id="write-ahead-list"),
        pytest.param(with_write_ahead(pending_removed=[7]), "[7] are not original ranks", id="pending-not-subset"),
        pytest.param(with_write_ahead(phase="LATER"), "unknown phase 'LATER'", id="write-ahead-phase"),
        pytest.param(with_write_ahead(request_id=None), "request_id' must be", id="write-ahead-no-request-id"),
        pytest.param(with_write_ahead(extra=1), "unknown 'extra'", id="write-ahead-unknown-key"),
    ],
)
def test_malformed_records_are_corrupt_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(StoreCorruptError) as caught:
        decode_runtime(data, instance_id="decode-0")
    assert reason in caught.value.reason
    assert caught.value.instance_id == "decode-0"
    assert "decode-0" in str(caught.value)


def test_a_lone_surrogate_instance_id_is_corrupt() -> None:
    document = json.dumps({**valid_document(), "instance_id": "\udc80"}).encode()
    with pytest.raises(StoreCorruptError, match="not valid Unicode text"):
        decode_runtime(document)


def test_a_record_stored_under_another_key_is_corrupt() -> None:
    data = json.dumps(valid_document()).encode()
    with pytest.raises(StoreCorruptError, match="stored under 'decode-1' but the record is for 'decode-0'"):
        decode_runtime(data, instance_id="decode-1")
