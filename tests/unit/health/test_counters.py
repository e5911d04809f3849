from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.health.counters import COUNTER_MAX, HEALTH_KEYS, Counters, interned_counters, parse_counter

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=8,
)


@given(json_values)
def test_parse_counter_never_raises_and_never_invents_a_count(value: object) -> None:
    result = parse_counter(value)
    assert result is None or (isinstance(result, int) and not isinstance(result, bool) and 0 <= result <= COUNTER_MAX)


def test_unknown_forms_are_none_and_real_counts_survive() -> None:
    for value in (None, "[N/A]", "N/A", "12", "", -1, 1.5, float("nan"), float("inf"), True, False, [1], {"a": 1}):
        assert parse_counter(value) is None, value
    assert parse_counter(2**63) is None  # beyond the column: unknown, never clamped
    assert parse_counter(0) == 0
    assert parse_counter(7.0) == 7
    assert parse_counter(COUNTER_MAX) == COUNTER_MAX


@given(st.dictionaries(st.sampled_from([*HEALTH_KEYS, "index", "other"]), json_values))
def test_counters_from_any_stat(stat: dict[str, object]) -> None:
    counters = Counters.from_wire(stat)
    assert set(counters.as_dict()) == set(HEALTH_KEYS)
    for key in HEALTH_KEYS:
        assert counters.as_dict()[key] == parse_counter(stat.get(key))
    json.dumps(counters.as_dict())


def test_all_unknown() -> None:
    assert Counters().all_unknown
    assert not Counters(retired_pages=0).all_unknown  # a known zero is knowledge, not absence
    # worked out when the object is made: a changed copy has its own answer, and it is no counter
    assert dataclasses.replace(Counters(retired_pages=0), retired_pages=None).all_unknown
    assert not dataclasses.replace(Counters(), retired_pages=0).all_unknown
    assert list(Counters().as_dict()) == list(HEALTH_KEYS)
    assert Counters() == interned_counters((None,) * len(HEALTH_KEYS))


@pytest.mark.parametrize("name", HEALTH_KEYS)
def test_one_known_counter_of_any_kind_is_not_all_unknown(name: str) -> None:
    assert not Counters(**{name: 0}).all_unknown
