"""EngineFtManager's decisions (F-1, F-51, F-53): what one status poll means. Purely computational.

The shell (``daemon.py``) polls each ready engine's ``GET {prefix}/fault_tolerance/status`` every
``engine_ft_poll_interval_sec`` with ``engine_ft_status_timeout_sec`` and feeds each outcome here as an
:data:`Observation`. The answer says whether to report, and what.

- A report goes out when the status *signature* changes (healthy included in the memory, so
  healthy → unhealthy → healthy → unhealthy reports twice, while a steady unhealthy reports once).
- Once the engine has been ready (the poller starts only then), the first timeout or connection failure
  is DEAD evidence (RFC §4.4) — unlike the controller's transactional query, where it fails the round.
  DEAD keeps one signature whatever its source, so a ``dead`` answer followed by the engine's exit is one
  report, not two.
- ``diagnosing`` (vLLM 0.34: a faulted engine querying its all2all mask) is a fault that cannot take a
  command yet: reported as ``diagnosing``, never DEAD, never a protocol error; the ``unhealthy`` (or ``dead``)
  that follows is a new signature and a new report.
- An answer that breaks the consumer rule (missing, duplicate or unknown id) is a protocol error: never
  healthy, never DEAD (it authorises no removal); reported once so the controller's snapshot stays
  incomplete rather than healthy.
- A retired rank is watched at a low rate (F-53): dead or gone is expected; any other answer means it
  came back to life — a fencing violation.
- vLLM 0.34's elastic EP gate answering the status route (503 with its text: a resize commits, or a scale-down
  retired the rank) pauses the engine without a fault: no report and no protocol error; the signature last seen
  stands (status ``paused``), so the answer after the resize is judged against it. The resize itself marks the
  world (below), which keeps scale-down away from it.
- An engine with elastic EP (vLLM 0.34, ``--enable-elastic-ep``) is also asked where its last resize stands
  (:func:`elastic_resize`): a resize that ran or runs changed its world behind the NodeManager's back.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from heteroflow.contracts.engine_protocol import EngineStatusEntry
from heteroflow.contracts.serving import FaultEvidence, ReportedStatus


@dataclass(frozen=True, slots=True)
class Answered:
    entry: EngineStatusEntry


@dataclass(frozen=True, slots=True)
class ProtocolFailure:
    detail: str


@dataclass(frozen=True, slots=True)
class Unreachable:
    detail: str
    """Timeout or connection failure, in words."""


@dataclass(frozen=True, slots=True)
class Paused:
    detail: str
    """vLLM's elastic EP gate answered for the engine (a resize commits, or a scale-down retired it)."""


Observation = Answered | ProtocolFailure | Unreachable | Paused


@dataclass(frozen=True, slots=True)
class Finding:
    """A report to send to the controller."""

    status: ReportedStatus
    evidence: FaultEvidence
    detail: str
    fault_info: str | None = None
    entry: EngineStatusEntry | None = None


@dataclass(frozen=True, slots=True)
class PollState:
    """What the poller remembers about one endpoint (reset when its engine is started again)."""

    signature: tuple[str, ...] | None = None
    last: str = "unknown"
    """``healthy`` / ``diagnosing`` / ``unhealthy`` / ``dead`` / ``protocol_error`` / ``paused``, for the status
    object."""
    dead_by_unreachability: bool = False
    """DEAD evidence came from unreachability: the engine must be fenced before commit (F-51)."""
    polls: int = 0


def signature_of(observation: Observation) -> tuple[str, ...]:
    match observation:
        case Answered(entry=entry) if entry.status == "unhealthy":
            return ("unhealthy", entry.fault_info or "", entry.ft_state or "")
        case Answered(entry=entry):
            return (entry.status,)
        case ProtocolFailure(detail=detail):
            return ("protocol_error", detail)
        case Unreachable():
            return ("dead",)
        case Paused():
            return ("paused",)


def observe(state: PollState, observation: Observation) -> tuple[PollState, Finding | None]:
    """The next state and, when the signature changed to a fault, the report to send."""
    if isinstance(observation, Paused):  # no fault and no answer: what was last seen stands, nothing is reported
        return replace(state, last="paused", polls=state.polls + 1), None
    signature = signature_of(observation)
    changed = signature != state.signature
    unreachable_dead = state.dead_by_unreachability or (
        isinstance(observation, Unreachable) and state.signature != ("dead",)
    )
    new = replace(
        state, signature=signature, last=signature[0], dead_by_unreachability=unreachable_dead, polls=state.polls + 1
    )
    if not changed:
        return new, None
    match observation:
        case Answered(entry=entry) if entry.status == "healthy":
            return new, None
        case Answered(entry=entry):
            status: ReportedStatus = "unhealthy"
            if entry.status == "dead":
                status = "dead"
            elif entry.status == "diagnosing":
                status = "diagnosing"
            detail = entry.ft_error or f"engine reports {entry.status}"
            return new, Finding(
                status=status,
                evidence=FaultEvidence.FT_STATUS,
                detail=detail,
                fault_info=entry.fault_info,
                entry=entry,
            )
        case ProtocolFailure(detail=detail):
            return new, Finding(status="protocol_error", evidence=FaultEvidence.FT_PROTOCOL_ERROR, detail=detail)
        case Unreachable(detail=detail):
            return new, Finding(status="dead", evidence=FaultEvidence.FT_UNREACHABLE, detail=detail)


def revived(observation: Observation) -> bool:
    """Whether a retired rank's answer shows a live engine (F-53): anything but ``dead`` or silence."""
    match observation:
        case Answered(entry=entry):
            return entry.status != "dead"
        case ProtocolFailure():
            return True  # something answers on a retired rank's port: not dead
        case Unreachable():
            return False
        case Paused():
            return True  # vLLM's gate answers: the engine process lives


ELASTIC_EP_RESIZE_PHASES = frozenset({"preparing", "committing", "completed"})
"""``POST /is_scaling_elastic_ep`` phases that say a resize ran or is running (``idle``: none since start;
``failed``: a resize was given up, judged by the size it asked for — what a failed resize left of the world is not
known, so one that asked for another size marks it too, and a relaunch rather than a scale-down follows)."""


def elastic_resize(*, phase: str, requested_dp_size: int | None, launched_dp_size: int) -> bool:
    """Whether an engine's elastic EP status shows a resize of the world it was launched in (``launched_dp_size``
    ranks): a resize phase, or a requested size other than the launch's.

    Why it matters: vLLM 0.34's fault tolerance freezes the DP size at the engine's start
    (``EngineCoreSentinel._initial_dp_size``) and a resize never rebuilds it, so after one the old ranks and any
    new rank disagree on the world a ``scale_down`` names: the instance can no longer be scaled down soundly."""
    if phase in ELASTIC_EP_RESIZE_PHASES:
        return True
    return requested_dp_size is not None and requested_dp_size != launched_dp_size
