from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.agent.parsing import add_counts, parse_count, parse_flag, parse_measure
from heteroflow.health.counters import COUNTER_MAX

SENTINELS = [
    "[N/A]",
    "N/A",
    "[Not Supported]",
    "[Unknown Error]",
    "[Insufficient Permissions]",
    "[GPU requires reset]",
    "ERR!",
    "",
    "   ",
    "[Requested functionality has been deprecated]",
]


@pytest.mark.parametrize("text", SENTINELS)
def test_every_sentinel_is_unknown_never_zero(text: str) -> None:
    assert parse_count(text) is None
    assert parse_flag(text) is None
    assert parse_measure(text) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0", 0),
        (" 12 ", 12),
        ("55000000000", 55_000_000_000),
        ("+7", 7),
        (str(COUNTER_MAX - 2**10), COUNTER_MAX - 2**10),
    ],
)
def test_counts_read_as_written(text: str, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize(
    "text",
    ["-1", "-0x1", "1.5", "12abc", "0x10", "Yes", str(2**63), str(2**64), "0x7ffffffffffffff0", str(COUNTER_MAX)],
)
def test_negative_huge_fractional_and_blank_counts_are_unknown(text: str) -> None:
    # COUNTER_MAX itself lies in NVML/DCGM's blank-sentinel range (>= 0x7ffffffffffffff0): not a count.
    assert parse_count(text) is None


@pytest.mark.parametrize(("text", "expected"), [("Yes", 1), ("No", 0), ("yes", 1), ("NO", 0), ("1", 1), ("0", 0)])
def test_yes_no_are_flags_not_unknown(text: str, expected: int) -> None:
    assert parse_flag(text) == expected


@pytest.mark.parametrize("text", ["2", "-1", "Pending", "True"])
def test_other_flag_values_are_unknown(text: str) -> None:
    assert parse_flag(text) is None


@pytest.mark.parametrize(
    ("text", "expected"), [("43", 43.0), ("26.20 W", 26.2), ("35C", 35.0), ("0 %", 0.0), ("596 MiB", 596.0)]
)
def test_measures_accept_a_unit(text: str, expected: float) -> None:
    assert parse_measure(text) == expected


@pytest.mark.parametrize("text", ["-5", "nan", "inf", "12 W extra", "W"])
def test_unreadable_measures_are_unknown(text: str) -> None:
    assert parse_measure(text) is None


def test_a_partial_sum_is_unknown() -> None:
    assert add_counts(1, 2) == 3
    assert add_counts(1, None) is None
    assert add_counts(COUNTER_MAX, 1) is None


@given(st.one_of(st.text(max_size=80), st.integers(), st.none(), st.binary(max_size=10)))
def test_parsers_never_raise_and_never_return_a_negative_count(value: object) -> None:
    count = parse_count(value)
    flag = parse_flag(value)
    measure = parse_measure(value)
    assert count is None or (type(count) is int and 0 <= count <= COUNTER_MAX)
    assert flag in (None, 0, 1)
    assert measure is None or measure >= 0


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_integer_text_round_trips_only_inside_the_counter_range(number: int) -> None:
    parsed = parse_count(str(number))
    if 0 <= number < 0x7FFFFFFFFFFFFFF0:
        assert parsed == number
    else:
        assert parsed is None
