"""EngineFtService's state machine: guard, apply, finalize and the retired set. Purely computational.

Every operation takes the current frozen :class:`FtServiceState` and the time (monotonic seconds) and
returns the next state plus an outcome, or raises an :class:`FtServiceError` whose subclass fixes the HTTP
status (mapped in one place, ``app.py``). The shell holds the state behind one lock and never changes it
any other way, so two controllers' rounds racing for this NodeManager are decided here, deterministically.

Rules (``serving-ft.md`` F-23, F-25, F-27, F-57, F-58; RFC §5 and §6):

- ``guard``: the same request id renews its lease; another id is refused (502) while the lease runs; after
  it expires a new round may take over. A finalized round's id can never guard again (a late renewal must
  not refreeze a NodeManager after its round ended).
- ``apply``: only under the caller's own live guard, only ``scale_down`` (``retry`` only with fast recovery
  on; anything else 400), at most once per round (the controller never applies twice; we enforce it too).
- ``finalize``: only the current owner's id (even after its lease expired, as long as no newer round took
  over); anything else is stale (502) and never unfreezes a newer round. A round whose expired guard was
  taken over is stale for good: it can never guard, apply or finalize here again. A repeat with the same id and the
  same decision is idempotent (F-57); abort after commit, or commit after abort, is refused (502).
- The freeze (``is_frozen``) suspends the NodeManager's own engine-death suicide handling.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from heteroflow.contracts.engine_protocol import Instruction
from heteroflow.contracts.serving import MAX_LEASE_SEC

HISTORY_LIMIT = 64
"""Finalized rounds remembered for idempotent repeats and stale detection (rounds are minutes apart)."""


class FtServiceError(Exception):
    """A refused FT command; ``code`` is machine-readable, the text is for people."""

    code = "ft_error"


class InvalidCommandError(FtServiceError):
    """HTTP 400: the command itself is wrong (unknown instruction, lease outside (0, 3600])."""

    code = "invalid_command"


class GuardConflictError(FtServiceError):
    """HTTP 502: another round holds a live guard on this NodeManager."""

    code = "guard_conflict"


class StaleRequestError(FtServiceError):
    """HTTP 502: the request id is not the current round's (or contradicts how that round ended)."""

    code = "stale_request"


class NotGuardedError(FtServiceError):
    """HTTP 409: apply/probe without a live guard by the same request id."""

    code = "not_guarded"


class AlreadyAppliedError(FtServiceError):
    """HTTP 409: this round already applied here; apply is never sent twice."""

    code = "already_applied"


@dataclass(frozen=True, slots=True)
class FinalizedRound:
    request_id: str
    commit: bool
    retired: frozenset[int]
    superseded: bool = False
    """Its lease expired and a newer round took over: stale for good (no guard, apply or finalize)."""


@dataclass(frozen=True, slots=True)
class FtServiceState:
    owner: str | None = None
    """The round that guarded last and has not been finalized (its lease may have expired)."""
    lease_until: float | None = None
    applied: bool = False
    """Whether the owner's round has applied here."""
    retired: frozenset[int] = frozenset()
    """Committed dead ranks (original ids, instance-wide as the controller sends them)."""
    history: tuple[FinalizedRound, ...] = ()
    unfrozen_at: float | None = None
    """When the last guard ended by finalize; the suicide grace restarts there."""
    renewals: int = 0

    def is_frozen(self, now: float) -> bool:
        return self.owner is not None and self.lease_until is not None and now < self.lease_until

    def lease_left(self, now: float) -> float:
        if not self.is_frozen(now) or self.lease_until is None:
            return 0.0
        return self.lease_until - now

    def finalized(self, request_id: str) -> FinalizedRound | None:
        for rnd in reversed(self.history):
            if rnd.request_id == request_id:
                return rnd
        return None


@dataclass(frozen=True, slots=True)
class GuardOutcome:
    renewed: bool


@dataclass(frozen=True, slots=True)
class FinalizeOutcome:
    repeated: bool
    newly_retired: frozenset[int]


def guard(
    state: FtServiceState, *, request_id: str, lease_sec: float, now: float
) -> tuple[FtServiceState, GuardOutcome]:
    if not request_id:
        raise InvalidCommandError("request_id must be non-empty")
    if not 0 < lease_sec <= MAX_LEASE_SEC:
        raise InvalidCommandError(f"lease_sec must be in (0, {MAX_LEASE_SEC:g}]; got {lease_sec}")
    if state.finalized(request_id) is not None:
        raise StaleRequestError(f"round {request_id!r} was already finalized here; it cannot guard again")
    if state.owner == request_id:
        return replace(state, lease_until=now + lease_sec, renewals=state.renewals + 1), GuardOutcome(renewed=True)
    if state.is_frozen(now):
        raise GuardConflictError(
            f"guarded by round {state.owner!r} for {state.lease_left(now):.1f} s more; refused {request_id!r}"
        )
    history = state.history
    if state.owner is not None:  # an expired round loses the NodeManager for good
        history = (*history, FinalizedRound(request_id=state.owner, commit=False, retired=frozenset(), superseded=True))
    new = replace(
        state,
        owner=request_id,
        lease_until=now + lease_sec,
        applied=False,
        renewals=0,
        history=history[-HISTORY_LIMIT:],
    )
    return new, GuardOutcome(renewed=False)


def check_instruction(instruction: str, *, fast_recovery_enabled: bool) -> Instruction:
    """``scale_down`` always; ``retry`` only with fast recovery on (F-11); anything else is a 400."""
    if instruction == "scale_down":
        return "scale_down"
    if instruction == "retry":
        if fast_recovery_enabled:
            return "retry"
        raise InvalidCommandError("instruction 'retry' needs enable_fast_recovery")
    raise InvalidCommandError(f"unsupported instruction {instruction!r}; this NodeManager proxies 'scale_down'")


def require_guard(state: FtServiceState, *, request_id: str, now: float) -> None:
    """Raise unless ``request_id`` holds a live guard here."""
    if state.owner == request_id and state.is_frozen(now):
        return
    if state.finalized(request_id) is not None:
        raise StaleRequestError(f"round {request_id!r} was already finalized here")
    if state.is_frozen(now):
        raise GuardConflictError(f"guarded by round {state.owner!r}; refused {request_id!r}")
    if state.owner == request_id:
        raise NotGuardedError(f"the guard of round {request_id!r} expired; renew it first")
    raise NotGuardedError(f"round {request_id!r} holds no guard here; guard first")


def apply(
    state: FtServiceState, *, request_id: str, instruction: str, fast_recovery_enabled: bool, now: float
) -> tuple[FtServiceState, Instruction]:
    """Admit one apply of the current round; the state records it so a second one is refused."""
    checked = check_instruction(instruction, fast_recovery_enabled=fast_recovery_enabled)
    require_guard(state, request_id=request_id, now=now)
    if state.applied:
        raise AlreadyAppliedError(f"round {request_id!r} already applied here; apply is never repeated")
    return replace(state, applied=True), checked


def finalize(
    state: FtServiceState, *, request_id: str, commit: bool, retired: Iterable[int], now: float
) -> tuple[FtServiceState, FinalizeOutcome]:
    if not request_id:
        raise InvalidCommandError("request_id must be non-empty")
    retired_set = frozenset(retired)
    done = state.finalized(request_id)
    if done is not None:
        if done.superseded:
            raise StaleRequestError(f"round {request_id!r} lost its expired guard to a newer round; it is stale")
        if done.commit != commit:
            how = "committed" if done.commit else "aborted"
            raise StaleRequestError(f"round {request_id!r} was already {how} here; refused {_verb(commit)}")
        # an idempotent repeat (F-57): a commit may still teach ids the first one lacked (cumulative lists)
        added = retired_set - state.retired if commit else frozenset()
        return replace(state, retired=state.retired | added), FinalizeOutcome(repeated=True, newly_retired=added)
    if state.owner != request_id:
        holder = f"round {state.owner!r}" if state.owner else "no round"
        raise StaleRequestError(f"{_verb(commit)} of {request_id!r} is stale: {holder} is current here")
    added = retired_set - state.retired if commit else frozenset()
    history = (*state.history, FinalizedRound(request_id=request_id, commit=commit, retired=retired_set))
    new = replace(
        state,
        owner=None,
        lease_until=None,
        applied=False,
        retired=state.retired | added,
        history=history[-HISTORY_LIMIT:],
        unfrozen_at=now,
        renewals=0,
    )
    return new, FinalizeOutcome(repeated=False, newly_retired=added)


def replace_retired(state: FtServiceState, retired: Iterable[int]) -> FtServiceState:
    """A fallback's relaunch or a registration: the controller's ``dead_committed`` replaces ours (F-14)."""
    return replace(state, retired=frozenset(retired))


def suicide_due(
    *,
    dead_since: Mapping[int, float],
    state: FtServiceState,
    now: float,
    grace_sec: float,
) -> tuple[int, ...]:
    """Local endpoints whose death now triggers the suicide handling (kill the pod's engines, exit).

    Never while guarded (the round owns the engines); retired endpoints never count; a dead engine gets
    ``grace_sec`` from its death, or from the end of the last guard, so a controller can decide first.
    """
    if state.is_frozen(now):
        return ()
    due = []
    for endpoint_id, since in sorted(dead_since.items()):
        if endpoint_id in state.retired:
            continue
        start = max(since, state.unfrozen_at) if state.unfrozen_at is not None else since
        if state.owner is not None and state.lease_until is not None:
            start = max(start, state.lease_until)  # an expired guard also restarts the grace
        if now - start >= grace_sec:
            due.append(endpoint_id)
    return tuple(due)


def _verb(commit: bool) -> str:
    return "commit" if commit else "abort"
