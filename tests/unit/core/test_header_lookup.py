"""A request's headers are looked up through a table made at the first lookup (``core/authentication.header``);
the answers are those of a walk of the list: names in any case, the first of a repeated header, and a list
replaced after the first lookup is read again."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from heteroflow.core.authentication import bearer_of, header

NAMES = st.sampled_from([b"authorization", b"Authorization", b"content-type", b"X-Node-Credential", b"x-a"])


def walked(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


@given(st.lists(st.tuples(NAMES, st.binary(max_size=8)), max_size=8), st.lists(NAMES, min_size=1, max_size=5))
def test_a_lookup_answers_what_a_walk_of_the_list_answers(
    headers: list[tuple[bytes, bytes]], asked: list[bytes]
) -> None:
    scope: dict[str, Any] = {"headers": headers}
    for name in asked:
        assert header(scope, name.lower()) == walked(headers, name.lower())


def test_a_replaced_header_list_is_read_again() -> None:
    scope: dict[str, Any] = {"headers": [(b"authorization", b"Bearer first")]}
    assert bearer_of(scope) == "first"
    scope["headers"] = [(b"authorization", b"Bearer second"), (b"authorization", b"Bearer third")]
    assert bearer_of(scope) == "second"
    scope["headers"] = []
    assert bearer_of(scope) is None
