"""F-30: FtPhase's only legal transitions; every other pair raises a typed error."""

from __future__ import annotations

import itertools

import pytest

from heteroflow.serving.controller.core.errors import FtCoreError, IllegalTransitionError
from heteroflow.serving.controller.core.phase import (
    LEGAL_TRANSITIONS,
    ROUND_PHASES,
    FtPhase,
    suppresses_partial_loss_shutdown,
    transition,
)

P = FtPhase
EXPECTED = {
    (P.DISABLED, P.NORMAL),
    (P.NORMAL, P.DISABLED),
    (P.NORMAL, P.DECIDING),
    (P.SCALED_DOWN_RUNNING, P.DECIDING),
    (P.DECIDING, P.WAITING_ENGINE_FAULT),
    (P.DECIDING, P.SCALING_DOWN),
    (P.WAITING_ENGINE_FAULT, P.SCALING_DOWN),
    (P.SCALING_DOWN, P.POST_SCALE_CLEANUP),
    (P.POST_SCALE_CLEANUP, P.SCALED_DOWN_RUNNING),
    (P.DECIDING, P.RECONFIGURING),
    (P.WAITING_ENGINE_FAULT, P.RECONFIGURING),
    (P.SCALING_DOWN, P.RECONFIGURING),
    (P.POST_SCALE_CLEANUP, P.RECONFIGURING),
    (P.NORMAL, P.RECONFIGURING),
    (P.SCALED_DOWN_RUNNING, P.RECONFIGURING),
    (P.RECONFIGURING, P.NORMAL),
    (P.RECONFIGURING, P.SCALED_DOWN_RUNNING),
}


def test_the_table_is_exactly_f30() -> None:
    assert LEGAL_TRANSITIONS == EXPECTED


@pytest.mark.parametrize(("current", "target"), sorted(EXPECTED))
def test_every_legal_transition_returns_the_target(current: FtPhase, target: FtPhase) -> None:
    assert transition(current, target) is target


@pytest.mark.parametrize(
    ("current", "target"), [pair for pair in itertools.product(FtPhase, FtPhase) if pair not in EXPECTED]
)
def test_every_other_pair_raises_a_typed_error(current: FtPhase, target: FtPhase) -> None:
    with pytest.raises(IllegalTransitionError) as caught:
        transition(current, target)
    assert isinstance(caught.value, FtCoreError)
    assert (caught.value.current, caught.value.target) == (current.value, target.value)


def test_only_round_phases_suppress_the_partial_loss_shutdown() -> None:
    """F-33: the transaction window protects; NORMAL, SCALED_DOWN_RUNNING and RECONFIGURING do not."""
    assert (
        {p for p in FtPhase if suppresses_partial_loss_shutdown(p)}
        == ROUND_PHASES
        == {
            P.DECIDING,
            P.WAITING_ENGINE_FAULT,
            P.SCALING_DOWN,
            P.POST_SCALE_CLEANUP,
        }
    )
