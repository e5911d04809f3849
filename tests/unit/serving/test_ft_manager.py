"""EngineFtManager's poll decisions (F-1, F-51, F-53), pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from heteroflow.contracts.engine_protocol import EngineStatusEntry
from heteroflow.contracts.serving import FaultEvidence
from heteroflow.serving.node_manager.ft_manager import (
    Answered,
    Observation,
    Paused,
    PollState,
    ProtocolFailure,
    Unreachable,
    observe,
    revived,
)

HEALTHY = Answered(EngineStatusEntry(id=1, status="healthy"))
UNHEALTHY = Answered(EngineStatusEntry(id=1, status="unhealthy", fault_info="RuntimeError", mask=[1, 1]))
RECOVERING = Answered(
    EngineStatusEntry(id=1, status="unhealthy", fault_info="RuntimeError", mask=[1, 1], ft_state="recovering")
)
DEAD = Answered(EngineStatusEntry(id=1, status="dead"))


def run(observations: list[Observation]) -> tuple[PollState, list[tuple[str, FaultEvidence]]]:
    state = PollState()
    reports: list[tuple[str, FaultEvidence]] = []
    for obs in observations:
        state, finding = observe(state, obs)
        if finding is not None:
            reports.append((finding.status, finding.evidence))
    return state, reports


def test_reports_each_new_fault_once_and_remembers_healthy() -> None:
    _, reports = run([HEALTHY, UNHEALTHY, UNHEALTHY, HEALTHY, UNHEALTHY, DEAD, DEAD])
    assert reports == [
        ("unhealthy", FaultEvidence.FT_STATUS),
        ("unhealthy", FaultEvidence.FT_STATUS),
        ("dead", FaultEvidence.FT_STATUS),
    ]


def test_a_new_ft_state_is_a_new_signature() -> None:
    _, reports = run([UNHEALTHY, RECOVERING, RECOVERING])
    assert len(reports) == 2


def test_first_timeout_after_readiness_is_dead_evidence_once() -> None:
    state, reports = run([HEALTHY, Unreachable("status timed out after 1 s"), Unreachable("refused")])
    assert reports == [("dead", FaultEvidence.FT_UNREACHABLE)]
    assert state.dead_by_unreachability
    assert state.last == "dead"


def test_dead_then_gone_is_one_report_and_not_unreachability() -> None:
    state, reports = run([HEALTHY, DEAD, Unreachable("refused")])
    assert reports == [("dead", FaultEvidence.FT_STATUS)]
    assert not state.dead_by_unreachability


def test_protocol_failure_is_never_healthy_and_reported_once() -> None:
    bad = ProtocolFailure("status must carry exactly engine 1; got ids [2]")
    state, reports = run([bad, bad])
    assert reports == [("protocol_error", FaultEvidence.FT_PROTOCOL_ERROR)]
    assert state.last == "protocol_error"
    assert state.polls == 2


def test_retired_rank_revival() -> None:
    assert not revived(DEAD)
    assert not revived(Unreachable("refused"))
    assert revived(HEALTHY)
    assert revived(UNHEALTHY)
    assert revived(ProtocolFailure("x"))


OBS = st.sampled_from([HEALTHY, UNHEALTHY, RECOVERING, DEAD, Unreachable("t"), ProtocolFailure("p")])


@given(st.lists(OBS, max_size=30))
def test_never_two_reports_in_a_row_for_the_same_signature(observations: list[Observation]) -> None:
    state = PollState()
    last_reported = None
    for obs in observations:
        before = state.signature
        state, finding = observe(state, obs)
        if finding is not None:
            assert state.signature != before
            assert state.signature != last_reported or before != last_reported
            last_reported = state.signature
        if obs in (HEALTHY,):
            assert finding is None


def test_vllm_034_diagnosing_is_reported_as_itself_then_unhealthy_never_dead_or_a_protocol_error() -> None:
    diagnosing = Answered(EngineStatusEntry(id=1, status="diagnosing"))
    state, reports = run([HEALTHY, diagnosing, diagnosing, UNHEALTHY])
    assert reports == [("diagnosing", FaultEvidence.FT_STATUS), ("unhealthy", FaultEvidence.FT_STATUS)]
    assert state.last == "unhealthy"
    assert not state.dead_by_unreachability


def test_a_pause_by_an_elastic_ep_resize_reports_nothing_and_keeps_the_signature() -> None:
    paused = Paused("elastic EP: The model is currently scaling. Please try again later.")
    state, reports = run([HEALTHY, paused, paused, HEALTHY])
    assert reports == []
    assert state.last == "healthy"
    state, reports = run([UNHEALTHY, paused, UNHEALTHY])
    assert reports == [("unhealthy", FaultEvidence.FT_STATUS)]  # the same fault after the pause: not new
    state, _ = run([HEALTHY, paused])
    assert state.last == "paused"
    assert revived(paused)  # a retired rank's port answered: the process lives
