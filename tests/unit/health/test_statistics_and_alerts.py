from __future__ import annotations

from heteroflow.health.alerts import PredictedFault, predicted_fault_message, resolution_by_backfill
from heteroflow.health.statistics import BandCounts, Exposure, band_statistics, disclaimer


def counts(hit: int, miss: int, voided: int = 0, failed: int = 4, predicted: int = 1) -> BandCounts:
    return BandCounts(
        window_days=7, pending=2, hit=hit, miss=miss, voided=voided, failed_cards=failed, predicted_cards=predicted
    )


def test_ratios_are_null_below_the_thresholds_with_reasons() -> None:
    thin = band_statistics(counts(3, 5, voided=40), Exposure(10, 30.0, 3.5), min_matured=20, min_span_days=8)
    assert thin.precision is None
    assert thin.recall is None
    assert thin.insufficient == (
        "8 of ≥ 20 matured predictions (hit + miss; voided excluded)",
        "observed 3.5 of ≥ 8 days",
    )
    unknown_span = band_statistics(counts(30, 5), Exposure(0, 0.0, None), min_matured=20, min_span_days=8)
    assert unknown_span.precision is None
    assert "unknown" in unknown_span.insufficient[0]


def test_ratios_when_the_evidence_suffices_and_the_denominators_stay_apart() -> None:
    stats = band_statistics(
        counts(15, 5, voided=100, failed=4, predicted=3), Exposure(10, 90.0, 9.0), min_matured=20, min_span_days=8
    )
    assert stats.precision == 0.75  # voided never in the denominator
    assert stats.recall == 0.75
    assert stats.missed_cards == 1
    no_failures = band_statistics(
        counts(15, 5, failed=0, predicted=0), Exposure(10, 90.0, 9.0), min_matured=20, min_span_days=8
    )
    assert no_failures.recall is None
    assert no_failures.precision == 0.75


def test_disclaimer_names_the_gates() -> None:
    text = disclaimer(min_matured=20, min_span_days=8)
    assert "experimental" in text
    assert "20" in text
    assert "8 days" in text


def test_alert_text_predicts_and_never_claims_a_failure_or_accuracy() -> None:
    message = predicted_fault_message(PredictedFault("gpu-7", 3, "GPU-3", 7, "v1-ecc-growth", "strong signal [x]: y"))
    assert "predicted" in message
    assert "7 days" in message
    assert "v1-ecc-growth" in message
    assert "strong signal" in message
    lowered = message.lower()
    assert "failed" not in lowered
    assert "accura" not in lowered
    assert "precision" not in lowered


def test_backfill_resolves_only_when_every_slot_latest_is_a_miss() -> None:
    assert resolution_by_backfill({0: "miss", 1: "miss"}, any_hit=False) is not None
    assert resolution_by_backfill({0: "miss", 1: "pending"}, any_hit=False) is None
    assert resolution_by_backfill({0: "miss", 1: "voided"}, any_hit=False) is None
    assert resolution_by_backfill({0: "miss"}, any_hit=True) is None
    assert resolution_by_backfill({}, any_hit=False) is None


def test_predicted_cards_need_the_same_card_band_and_a_window_holding_the_failure() -> None:
    from datetime import UTC, datetime, timedelta

    from heteroflow.health.statistics import FailureEvent, PredictionWindow, predicted_cards

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    day = timedelta(days=1)
    events = [
        FailureEvent("n", 0, "A", t0 + 3 * day),
        FailureEvent("n", 1, "B", t0 + 3 * day),
        FailureEvent("n", 2, None, t0 + 7 * day),
        FailureEvent("n", 3, "D", t0),
    ]
    windows = [
        PredictionWindow("n", 0, "A", 7, t0, t0 + 7 * day),  # holds the failure
        PredictionWindow("n", 1, "OTHER", 7, t0, t0 + 7 * day),  # another card in the slot
        PredictionWindow("n", 2, None, 7, t0, t0 + 7 * day),  # right-closed: the end is inside
        PredictionWindow("n", 3, "D", 7, t0, t0 + 7 * day),  # left-open: t0 itself is not
        PredictionWindow("n", 1, "B", 30, t0, t0 + 30 * day),  # the other band
    ]
    assert predicted_cards(events, windows, window_days=7) == {("n", 0, "A"), ("n", 2, None)}
    assert predicted_cards(events, windows, window_days=30) == {("n", 1, "B")}
