"""The engine's fault-tolerance state machine, purely computational (no I/O, no clock reads).

Every event is a function ``(state, event, now) → Transition(state, actions)``; the shell
(:mod:`heteroflow.engine_sim.engine`) performs the actions. ``now`` is a monotonic time in seconds.

States (``health`` plus an optional running command)::

    healthy ──collective fault──► unhealthy ──apply accepted──► unhealthy+recovering
       ▲                             ▲  │                          │      │
       └────────── rebuild ok ───────┼──┼──────────────────────────┘      │ scale_down failed
                    retry failed ────┘  │ no command within                ▼
    any ──own worker died──► dead       └ engine_recovery_timeout ──► exit   dead+failed ──► exit

Only ``unhealthy`` (and no command running) accepts a command; every other command is rejected and the
rejection is visible in the status (``last_ft_request_id`` + ``ft_error``).

Both profiles (``engine-protocol.md``) read a status rejection as ``[FT] Rejecting retry on engine N: status
is HEALTHY``, run the recovery timer once from the fault (an accepted or failed command does not restart it)
and replace the entry at every status push (a change of health), dropping ``last_ft_request_id``,
``ft_error`` and ``ft_state``. Profile ``vllm-0.32`` has no command-running guard (a command during a running
one is taken behind it and changes nothing visible) and shows the engine's own id only with a failure;
``ft_state`` and ``mask`` are kept internally and left off the wire by the profile. Profile ``vllm-0.34``
adds the status ``diagnosing`` (a fault's first ``diagnosing_sec``, then ``unhealthy`` or ``dead``), refuses
a second command with "another recovery is in progress", fails a round whose survivors did not all check in
within ten seconds (``unhealthy``, retryable) and makes a ``scale_down`` that failed after the check-in
terminal (``dead``, ``fault_info`` "Recovery failed; full restart required").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Literal

from heteroflow.contracts.engine_protocol import (
    ANOTHER_RECOVERY_TEXT,
    PROFILES,
    ApplyRequest,
    EngineHealth,
    EngineProfile,
    EngineStatusEntry,
    FtState,
    ProfileName,
)


class IllegalTransitionError(RuntimeError):
    """An event that cannot happen in the current state (a bug in the shell, not a peer's fault)."""


class ConfigurationError(ValueError):
    """Launch parameters that contradict each other (rank out of range, an expert layout vLLM refuses, …)."""


@dataclass(frozen=True, slots=True)
class StoreAddress:
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class RebuildPlan:
    """What the worker does for an accepted command; identical on every survivor of the round."""

    request_id: str
    instruction: Literal["scale_down", "retry"]
    members: tuple[int, ...]
    """Original ranks of the new group, ascending; the dense rank of a member is its index."""
    dense_rank: int
    dead_ranks: frozenset[int]
    """Cumulative dead set after the command (original ranks)."""
    newly_removed: frozenset[int]
    store_master: int
    """Original rank that hosts the TCP store the new group uses."""
    new_store: StoreAddress | None
    """Set when the current store master is removed: a new store at ``dp_master_ip:dp_store_port``."""
    checkin_timeout_sec: float | None = None
    """Every member must join the round within this (vLLM 0.34: 10 s), else the round fails, retryable."""

    @property
    def digest(self) -> int:
        """A 48-bit fingerprint of the round, compared across survivors before they commit."""
        text = f"{self.request_id}|{self.instruction}|{sorted(self.dead_ranks)}|{self.members}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:6], "big")


@dataclass(frozen=True, slots=True)
class StartRebuild:
    plan: RebuildPlan


@dataclass(frozen=True, slots=True)
class AbortRequests:
    """Abort every in-flight request and refuse new ones (the engine is no longer healthy)."""

    reason: str


@dataclass(frozen=True, slots=True)
class ExitProcess:
    reason: str
    exit_code: int


Action = StartRebuild | AbortRequests | ExitProcess


@dataclass(frozen=True, slots=True)
class EngineState:
    rank: int
    dp_size: int
    """The group's data-parallel size (vLLM's ``parallel_config.data_parallel_size``): the launch size, changed
    only by a committed elastic EP resize (an FT ``scale_down`` keeps it and grows the dead set instead)."""
    health: EngineHealth = "healthy"
    dead_ranks: frozenset[int] = frozenset()
    store_master: int = 0
    fault_info: str | None = None
    mask: tuple[int, ...] | None = None
    last_ft_request_id: str | None = None
    ft_error: str | None = None
    ft_state: FtState | None = None
    running: RebuildPlan | None = None
    recovery_deadline: float | None = None
    """Monotonic time at which the engine exits unless a command was accepted."""
    exiting: ExitProcess | None = None
    generation: int = 0
    """Incremented at every successful rebuild."""
    profile_name: ProfileName = "vllm-0.34"
    diagnosing_until: float | None = None
    """While ``diagnosing``: when the engine pushes what follows (:attr:`after_diagnosis`)."""
    after_diagnosis: EngineHealth | None = None
    ft_dp_size: int | None = None
    """The FT sentinel's ``_initial_dp_size`` (``None``: :attr:`dp_size`): the size this engine was launched with,
    frozen at construction and never updated by an elastic EP resize (vLLM 0.34
    ``v1/fault_tolerance/engine_core_sentinel.py`` L57-70; read at L270-300 and L328-333). ``scale_down``
    validates against it and its rounds are over ``range(ft_dp_size)`` minus the dead set."""

    @property
    def ft_world(self) -> int:
        """The size FT validates and plans against (:attr:`ft_dp_size`)."""
        return self.dp_size if self.ft_dp_size is None else self.ft_dp_size

    @property
    def ft_members(self) -> tuple[int, ...]:
        """The alive ranks as the FT sentinel counts them: ``range(ft_dp_size)`` minus the dead set."""
        return tuple(r for r in range(self.ft_world) if r not in self.dead_ranks)

    @property
    def profile(self) -> EngineProfile:
        return PROFILES[self.profile_name]

    @property
    def released(self) -> bool:
        """The retry-only release (vLLM 0.32/0.33): its own request id, no command-running guard."""
        return self.profile_name == "vllm-0.32"

    @property
    def members(self) -> tuple[int, ...]:
        return tuple(r for r in range(self.dp_size) if r not in self.dead_ranks)

    @property
    def serving(self) -> bool:
        return self.health == "healthy" and self.running is None and self.exiting is None

    def status_entry(self) -> EngineStatusEntry:
        unhealthy = self.health == "unhealthy"
        terminal = (
            self.health == "dead"
            and self.fault_info is not None
            and self.fault_info == self.profile.terminal_fault_info
        )
        return EngineStatusEntry(
            id=self.rank,
            status=self.health,
            fault_info=self.fault_info if unhealthy or terminal else None,
            mask=list(self.mask) if unhealthy and self.mask is not None else None,
            last_ft_request_id=self.last_ft_request_id,
            ft_error=self.ft_error,
            ft_state=self.ft_state,
        )


@dataclass(frozen=True, slots=True)
class Transition:
    state: EngineState
    actions: tuple[Action, ...] = ()
    accepted: bool = True
    message: str = ""


def initial_state(*, rank: int, dp_size: int, profile_name: ProfileName = "vllm-0.34") -> EngineState:
    """A freshly launched engine: every rank of ``range(dp_size)`` alive, rank 0 the store master.

    A release has no way to launch "with ranks already dead": a relaunch without some ranks is a smaller
    contiguous world. The dead set grows only at runtime, by committed ``scale_down`` rounds."""
    if dp_size < 1:
        raise ConfigurationError("dp_size must be ≥ 1")
    if not 0 <= rank < dp_size:
        # vLLM's own text (ParallelConfig: the rank must lie in [0, data_parallel_size))
        raise ConfigurationError(f"data_parallel_rank ({rank}) must be in the range [0, {dp_size})")
    return EngineState(rank=rank, dp_size=dp_size, profile_name=profile_name, ft_dp_size=dp_size)


def on_elastic_resized(state: EngineState, *, new_dp_size: int) -> Transition:
    """A committed elastic EP resize: the group's size changes; the FT sentinel's size does not (it is frozen at
    construction, ``engine_core_sentinel.py`` L68), and neither does its dead set."""
    if new_dp_size < 1:
        raise IllegalTransitionError("a resize to no rank")
    return Transition(replace(state, dp_size=new_dp_size, generation=state.generation + 1))


def on_collective_fault(
    state: EngineState,
    *,
    fault_info: str,
    mask: tuple[int, ...],
    now: float,
    recovery_timeout: float,
    diagnosing_sec: float = 0.0,
) -> Transition:
    """A collective failed: a peer is gone or hung. Only a healthy, idle-of-commands engine changes.

    vLLM 0.34 first pushes ``diagnosing`` for ``diagnosing_sec`` (it queries the all2all mask), then
    ``unhealthy`` (see :func:`on_tick`)."""
    if state.health != "healthy" or state.running is not None or state.exiting is not None:
        return Transition(state)
    diagnosing = state.profile.diagnosing_status and diagnosing_sec > 0
    new = replace(
        state,
        health="diagnosing" if diagnosing else "unhealthy",
        diagnosing_until=now + diagnosing_sec if diagnosing else None,
        after_diagnosis="unhealthy" if diagnosing else None,
        fault_info=fault_info,
        mask=mask,
        # a new fault episode: the outcome of an earlier command no longer describes this engine
        ft_state=None,
        ft_error=None,
        # the push replaces the entry
        last_ft_request_id=None if state.profile.drops_outcome_on_push else state.last_ft_request_id,
        recovery_deadline=now + recovery_timeout,
    )
    return Transition(new, (AbortRequests(f"engine faulted: {fault_info}"),))


def on_worker_died(state: EngineState, *, reason: str, now: float, recovery_timeout: float) -> Transition:
    """This rank's own worker exited: ``dead`` (the only status that authorises removing the rank)."""
    if state.health == "dead":
        return Transition(state)
    failed_command = state.running is not None
    deadline = state.recovery_deadline if state.exiting else now + recovery_timeout
    if state.profile.recovery_timer == "from_fault" and state.recovery_deadline is not None:
        deadline = state.recovery_deadline  # one timer from the first fault
    new = replace(
        state,
        health="dead",
        diagnosing_until=None,
        after_diagnosis=None,
        running=None,
        ft_state="failed" if failed_command else state.ft_state,
        ft_error=f"worker died: {reason}" if failed_command else state.ft_error,
        recovery_deadline=deadline,
    )
    if state.profile.drops_outcome_on_push and not failed_command:  # the push of the new status replaces the entry
        new = replace(new, last_ft_request_id=None, ft_error=None, ft_state=None)
    return Transition(new, (AbortRequests(f"engine dead: {reason}"),))


def on_command(state: EngineState, request: ApplyRequest) -> Transition:
    """An apply; accepted only while ``unhealthy`` with no command running. Rejections are recorded."""
    if state.released and state.running is not None and state.health == "unhealthy" and state.exiting is None:
        # no command-running guard: the engine core takes the command after the running one; nothing shows
        return Transition(state, message=f"{request.instruction} queued behind {state.running.request_id}")
    reason = _rejection(state, request)
    if reason is not None:
        # vLLM 0.34's client marks every failed command failed (handle_fault), except a second command while
        # one is recovering, which never disturbs the running one; the PR-era rule: only a waiting engine fails
        waiting = state.health == "unhealthy" and state.running is None
        failed = state.profile.diagnosing_status and state.running is None
        rejected = replace(
            state,
            last_ft_request_id=request.request_id,
            ft_error=state.profile.rejection_text(instruction=request.instruction, engine_id=state.rank, reason=reason),
            ft_state="failed" if waiting or failed else state.ft_state,
        )
        return Transition(rejected, accepted=False, message=reason)
    plan = _plan(state, request)
    new = replace(
        state,
        running=plan,
        # vLLM 0.32 shows its own id only with a failure's ft_error
        last_ft_request_id=state.last_ft_request_id if state.released else request.request_id,
        ft_error=None,
        ft_state="recovering",
        recovery_deadline=state.recovery_deadline if state.profile.recovery_timer == "from_fault" else None,
    )
    return Transition(new, (StartRebuild(plan),), message=f"{request.instruction} accepted")


def on_rebuild_finished(
    state: EngineState,
    *,
    request_id: str,
    ok: bool,
    error: str | None,
    now: float,
    recovery_timeout: float,
    checkin_failed: bool = False,
) -> Transition:
    """The worker's outcome of the running command (unanimous: ``ok`` only if every survivor succeeded).

    ``checkin_failed``: not every member joined the round within its check-in (vLLM 0.34): the round failed
    before any vote, the engine stays ``unhealthy`` whatever the instruction (retryable)."""
    plan = state.running
    if plan is None or plan.request_id != request_id:
        raise IllegalTransitionError(f"no running command {request_id!r} to finish")
    if ok:
        new = replace(
            state,
            health="healthy",
            running=None,
            dead_ranks=plan.dead_ranks,
            store_master=plan.store_master,
            fault_info=None,
            mask=None,
            ft_error=None,
            ft_state=None,
            recovery_deadline=None,
            generation=state.generation + 1,
            last_ft_request_id=None if state.profile.drops_outcome_on_push else state.last_ft_request_id,
        )
        return Transition(new, message=f"{plan.instruction} succeeded")
    reason = error or f"{plan.instruction} failed"
    if plan.instruction == "retry" or checkin_failed:
        # a failed retry, or a round not every survivor joined, leaves the engine waiting for another command
        # (or its recovery timeout)
        new = replace(
            state,
            running=None,
            ft_state="failed",
            ft_error=reason,
            last_ft_request_id=plan.request_id,
            recovery_deadline=(
                state.recovery_deadline
                if state.profile.recovery_timer == "from_fault" and state.recovery_deadline is not None
                else now + recovery_timeout
            ),
        )
        return Transition(new, message=reason)
    # a scale_down that failed after validation is terminal: report dead, then exit
    exit_action = ExitProcess(reason=f"scale_down failed: {reason}", exit_code=1)
    new = replace(
        state,
        health="dead",
        running=None,
        fault_info=state.profile.terminal_fault_info or state.fault_info,
        ft_state="failed",
        ft_error=reason,
        recovery_deadline=None,
        exiting=exit_action,
    )
    return Transition(new, (AbortRequests("engine dead"), exit_action), message=reason)


def on_tick(state: EngineState, *, now: float) -> Transition:
    """Time passed: a diagnosis ends (``diagnosing`` → ``unhealthy``); without an accepted command within the
    recovery timeout, the engine exits."""
    if state.health == "diagnosing" and state.diagnosing_until is not None and now >= state.diagnosing_until:
        state = replace(state, health=state.after_diagnosis or "unhealthy", diagnosing_until=None, after_diagnosis=None)
        if state.profile.drops_outcome_on_push:  # the push replaces the entry: a rejection while diagnosing is gone
            state = replace(state, ft_state=None, ft_error=None, last_ft_request_id=None)
    if state.exiting is None and state.recovery_deadline is not None and now >= state.recovery_deadline:
        exit_action = ExitProcess(reason="no fault-tolerance command within engine_recovery_timeout_sec", exit_code=1)
        return Transition(replace(state, exiting=exit_action), (exit_action,))
    return Transition(state)


def _rejection(state: EngineState, request: ApplyRequest) -> str | None:
    if state.exiting is not None or state.health == "dead":
        return "status is DEAD"
    if state.health == "healthy":
        return "status is HEALTHY"
    if state.health == "diagnosing":
        return "status is DIAGNOSING"
    if state.running is not None:
        if state.profile.diagnosing_status:
            return ANOTHER_RECOVERY_TEXT
        return f"command {state.running.request_id!r} is still running"
    if request.instruction == "retry":
        return None
    params = request.params
    if state.ft_world == 1:
        return "scale_down requires data_parallel_size > 1; a dp=1 engine has no ranks to remove"
    # vLLM 0.34's own checks and texts (v1/fault_tolerance/engine_core_sentinel.py L270-303), over the size the
    # sentinel was constructed with (an elastic EP resize never changes it)
    removed = frozenset(params.removed_dp_ranks or ())
    newly = removed - state.dead_ranks
    world = frozenset(range(state.ft_world))
    if not removed or not removed <= world or state.rank in removed or world <= state.dead_ranks | newly or not newly:
        return (
            f"Invalid removed_dp_ranks {sorted(removed)} for engine {state.rank} "
            f"(dp_rank={state.rank}, dead_dp_ranks={sorted(state.dead_ranks)})"
        )
    alive_before = state.ft_members
    if alive_before[0] in newly and (params.dp_master_ip is None or params.dp_store_port is None):
        return f"dp_store_port and dp_master_ip required when the store master (rank {alive_before[0]}) is removed"
    return None


def _plan(state: EngineState, request: ApplyRequest) -> RebuildPlan:
    if request.instruction == "retry":
        return RebuildPlan(
            request_id=request.request_id,
            instruction="retry",
            members=state.ft_members,
            dense_rank=state.ft_members.index(state.rank),
            dead_ranks=state.dead_ranks,
            newly_removed=frozenset(),
            store_master=state.store_master,
            new_store=None,
            checkin_timeout_sec=state.profile.round_checkin_timeout_sec,
        )
    params = request.params
    removed = frozenset(params.removed_dp_ranks or ())
    dead = state.dead_ranks | removed
    members = tuple(r for r in range(state.ft_world) if r not in dead)
    new_store = None
    store_master = state.store_master
    if state.store_master in dead:
        # any master loss, not only original rank 0 (the upstream gap when a re-elected master dies later)
        if params.dp_master_ip is None or params.dp_store_port is None:
            raise IllegalTransitionError("a plan without a new store address")  # _rejection checks this
        new_store = StoreAddress(host=params.dp_master_ip, port=params.dp_store_port)
        store_master = members[0]
    return RebuildPlan(
        request_id=request.request_id,
        instruction="scale_down",
        members=members,
        dense_rank=members.index(state.rank),
        dead_ranks=dead,
        newly_removed=removed - state.dead_ranks,
        store_master=store_master,
        new_store=new_store,
        checkin_timeout_sec=state.profile.round_checkin_timeout_sec,
    )
