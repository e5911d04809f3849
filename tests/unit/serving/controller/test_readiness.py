"""A round's survivor polls (F-24, F-26, F-51; A10, A16)."""

from __future__ import annotations

import pytest

from heteroflow.serving.controller.core.readiness import PollLimits, after_apply, before_apply

from .helpers import entry

LIMITS = PollLimits(deadline=30.0)
SURVIVORS = (0, 2, 3)


def test_all_unhealthy_without_ft_state_is_apply_ready() -> None:
    got = before_apply([entry(r, "unhealthy") for r in SURVIVORS], survivors=SURVIVORS, limits=LIMITS, now=1.0)
    assert got.verdict == "ready"


@pytest.mark.parametrize(("status", "ft_state"), [("healthy", None), ("unhealthy", "recovering"), ("diagnosing", None)])
def test_healthy_or_recovering_keeps_polling(status: str, ft_state: str | None) -> None:
    polls = [entry(0, "unhealthy"), entry(2, status, ft_state=ft_state), entry(3, "unhealthy")]
    assert before_apply(polls, survivors=SURVIVORS, limits=LIMITS, now=1.0).verdict == "poll"


@pytest.mark.parametrize("error", [None, "not_running"])
def test_a10_a_survivor_turned_dead_is_absorbed(error: str | None) -> None:
    turned = entry(3, "dead") if error is None else entry(3, None, error=error)
    got = before_apply(
        [entry(0, "unhealthy"), entry(2, "unhealthy"), turned], survivors=SURVIVORS, limits=LIMITS, now=1
    )
    assert got.verdict == "absorb"
    assert got.absorbed == {3}


def test_a10_no_survivor_left_fails() -> None:
    got = before_apply([entry(r, "dead") for r in SURVIVORS], survivors=SURVIVORS, limits=LIMITS, now=1.0)
    assert got.verdict == "fail"
    assert "no survivor" in got.reason
    assert before_apply([], survivors=(), limits=LIMITS, now=1.0).verdict == "fail"


@pytest.mark.parametrize(
    "polls",
    [
        [entry(0, "unhealthy"), entry(2, "unhealthy")],  # missing
        [entry(0, "unhealthy"), entry(2, "unhealthy"), entry(3, "unhealthy", engine_id=1)],  # id mismatch
        [entry(0, "unhealthy"), entry(2, "unhealthy"), entry(3, "unhealthy", ft_state="failed")],
        [entry(0, "unhealthy"), entry(2, "unhealthy"), entry(3, None, error="protocol_error")],
        [entry(0, "unhealthy"), entry(2, "unhealthy"), entry(3, None, error="unreachable")],  # A16 query error
        [entry(r, "unhealthy") for r in (0, 1, 2, 3)],  # an answer for a rank not asked
    ],
)
def test_a16_before_apply_failures(polls: list[object]) -> None:
    assert before_apply(polls, survivors=SURVIVORS, limits=LIMITS, now=1.0).verdict == "fail"  # type: ignore[arg-type]


def test_a16_deadline_fails_both_stages() -> None:
    polls = [entry(r, "unhealthy") for r in SURVIVORS]
    assert before_apply(polls, survivors=SURVIVORS, limits=LIMITS, now=30.0).verdict == "fail"
    healthy = [entry(r, "healthy") for r in SURVIVORS]
    assert after_apply(healthy, survivors=SURVIVORS, request_id="r1", limits=LIMITS, now=30.0).verdict == "fail"


def test_f51_transient_query_errors_are_tolerated_only_when_configured() -> None:
    polls = [entry(0, "unhealthy"), entry(2, "unhealthy"), entry(3, None, error="unreachable")]
    tolerant = PollLimits(deadline=30.0, max_transient_query_errors=1)
    first = before_apply(polls, survivors=SURVIVORS, limits=tolerant, now=1.0)
    assert first.verdict == "poll"
    assert first.transient_errors == 1
    spent = PollLimits(deadline=30.0, max_transient_query_errors=1, transient_errors=1)
    assert before_apply(polls, survivors=SURVIVORS, limits=spent, now=2.0).verdict == "fail"


def test_f26_all_healthy_with_empty_ft_state_commits() -> None:
    polls = [entry(r, "healthy", last_ft_request_id="r1") for r in SURVIVORS]
    assert after_apply(polls, survivors=SURVIVORS, request_id="r1", limits=LIMITS, now=5.0).verdict == "commit"


@pytest.mark.parametrize(
    "bad",
    [
        entry(3, "dead"),
        entry(3, "unhealthy", ft_state="failed"),
        entry(3, "unhealthy", last_ft_request_id="r1", ft_error="status is HEALTHY"),
        entry(3, None, error="unreachable"),
        entry(3, None, error="not_running"),
    ],
)
def test_a16_after_apply_failures_never_ask_for_a_second_apply(bad: object) -> None:
    polls = [entry(0, "healthy"), entry(2, "healthy"), bad]
    got = after_apply(polls, survivors=SURVIVORS, request_id="r1", limits=LIMITS, now=5.0)  # type: ignore[arg-type]
    assert got.verdict == "fail"


def test_after_apply_keeps_polling_while_recovering() -> None:
    polls = [entry(0, "healthy"), entry(2, "unhealthy", ft_state="recovering"), entry(3, "healthy")]
    assert after_apply(polls, survivors=SURVIVORS, request_id="r1", limits=LIMITS, now=5.0).verdict == "poll"


def test_vllm_034_a_diagnosing_survivor_is_waited_for_never_a_failure_or_dead() -> None:
    polls = [entry(0, "diagnosing"), entry(2, "diagnosing"), entry(3, "unhealthy")]
    got = before_apply(polls, survivors=SURVIVORS, limits=LIMITS, now=1.0)
    assert (got.verdict, got.absorbed) == ("poll", frozenset())
    assert "rank 0 diagnosing" in got.reason


def test_vllm_034_a_terminal_failure_after_apply_is_told_from_a_retryable_one() -> None:
    terminal = entry(
        3, "dead", fault_info="Recovery failed; full restart required", ft_state="failed", ft_error="too few slots"
    )
    retryable = entry(3, "unhealthy", ft_state="failed", ft_error="[FT] Not all engines joined recovery round 'r1'")
    for bad, is_terminal in ((terminal, True), (retryable, False)):
        polls = [entry(0, "healthy"), entry(2, "healthy"), bad]
        got = after_apply(polls, survivors=SURVIVORS, request_id="r1", limits=LIMITS, now=5.0)
        assert (got.verdict, got.terminal) == ("fail", is_terminal)
