"""The lean heartbeat path decodes a clean body in one step: the same model as the route's ``json.loads`` and
validation, and nothing recorded that the route would refuse."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from heteroflow.contracts.heartbeat import Heartbeat
from heteroflow.core.request_body import check_body
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


@settings(max_examples=400)
@given(bodies)
def test_a_clean_body_decodes_to_the_routes_model_or_is_refused_alike(text: str) -> None:
    body = text.encode()
    clean = check_body(body, max_bytes=1 << 20, max_depth=64, declared_json=True, strict_text=False)
    expected = route_decoded(body)
    got = decoded_heartbeat(body, clean=clean)
    assert (got is None) == (expected is None)
    if got is not None and expected is not None:
        assert repr(got.model_dump()) == repr(expected.model_dump())  # repr: a NaN equals itself, -0.0 is kept
        assert [type(v) for s in got.gpu_stats for v in s.values()] == [
            type(v) for s in expected.gpu_stats for v in s.values()
        ]


def test_nesting_deeper_than_the_one_step_parser_takes_is_decided_as_the_route_decides() -> None:
    depth = min(600, sys.getrecursionlimit() // 2)
    body = ('{"gpu_stats":[],"extra":' + "[" * depth + "]" * depth + "}").encode()
    with pytest.raises(ValidationError, match="recursion limit"):
        Heartbeat.model_validate_json(body)  # what this test is about: the one-step parser refuses it
    assert decoded_heartbeat(body, clean=True) == route_decoded(body) is not None
