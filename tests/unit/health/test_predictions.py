"""Backfill judgements (H-40) and prediction identity (H-33)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.predictions import XidObservation, judge, prediction_id, window_end, window_over_at
from heteroflow.health.samples import Card, CardKey, StoredSample

T0 = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
END = window_end(T0, 7)
CARD = Card(node_id=NodeId("n"), gpu_index=3, uuid="GPU-3", source="real")
US = timedelta(microseconds=1)


def s(at: datetime, ue: int | None, uuid: str | None = "GPU-3") -> StoredSample:
    return StoredSample(
        key=CardKey(NodeId("n"), 3, "real"), uuid=uuid, sampled_at=at, counters=Counters(ecc_uncorrected_total=ue)
    )


def run(samples: list[StoredSample], now: datetime = END, xids: list[XidObservation] | None = None) -> str | None:
    verdict = judge(card=CARD, t0=T0, end=END, now=now, samples=samples, xids=xids or [])
    return None if verdict is None else verdict.status


def test_no_judgement_before_the_window_expires_not_even_a_hit() -> None:
    assert run([s(T0, 0), s(T0 + timedelta(days=1), 5)], now=END - US) is None


def test_window_is_left_open_and_right_closed_to_the_microsecond() -> None:
    assert run([s(T0, 0), s(END, 1)]) == "hit"  # growth exactly at t0 + N is inside
    assert run([s(T0, 0), s(END - US, 0), s(END + US, 1)], now=END + US) == "miss"  # one microsecond later is not
    assert run([s(T0, 0)]) == "voided"  # the t0 sample itself is not a new observation


def test_miss_needs_a_sample_and_no_growth_and_voided_is_never_miss() -> None:
    assert run([s(T0, 2), s(T0 + timedelta(days=2), 2), s(T0 + timedelta(days=6), 2)]) == "miss"
    assert run([]) == "voided"
    verdict = judge(card=CARD, t0=T0, end=END, now=END, samples=[s(T0, 0)])
    assert verdict is not None
    assert "no sample inside the window" in verdict.conclusion


def test_a_card_swap_voids_unless_the_predicted_card_grew_first() -> None:
    swapped = [s(T0, 0), s(T0 + timedelta(days=1), 0), s(T0 + timedelta(days=2), 0, uuid="GPU-NEW")]
    assert run(swapped) == "voided"
    failed_then_swapped = [s(T0, 0), s(T0 + timedelta(days=1), 4), s(T0 + timedelta(days=2), 0, uuid="GPU-NEW")]
    assert run(failed_then_swapped) == "hit"


def test_a_counter_reset_is_neither_growth_nor_void() -> None:
    reset = [s(T0, 9), s(T0 + timedelta(days=1), 0), s(T0 + timedelta(days=2), 0)]
    assert run(reset) == "miss"
    grew_after_reset = [s(T0, 9), s(T0 + timedelta(days=1), 0), s(T0 + timedelta(days=2), 1)]
    assert run(grew_after_reset) == "hit"


def test_unknown_values_are_skipped_not_read_as_zero() -> None:
    assert run([s(T0, 3), s(T0 + timedelta(days=1), None), s(T0 + timedelta(days=2), 3)]) == "miss"
    assert run([s(T0, None), s(T0 + timedelta(days=1), 3)]) == "miss"  # no known value before: no step


def test_counted_xids_hit_inside_the_window_only() -> None:
    inside = [s(T0, 0), s(T0 + timedelta(days=1), 0)]

    def xid(code: int, at: datetime, uuid: str = "GPU-3") -> XidObservation:
        return XidObservation(3, uuid, code, at)

    assert run(inside, xids=[xid(48, T0 + timedelta(hours=5))]) == "hit"
    assert run(inside, xids=[xid(171, END)]) == "hit"
    assert run(inside, xids=[xid(79, T0 + timedelta(hours=5))]) == "miss"  # fell off the bus: recorded, not counted
    assert run(inside, xids=[xid(48, T0)]) == "miss"  # not after t0
    assert run(inside, xids=[xid(48, T0 + timedelta(hours=5), uuid="GPU-OTHER")]) == "miss"
    assert run([s(T0, 0)], xids=[xid(48, T0 + timedelta(hours=5))]) == "voided"  # an XID without samples stays voided


def test_hit_records_when_the_failure_was_seen() -> None:
    at = T0 + timedelta(days=3)
    verdict = judge(card=CARD, t0=T0, end=END, now=END, samples=[s(T0, 0), s(at, 1)])
    assert verdict is not None
    assert verdict.failure_at == at


def test_prediction_ids_are_derived_from_the_data_not_the_clock() -> None:
    a = prediction_id(CARD, rule_version="v1-ecc-growth", window_days=7, t0=T0)
    assert a == prediction_id(CARD, rule_version="v1-ecc-growth", window_days=7, t0=T0)
    assert a != prediction_id(CARD, rule_version="v1-ecc-growth", window_days=30, t0=T0)
    assert a != prediction_id(CARD, rule_version="v1-ecc-growth", window_days=7, t0=T0 + US)
    no_uuid = Card(node_id=CARD.node_id, gpu_index=3, uuid=None, source="real")
    assert a != prediction_id(no_uuid, rule_version="v1-ecc-growth", window_days=7, t0=T0)


def test_a_window_whose_uncorrectable_count_was_never_known_is_voided_not_a_miss() -> None:
    unobservable = [s(T0, 0), s(T0 + timedelta(days=1), None), s(T0 + timedelta(days=6), None)]  # ECC turned off
    verdict = judge(card=CARD, t0=T0, end=END, now=END, samples=unobservable)
    assert verdict is not None
    assert verdict.status == "voided"
    assert "unknown in every sample" in verdict.conclusion
    xid = XidObservation(3, "GPU-3", 95, T0 + timedelta(days=2))
    assert run(unobservable, xids=[xid]) == "hit"  # what was observed still counts


def test_a_window_over_at_creation_is_never_predicted() -> None:
    assert window_over_at(T0, 7, now=END)
    assert window_over_at(T0, 7, now=T0 + timedelta(days=10))
    assert not window_over_at(T0, 7, now=END - US)
