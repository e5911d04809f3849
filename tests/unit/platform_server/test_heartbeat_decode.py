"""The lean heartbeat path decodes a clean body in one step: what the route's ``json.loads`` and validation give
(the same model, or, from the typed decode of the common agent's body, the same readings and XID parts), and
nothing recorded that the route would refuse."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from heteroflow.contracts.heartbeat import Heartbeat
from heteroflow.core.ids import NodeId
from heteroflow.core.request_body import check_body
from heteroflow.health.beat_stats import WIRE_BEAT, BeatReadings, WireBeat, beat_readings
from heteroflow.platform_server.routes.nodes import decoded_heartbeat

RAW_NUMBERS = ("1e400", "-1e400", "1.5e-400", "-0", "-0.0", "1E+2", "01", "1.", ".5", "+1", "NaN", "Infinity")
"""Number spellings written as they are: valid JSON, or not JSON at all, or only ``json.loads``'s (NaN)."""
numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(RAW_NUMBERS),
)
texts = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E, exclude_characters='"\\'), max_size=8)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=12,
)


def render(value: object) -> str:
    """JSON text of ``value``; a string among :data:`RAW_NUMBERS` is written as it is (valid JSON or not)."""
    if isinstance(value, list):
        return "[" + ",".join(render(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f'"{key}":{render(item)}' for key, item in value.items()) + "}"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and value in RAW_NUMBERS:
        return value
    return json.dumps(value)


bodies = st.one_of(
    st.builds(
        lambda stats, extra, duplicate: (
            "{"
            + f'"gpu_stats":{render(stats)},"xid_collection":{render(extra)}'
            + (f',"gpu_stats":{render(duplicate)}' if duplicate is not None else "")
            + "}"
        ),
        st.lists(values, max_size=3),
        values,
        st.none() | st.lists(values, max_size=2),
    ),
    values.map(render),
)


def route_decoded(body: bytes) -> Heartbeat | None:
    try:
        return Heartbeat.model_validate(json.loads(body))
    except ValueError:
        return None


def assert_read_alike(got: Heartbeat | WireBeat, expected: Heartbeat) -> None:
    """The same model, or (from the typed decode) the same readings and XID parts."""
    if isinstance(got, WireBeat):
        assert readings(got) == readings(expected)
        assert repr((got.xid_events, got.xid_collection)) == repr((expected.xid_events, expected.xid_collection))
    else:
        assert repr(got.model_dump()) == repr(expected.model_dump())  # repr: a NaN equals itself, -0.0 is kept
        assert [type(v) for s in got.gpu_stats for v in s.values()] == [
            type(v) for s in expected.gpu_stats for v in s.values()
        ]


def readings(beat: Heartbeat | WireBeat) -> BeatReadings:
    return beat_readings(
        beat.gpu_stats, node_id=NodeId("n1"), source="real", received_at=datetime(2030, 1, 1, tzinfo=UTC)
    )


@settings(max_examples=400)
@given(bodies)
def test_a_clean_body_decodes_to_the_routes_model_or_is_refused_alike(text: str) -> None:
    body = text.encode()
    clean = check_body(body, max_bytes=1 << 20, max_depth=64, declared_json=True, strict_text=False)
    expected = route_decoded(body)
    got = decoded_heartbeat(body, clean=clean)
    assert (got is None) == (expected is None)
    if got is not None and expected is not None:
        assert_read_alike(got, expected)


def test_nesting_deeper_than_the_one_step_parser_takes_is_decided_as_the_route_decides() -> None:
    depth = min(600, sys.getrecursionlimit() // 2)
    # a counter the typed decode refuses (a string), so that pydantic's one-step parser is tried
    body = ('{"gpu_stats":[{"index":0,"retired_pages":"7","extra":' + "[" * depth + "]" * depth + "}]}").encode()
    with pytest.raises(msgspec.ValidationError):
        WIRE_BEAT.decode(body)
    with pytest.raises(ValidationError, match="recursion limit"):
        Heartbeat.model_validate_json(body)  # what this test is about: the one-step parser refuses it
    got, expected = decoded_heartbeat(body, clean=True), route_decoded(body)
    assert isinstance(got, Heartbeat)
    assert expected is not None
    assert_read_alike(got, expected)
    assert readings(got).health[0].key.gpu_index == 0
    assert readings(got).health[0].counters.retired_pages is None


def test_the_common_agents_body_is_typed_and_an_odd_value_goes_to_the_general_decode() -> None:
    stat = {"index": 0, "uuid": "GPU-a", "sampled_at": "2030-01-01T00:00:00+00:00", "ecc_corrected_total": 3}
    common = json.dumps({"gpu_stats": [stat, stat | {"index": 1, "temperature_c": 61}], "xid_collection": {"a": 1}})
    typed = decoded_heartbeat(common.encode(), clean=True)
    assert isinstance(typed, WireBeat)
    assert readings(typed) == readings(Heartbeat.model_validate_json(common))
    odd = json.dumps({"gpu_stats": [stat | {"ecc_corrected_total": "3"}]})
    general = decoded_heartbeat(odd.encode(), clean=True)
    assert isinstance(general, Heartbeat)
    assert readings(general).health[0].counters.ecc_corrected_total is None  # unknown, never a refusal of the beat
