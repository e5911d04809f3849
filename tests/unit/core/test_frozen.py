"""Slot builders: the same frozen dataclass as its own constructor builds, and a class they cannot fill refused."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from heteroflow.core.frozen import slot_builder
from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.sample_times import TimeFix
from heteroflow.health.samples import CardKey, HealthReading


def test_a_built_reading_equals_the_constructed_one_and_stays_frozen() -> None:
    build = slot_builder(HealthReading, ("key", "uuid", "sampled_at", "counters", "time_fix", "semantics_unconfirmed"))
    key = CardKey(NodeId("n1"), 3, "real")
    at = datetime(2026, 3, 1, tzinfo=UTC)
    args = (key, "GPU-1", at, Counters(ecc_corrected_total=4), TimeFix.AHEAD, ("retired_pages",))
    built = build(*args)
    assert type(built) is HealthReading
    assert built == HealthReading(*args)
    assert hash(built) == hash(HealthReading(*args))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.uuid = "GPU-2"  # type: ignore[misc]


@dataclasses.dataclass(frozen=True, slots=True)
class _Four:
    a: int
    b: int
    c: int
    d: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    a: int
    b: int
    c: int
    d: int

    def __post_init__(self) -> None:
        raise ValueError


def test_fields_named_otherwise_or_a_post_init_are_refused() -> None:
    assert slot_builder(_Four, ("a", "b", "c", "d"))(1, 2, 3, 4) == _Four(1, 2, 3, 4)
    with pytest.raises(TypeError, match="fields"):
        slot_builder(_Four, ("a", "b", "d", "c"))  # a field order that would swap two values
    with pytest.raises(TypeError, match="fields"):
        slot_builder(_Four, ("a", "b", "c"))  # a field left unset
    with pytest.raises(TypeError, match="__post_init__"):
        slot_builder(_Checked, ("a", "b", "c", "d"))


@dataclasses.dataclass(frozen=True, slots=True)
class _One:
    a: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Nine:
    a: int
    b: int
    c: int
    d: int
    e: int
    f: int
    g: int
    h: int
    i: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Empty:
    pass


def test_any_field_count_gets_a_builder_and_no_fields_is_refused() -> None:
    assert slot_builder(_One, ("a",))(7) == _One(7)
    nine = slot_builder(_Nine, tuple("abcdefghi"))(*range(9))
    assert nine == _Nine(*range(9))
    with pytest.raises(dataclasses.FrozenInstanceError):
        nine.a = 1  # type: ignore[misc]
    with pytest.raises(TypeError, match="fields"):
        slot_builder(_Empty, ())
