"""Which failures are first failures: the card's earliest event in the period, where no uncorrectable count above
0 was seen before it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from heteroflow.health.statistics import FailureEvent, PredictionWindow, first_failures, predicted_cards

T = datetime(2026, 3, 1, tzinfo=UTC)
H = timedelta(hours=1)


def test_first_failures_keep_each_cards_earliest_event_where_it_was_the_first_uncorrectable_error() -> None:
    events = [
        FailureEvent("n", 0, "GPU-a", T + 5 * H),  # first ever (its count first seen above 0 here)
        FailureEvent("n", 0, "GPU-a", T + 9 * H),  # the same card again: a recurrence
        FailureEvent("n", 1, "GPU-b", T + 5 * H),  # count above 0 before: a recurrence
        FailureEvent("n", 2, "GPU-c", T + 3 * H),  # an XID, no count ever above 0: first
    ]
    first_seen: dict[tuple[str, int, str | None], datetime] = {
        ("n", 0, "GPU-a"): T + 5 * H,
        ("n", 1, "GPU-b"): T + 1 * H,
    }
    firsts = first_failures(events, first_seen)
    assert sorted((e.gpu_index, e.at) for e in firsts) == [(0, T + 5 * H), (2, T + 3 * H)]
    windows = [
        PredictionWindow("n", 0, "GPU-a", 7, T + 6 * H, T + 100 * H),  # predicted only the recurrence
        PredictionWindow("n", 2, "GPU-c", 7, T, T + 100 * H),
    ]
    assert predicted_cards(events, windows, window_days=7) == {("n", 0, "GPU-a"), ("n", 2, "GPU-c")}
    assert predicted_cards(firsts, windows, window_days=7) == {("n", 2, "GPU-c")}
