"""The log of disturbed requests: only disturbed ones count, a window selects by overlap, a full log says so."""

from __future__ import annotations

from heteroflow.serving.coordinator.client_outcomes import ClientOutcomes, Disturbance


def _entry(
    model: str,
    start: float,
    end: float,
    *,
    held: bool = False,
    rerouted: bool = False,
    resumed: bool = False,
    failed: bool = False,
) -> Disturbance:
    entry = Disturbance(model=model, arrived_at=start, held=held, rerouted=rerouted, resumed=resumed, failed=failed)
    entry.wait_sec = end - start
    entry.ended_at = end
    return entry


def test_window_counts_each_kind_and_the_longest_wait() -> None:
    log = ClientOutcomes()
    log.record(_entry("m", 10.0, 17.5, held=True))  # held 7.5 s
    log.record(_entry("m", 11.0, 11.2, rerouted=True))
    log.record(_entry("m", 12.0, 12.1, held=True, rerouted=True))
    log.record(_entry("m", 12.0, 13.0, resumed=True))
    log.record(_entry("m", 12.0, 42.0, held=True, failed=True))
    log.record(_entry("m", 12.0, 12.0))  # undisturbed: never logged
    log.record(_entry("other", 12.0, 14.0, held=True))
    log.record(_entry("m", 1.0, 2.0, held=True))  # before the window
    found = log.summary(since=9.0, until=20.0, model="m")
    assert found == {
        "held": 3,
        "rerouted": 2,
        "resumed": 1,
        "failed": 1,
        "longest_wait_sec": 30.0,
        "complete": True,
    }


def test_an_instance_selects_the_requests_that_met_it_and_no_match_has_no_wait() -> None:
    log = ClientOutcomes()
    met = _entry("m2", 5.0, 6.0, rerouted=True)
    met.instances.add("inst-1")
    log.record(met)
    assert log.summary(since=0.0, until=10.0, model="nope", instance_id="inst-1")["rerouted"] == 1
    empty = log.summary(since=0.0, until=10.0, model="nope", instance_id="inst-9")
    assert (empty["held"], empty["longest_wait_sec"]) == (0, None)


def test_a_log_that_dropped_entries_of_the_window_says_it_is_incomplete() -> None:
    log = ClientOutcomes(size=2)
    for start in (1.0, 2.0, 3.0):
        log.record(_entry("m", start, start + 0.5, held=True))
    assert log.summary(since=0.0, until=10.0)["complete"] is False  # the entry of 1.0-1.5 is gone
    assert log.summary(since=2.0, until=10.0) == {
        "held": 2,
        "rerouted": 0,
        "resumed": 0,
        "failed": 0,
        "longest_wait_sec": 0.5,
        "complete": True,
    }
