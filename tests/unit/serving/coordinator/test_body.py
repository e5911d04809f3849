"""Body validation of the OpenAI routes: every malformed body is a 4xx with a sentence, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.serving.coordinator.body import MAX_JSON_DEPTH, nesting_depth, parse_inference_body
from heteroflow.serving.coordinator.errors import BadRequestError, BodyTooLargeError

LIMIT = 1024 * 1024


def nested(depth: int) -> Any:
    """A body whose nesting depth is exactly ``depth`` (the top-level object counts as 1)."""
    value: Any = 1
    for _ in range(depth - 1):
        value = [value]
    return {"model": "m", "x": value} if depth > 1 else {"model": "m"}


def test_a_valid_body_gives_the_routing_facts_and_keeps_the_bytes() -> None:
    raw = b'{"model": "llama", "prompt": "hi", "stream": true}'
    parsed = parse_inference_body(raw, max_bytes=LIMIT)
    assert (parsed.model, parsed.stream, parsed.raw) == ("llama", True, raw)
    assert parse_inference_body(b'{"model": "m", "stream": null}', max_bytes=LIMIT).stream is False


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "empty"),
        (b"   ", "empty"),
        (b"{not json", "not valid JSON"),
        (b'{"model": "m",}', "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'"model"', "JSON object"),
        (b'{"prompt": "x"}', "'model' is required"),
        (b'{"model": 5}', "non-empty string"),
        (b'{"model": ["m"]}', "non-empty string"),
        (b'{"model": "  "}', "non-empty string"),
        (b'{"model": "m", "stream": "yes"}', "'stream' must be a boolean"),
        (b'{"model": "m\xff"}', "UTF-8"),
        (b"\xef\xbb\xbf{}", "not valid JSON"),
    ],
)
def test_malformed_bodies_are_400_with_a_message(raw: bytes, message: str) -> None:
    with pytest.raises(BadRequestError) as caught:
        parse_inference_body(raw, max_bytes=LIMIT)
    assert message in caught.value.message
    assert caught.value.status_code == 400


def test_a_body_over_the_limit_is_413() -> None:
    raw = json.dumps({"model": "m", "prompt": "x" * 2000}).encode()
    with pytest.raises(BodyTooLargeError) as caught:
        parse_inference_body(raw, max_bytes=1024)
    assert caught.value.status_code == 413
    assert "1024 bytes" in caught.value.message


def test_nesting_up_to_the_limit_is_accepted_and_one_more_is_refused() -> None:
    assert parse_inference_body(json.dumps(nested(MAX_JSON_DEPTH)).encode(), max_bytes=LIMIT).model == "m"
    with pytest.raises(BadRequestError, match="nested deeper than 64"):
        parse_inference_body(json.dumps(nested(MAX_JSON_DEPTH + 1)).encode(), max_bytes=LIMIT)


def test_a_hostile_depth_is_refused_without_recursing() -> None:
    raw = b'{"model": "m", "x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with pytest.raises(BadRequestError, match="nested deeper"):
        parse_inference_body(raw, max_bytes=LIMIT)


def test_brackets_inside_strings_do_not_count() -> None:
    raw = json.dumps({"model": "m", "prompt": "[{" * 500}).encode()
    assert parse_inference_body(raw, max_bytes=LIMIT).model == "m"


def test_many_shallow_containers_are_fine() -> None:
    raw = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}] * 500}).encode()
    assert parse_inference_body(raw, max_bytes=LIMIT).model == "m"


def reference_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    return 0


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4),
    max_leaves=40,
)


@given(JSON)
def test_nesting_depth_matches_a_recursive_definition(value: Any) -> None:
    assert nesting_depth(value, limit=MAX_JSON_DEPTH) == reference_depth(value)
    assert nesting_depth(value, limit=1) == min(reference_depth(value), 2)
