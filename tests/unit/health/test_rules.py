"""Rules v1-ecc-growth at their exact edges, and their invariants under hypothesis (H-30, H-31, H-3, H-4)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from heteroflow.core.ids import NodeId
from heteroflow.health.counters import Counters
from heteroflow.health.rules import CardView, RuleParams, Signal, boundary_instants, evaluate
from heteroflow.health.samples import Card, CardKey, StoredSample

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
P = RuleParams()
CARD = Card(node_id=NodeId("n"), gpu_index=0, uuid="GPU-0", source="real")
DAY = timedelta(days=1)


def sample(at: datetime, uuid: str | None = "GPU-0", **counters: int | None) -> StoredSample:
    return sample_with(at, counters, uuid)


def sample_with(at: datetime, counters: Mapping[str, int | None], uuid: str | None = "GPU-0") -> StoredSample:
    return StoredSample(key=CardKey(NodeId("n"), 0, "real"), uuid=uuid, sampled_at=at, counters=Counters(**counters))


def view_from(
    corrected: Callable[[float], int | None],
    *,
    now_counters: dict[str, int | None] | None = None,
    uuid: Callable[[float], str | None] = lambda _: "GPU-0",
    decreases: dict[str, datetime | None] | None = None,
) -> CardView:
    """A card whose corrected-ECC total at ``days`` before t0 is ``corrected(days)``; boundary samples sit on the
    instants themselves."""
    boundaries = {
        instant: sample(instant, uuid((T0 - instant) / DAY), ecc_corrected_total=corrected((T0 - instant) / DAY))
        for instant in boundary_instants(T0, P)
    }
    latest = sample_with(T0, {"ecc_corrected_total": corrected(0)} | (now_counters or {}))
    return CardView(card=CARD, latest=latest, boundaries=boundaries, last_decrease=decreases or {})


def from_increases(daily: list[int], base: int = 1000) -> Callable[[float], int | None]:
    """Counts from daily increases, oldest day first, ending at t0 (7 days of history)."""
    assert len(daily) == 7

    def at(days_before: float) -> int:
        whole = round(days_before)
        return base + sum(daily[: 7 - whole])

    return at


def codes(view: CardView) -> set[str]:
    return {s.code for s in evaluate(view, P).signals}


# -- strong signals ------------------------------------------------------------------------------------------


def test_strong_signals_fire_alone_and_unknown_is_never_zero() -> None:
    quiet = lambda d: 100  # noqa: E731
    assert "uncorrectable_ecc" in codes(view_from(quiet, now_counters={"ecc_uncorrected_total": 1}))
    assert "remap_failure" in codes(view_from(quiet, now_counters={"remapped_rows_failure": 1}))
    assert not evaluate(view_from(quiet, now_counters={"ecc_uncorrected_total": 0}), P).predicts
    # unknown uncorrectable and failure: no strong signal, never read as 0 or as > 0
    assert not evaluate(view_from(quiet, now_counters={"ecc_uncorrected_total": None}), P).predicts


# -- corrected-ECC growth: both conditions at their edges -------------------------------------------------------


def test_accelerating_card_predicts() -> None:
    view = view_from(from_increases([10, 10, 10, 10, 40, 60, 90]))
    evaluation = evaluate(view, P)
    assert evaluation.predicts
    assert [s.code for s in evaluation.signals] == ["corrected_ecc_growth"]
    assert "[40, 60, 90]" in evaluation.evidence


def test_minimum_increase_edge_32_versus_31() -> None:
    assert "corrected_ecc_growth" in codes(view_from(from_increases([0, 0, 0, 0, 10, 20, 32])))
    assert "corrected_ecc_growth" not in codes(view_from(from_increases([0, 0, 0, 0, 10, 20, 31])))


def test_ratio_edge_exactly_1_2_passes_just_below_fails() -> None:
    # 7-day total 350: a mean of 50 a day, so the last day needs at least 1.2 x 50 = 60
    at_edge = [55, 55, 55, 55, 20, 50, 60]
    below = [55, 55, 55, 55, 21, 50, 59]
    assert sum(at_edge) == sum(below) == 350
    assert "corrected_ecc_growth" in codes(view_from(from_increases(at_edge)))
    assert "corrected_ecc_growth" not in codes(view_from(from_increases(below)))
    stricter = evaluate(view_from(from_increases(at_edge)), RuleParams(ratio=1.2000001))
    assert "corrected_ecc_growth" not in {s.code for s in stricter.signals}


def test_strictly_increasing_windows_required() -> None:
    assert "corrected_ecc_growth" not in codes(view_from(from_increases([0, 0, 0, 0, 60, 60, 90])))
    assert "corrected_ecc_growth" not in codes(view_from(from_increases([0, 0, 0, 0, 70, 60, 90])))


@given(st.integers(min_value=0, max_value=10_000))
def test_a_constant_rate_never_predicts(rate: int) -> None:
    assert not evaluate(view_from(from_increases([rate] * 7)), P).predicts


@given(st.lists(st.integers(min_value=0, max_value=5000), min_size=7, max_size=7))
def test_a_decelerating_card_never_predicts(daily: list[int]) -> None:
    decelerating = sorted(daily, reverse=True)
    assert not evaluate(view_from(from_increases(decelerating)), P).predicts


@given(st.integers(min_value=0, max_value=50), st.integers(min_value=32, max_value=100_000), st.integers(0, 6))
def test_a_one_off_burst_never_predicts(rate: int, burst: int, day: int) -> None:
    daily = [rate] * 7
    daily[day] += burst
    assert not evaluate(view_from(from_increases(daily)), P).predicts


# -- unknown boundaries abandon the signal -------------------------------------------------------------------


ACCELERATING = from_increases([10, 10, 10, 10, 40, 60, 90])


@pytest.mark.parametrize("missing_day", [1, 2, 3, 7])
def test_an_unknown_boundary_abandons_the_signal(missing_day: int) -> None:
    view = view_from(lambda d: None if round(d) == missing_day else ACCELERATING(d))
    evaluation = evaluate(view, P)
    assert not evaluation.predicts
    assert any("ecc_corrected_total" in reason for reason in evaluation.abandoned)


def test_a_boundary_from_another_card_is_unknown() -> None:
    view = view_from(ACCELERATING, uuid=lambda d: "GPU-OLD" if d >= 2 else "GPU-0")
    assert not evaluate(view, P).predicts


def test_a_stale_boundary_is_unknown() -> None:
    view = view_from(ACCELERATING)
    instant = T0 - 3 * DAY
    stale = dict(view.boundaries)
    stale[instant] = sample(instant - timedelta(minutes=61), ecc_corrected_total=ACCELERATING(3))
    assert not evaluate(CardView(card=CARD, latest=view.latest, boundaries=stale), P).predicts


def test_never_an_increase_across_a_decrease() -> None:
    after_reset = view_from(ACCELERATING, decreases={"ecc_corrected_total": T0 - timedelta(hours=30)})
    assert not evaluate(after_reset, P).predicts
    before_window = view_from(ACCELERATING, decreases={"ecc_corrected_total": T0 - 8 * DAY})
    assert evaluate(before_window, P).predicts


def test_no_history_is_never_growth_from_zero() -> None:
    view = CardView(card=CARD, latest=sample(T0, ecc_corrected_total=10_000), boundaries={})
    assert not evaluate(view, P).predicts


# -- pending remaps and retired pages ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "now", "fires"),
    [(0, 1, True), (1, 1, False), (0, 0, False), (None, 1, False), (2, 1, False)],
)
def test_pending_and_retired_growth(start: int | None, now: int, fires: bool) -> None:
    for key, code in (("remapped_rows_pending", "pending_remap_growth"), ("retired_pages", "retired_pages_growth")):
        boundaries = {i: sample_with(i, {key: start}) for i in boundary_instants(T0, P)}
        view = CardView(card=CARD, latest=sample_with(T0, {key: now}), boundaries=boundaries)
        assert (code in {s.code for s in evaluate(view, P).signals}) is fires


# -- the weak layer gate -------------------------------------------------------------------------------------


weak = st.builds(lambda code, text: Signal("weak", code, text), st.text(min_size=1, max_size=10), st.text(max_size=30))


@given(st.lists(weak, max_size=5))
def test_weak_signals_never_predict_alone(signals: list[Signal]) -> None:
    quiet = view_from(lambda d: 100)
    assert not evaluate(quiet, P, weak_signals=signals).predicts


@given(st.lists(weak, min_size=1, max_size=3))
def test_weak_signals_ride_along_as_evidence(signals: list[Signal]) -> None:
    strong = view_from(lambda d: 100, now_counters={"ecc_uncorrected_total": 2})
    evaluation = evaluate(strong, P, weak_signals=signals)
    assert evaluation.predicts
    assert [s for s in evaluation.signals if s.layer == "weak"] == signals


def test_only_weak_signals_are_accepted_as_weak() -> None:
    with pytest.raises(ValueError, match="weak"):
        evaluate(view_from(lambda d: 1), P, weak_signals=[Signal("strong", "x", "y")])


def test_remap_failure_fires_when_the_flag_is_newly_set_not_while_it_stays_set() -> None:
    start = T0 - P.observation

    def view(flag_at_start: int | None, *, last_predicted: int | None = None) -> CardView:
        boundaries = {instant: sample(instant, ecc_corrected_total=100) for instant in boundary_instants(T0, P)}
        boundaries[start] = sample(start, ecc_corrected_total=100, remapped_rows_failure=flag_at_start)
        last_t0 = None
        if last_predicted is not None:
            last_t0 = T0 - timedelta(days=2)
            boundaries[last_t0] = sample(last_t0, ecc_corrected_total=100, remapped_rows_failure=last_predicted)
        latest = sample(T0, ecc_corrected_total=100, remapped_rows_failure=1)
        return CardView(card=CARD, latest=latest, boundaries=boundaries, last_decrease={}, last_predicted_t0=last_t0)

    newly = [s for s in evaluate(view(0), P).signals if s.code == "remap_failure"]
    assert len(newly) == 1
    assert "set since" in newly[0].evidence
    assert "remap_failure" not in codes(view(1))  # set for the whole observation period: not new
    assert "remap_failure" not in codes(view(0, last_predicted=1))  # already predicted on it
    assert "remap_failure" in codes(view(None))  # no earlier value known: new to us, as in the seed


# -- invariants over arbitrary views ------------------------------------------------------------------------------


optional_count = st.none() | st.integers(min_value=0, max_value=10**12)


@given(st.lists(optional_count, min_size=8, max_size=8), optional_count, optional_count)
def test_unknown_values_never_become_signals(values: list[int | None], ue: int | None, failure: int | None) -> None:
    view = view_from(
        lambda d: values[min(7, round(d))], now_counters={"ecc_uncorrected_total": ue, "remapped_rows_failure": failure}
    )
    evaluation = evaluate(view, P)
    found = {s.code for s in evaluation.signals}
    assert ("uncorrectable_ecc" in found) == (ue is not None and ue > 0)
    assert ("remap_failure" in found) == (failure is not None and failure > 0)
    needed = [values[0], values[1], values[2], values[3], values[7]]
    if any(v is None for v in needed):
        assert "corrected_ecc_growth" not in found


def _ue_view(
    before: int | None, now: int, *, decreased: datetime | None = None, predicted: tuple[datetime, int] | None = None
) -> CardView:
    boundaries: dict[datetime, StoredSample | None] = {
        instant: sample(instant, ecc_uncorrected_total=before) for instant in boundary_instants(T0, P)
    }
    if predicted is not None:
        boundaries[predicted[0]] = sample(predicted[0], ecc_uncorrected_total=predicted[1])
    return CardView(
        card=CARD,
        latest=sample(T0, ecc_uncorrected_total=now),
        boundaries=boundaries,
        last_decrease={"ecc_uncorrected_total": decreased},
        last_predicted_t0=predicted[0] if predicted else None,
    )


def test_the_strong_uncorrectable_signal_fires_on_growth_not_on_the_lifetime_total() -> None:
    assert "uncorrectable_ecc" not in codes(_ue_view(1, 1))  # one old error: context, not a signal
    assert "uncorrectable_ecc" in codes(_ue_view(1, 2))  # a new one in the observation period
    assert "uncorrectable_ecc" in codes(_ue_view(None, 1))  # first sight: no earlier value known
    # counted from 0 again after a driver reload: the values before the decrease are no reference
    assert "uncorrectable_ecc" in codes(_ue_view(5, 1, decreased=T0 - DAY))
    # new since the start of the observation period, but not since the card's last prediction
    assert "uncorrectable_ecc" not in codes(_ue_view(1, 2, predicted=(T0 - 2 * DAY, 2)))
    (signal,) = [s for s in evaluate(_ue_view(1, 3), P).signals if s.code == "uncorrectable_ecc"]
    assert "grew from 1 to 3" in signal.evidence
    assert "lifetime total 3" in signal.evidence


def test_a_correctable_error_flood_is_weak_evidence_never_a_prediction_alone() -> None:
    # a steady flood (the field case: billions of CEs at ~17,700 a second, no uncorrectable error): the same
    # increase every day, so the trend rule does not fire either
    steady = view_from(lambda d: 10**9 - round(d * 86_400 * 17_700))
    evaluation = evaluate(steady, P)
    assert [s.code for s in evaluation.signals] == ["corrected_ecc_flood"]
    assert evaluation.signals[0].layer == "weak"
    assert not evaluation.predicts
    assert "17700.0 a second" in evaluation.signals[0].evidence
    # beside an uncorrectable error it rides along as evidence of that prediction
    with_ue = view_from(lambda d: 10**9 - round(d * 86_400 * 17_700), now_counters={"ecc_uncorrected_total": 2})
    both = evaluate(with_ue, P)
    assert both.predicts
    assert {s.code for s in both.signals} == {"uncorrectable_ecc", "corrected_ecc_flood"}
    # below the configured rate, or with the start of the window unknown, nothing
    assert codes(view_from(lambda d: 10**6 - round(d * 86_400))) == set()
    slow = RuleParams(ce_flood_per_sec=20_000)
    assert "corrected_ecc_flood" not in {s.code for s in evaluate(steady, slow).signals}
    assert codes(view_from(lambda d: None if d >= 1 else 10**9)) == set()
