"""The controller's state of one serving instance and of one pod, as the shell keeps it in memory.

:class:`Instance` holds what the pure core computes on (its ``FtRuntime``, the only thing persisted, F-32;
changed only through ``Controller.set_runtime``) and the topology its pods registered (``registration.py``),
beside records of what the shell tracks around them. Each record has one owner, the module that changes it; the
others read it, or call the record's own methods where another module's step must leave a mark:

- :class:`Evidence` — the software and hardware evidence since the last reset (never persisted, F-13): the
  controller's report intake (``service.py``; ``hardware_faults.py`` records the hardware events it maps).
- :class:`Collection` — the on-demand status collection and recheck, the idle nudge: ``evidence.py``.
- :class:`Publication` — what the Coordinator holds as far as we know: the serving view of ``service.py``.
- :class:`Persistence` — the store's revision and a write still to retry: ``Controller.persist``.
- :class:`StrategySlot` — the strategy running and the center's next wake-up: the strategy center.
- :class:`Relaunches` — whole-instance relaunches, the pods stopped or deleted for replacement and why a
  relaunch is not in place: ``fallbacks.py`` (a round marks the pods it stops through
  :meth:`Relaunches.pod_stopped`).
- :class:`Restores` — the last restore to the configured size and the automatic policy's clock: ``restore.py``.
- :class:`StandingFaults` — the hardware faults whose cards have not been reported healthy since, kept across
  evidence resets: ``hardware_faults.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from heteroflow.contracts.serving import EngineIdentity, EngineRank, RegisterRequest
from heteroflow.serving.controller.core import normalizer
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.decision import RunningStrategy
from heteroflow.serving.controller.core.normalizer import FtSnapshot, HardwareEvent, HardwareFault
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId, PodId, RequestId
from heteroflow.serving.controller.core.relaunch import RelaunchKind, RelaunchPlan
from heteroflow.serving.controller.core.topology import InstanceTopology


@dataclass
class PodState:
    registration: RegisterRequest
    last_seen: float
    heartbeat_complete: bool = False
    heartbeats: int = 0
    engine_ranks: dict[int, EngineRank] = field(default_factory=dict)
    """Endpoint → its engine's launch rank, that launch's DP size and whether elastic EP resized that world since,
    from the last heartbeat that said."""

    def elastic_ep_resized(self) -> dict[int, int | None]:
        """Endpoints whose engine's world elastic EP resized, with the DP size asked for (``None``: not said)."""
        return {eid: r.elastic_ep_requested_dp_size for eid, r in self.engine_ranks.items() if r.elastic_ep_resized}


@dataclass
class Evidence:
    """The evidence since the last reset (a round committed, a rebuild, a fast recovery)."""

    snapshot: FtSnapshot = field(default_factory=FtSnapshot)
    hardware: list[HardwareEvent] = field(default_factory=list)
    """Hardware events the decision has not handled yet."""
    hardware_seen: dict[str, dict[str, object]] = field(default_factory=dict)
    """Hardware faults already taken for this instance, by key (what the status shows of each): a source
    repeating a standing fault never opens a second window; the key is forgotten when the source clears it or
    the evidence is reset."""
    engine_statuses: dict[int, str] = field(default_factory=dict)
    unreachable: dict[DpRank, EngineIdentity | None] = field(default_factory=dict)
    """Ranks reported DEAD by a status timeout (``FT_UNREACHABLE``), with the identity the report named: that
    evidence is withdrawn if the same engine answers again before a round starts (``evidence.py``)."""

    def reset(self) -> None:
        self.snapshot = normalizer.reset()
        self.hardware.clear()
        self.hardware_seen.clear()
        self.engine_statuses.clear()
        self.unreachable.clear()


@dataclass
class Collection:
    collecting: bool = False
    collected_at: float = float("-inf")
    rechecking: bool = False
    rechecked_at: float = float("-inf")
    nudged: bool = False
    """F-54: the idle survivors of the current evidence were nudged once."""

    def evidence_reset(self) -> None:
        """The evidence was reset: its idle survivors may be nudged again."""
        self.nudged = False


@dataclass
class Publication:
    published: frozenset[DpRank] = frozenset()
    """The view the Coordinator holds as far as we know (what the last successful DEL/ADD/SET left)."""
    fault_withdrawn: frozenset[DpRank] = frozenset()
    """Ranks withdrawn from the Coordinator at their first fault report (before any round): the periodic SET
    leaves them out until the evidence is reset (a round committed, a rebuild, a fast recovery)."""
    held_generation: int | None = None
    """The newest generation a DEL carried: the Coordinator holds those ranks back from ADD/SET of no newer
    generation, so the next publication must carry a newer one."""


@dataclass
class Persistence:
    revision: int | None = None
    """The store's CAS revision of the persisted runtime; ``None``: never stored."""
    pending: bool = False
    """A write failed (or is still to make): the view-refresh loop retries it (F-50)."""
    error_shown: bool = False
    """``last_error`` currently says a persist failed; a later successful persist clears it."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One write at a time per instance, so that two writers never race on the same CAS revision."""

    def mark_error_shown(self) -> None:
        """A strategy put the failed persist into ``last_error``."""
        self.error_shown = True


@dataclass
class StrategySlot:
    running: RunningStrategy | None = None
    task: asyncio.Task[None] | None = None
    wake_at: float | None = None
    """When the strategy center decides this instance again at the latest (monotonic seconds)."""
    last_decision: str | None = None
    trigger: dict[str, object] | None = None
    """What the last decision that started a strategy saw (:mod:`..trigger`): the round it starts keeps it."""
    pending_abort: RequestId | None = None
    """A round interrupted by a restart, to abort at every NodeManager before its fallback (F-32)."""
    pending_fallback: rt.FallbackStrategy | None = None

    def wake_by(self, at: float) -> None:
        """Have the strategy center decide again no later than ``at``."""
        self.wake_at = at if self.wake_at is None else min(self.wake_at, at)


@dataclass
class Relaunches:
    times: list[float] = field(default_factory=list)
    """Monotonic start times of the whole-instance relaunches within ``fallback_attempt_window_sec``."""
    attempts: int = 0
    intervention_required: str | None = None
    """Why the controller stopped relaunching the instance (``fallback_max_attempts`` used up), or ``None``."""
    measured_start_sec: float | None = None
    """How long the last relaunch took from the restart request to every engine ready."""
    stopped_pods: set[str] = field(default_factory=set)
    """Pods stopped after every rank of theirs was committed (F-26); a rebuild brings them back."""

    replacing: dict[PodId, PodState | None] = field(default_factory=dict)
    """Pods deleted for replacement (a standing hardware fault on their cards), with the registration each had
    when deleted (a new one means it is back): each may register again with other cards until the relaunch
    succeeds."""
    plan: RelaunchPlan | None = None
    """The last fallback's plan when it did not relaunch every rank in place (``core/relaunch.py``): what the
    status shows as ``relaunch``; ``None`` after an in-place relaunch."""

    def pod_stopped(self, pod_id: str) -> None:
        self.stopped_pods.add(pod_id)

    @property
    def refused(self) -> RelaunchPlan | None:
        """The plan when it refused to relaunch (the instance waits for the fault to clear), else ``None``."""
        return self.plan if self.plan is not None and self.plan.kind == RelaunchKind.REFUSED else None


@dataclass(frozen=True, slots=True)
class RestoreState:
    """One restore of a scaled-down instance to its configured size (``restore.py``), as the status shows it."""

    state: str
    """``running``, ``succeeded`` or ``failed``."""
    request_id: str
    requested_by: str
    """``operator`` (the API) or ``auto_restore`` (the policy)."""
    ranks: tuple[int, ...]
    """The retired ranks the restore brings back."""
    started_at: datetime
    started_monotonic: float
    degraded_round: str | None
    """The round whose scale-down the restore undoes (the runtime's ``request_id`` when it began)."""
    finished_at: datetime | None = None
    seconds: float | None = None
    error: str | None = None
    degraded_phase: str | None = None
    """After a failure: the phase the degraded instance's relaunch left it in (SCALED_DOWN_RUNNING: serving)."""


@dataclass
class Restores:
    last: RestoreState | None = None
    ready_since: float | None = None
    """Monotonic time since when the instance could be restored without a break (the automatic policy)."""


@dataclass
class StandingFaults:
    """Hardware faults at L5-L6 whose source has not cleared them (``core/relaunch.py``): never forgotten by an
    evidence reset (a rebuild does not repair a card), only when the source reports the card healthy again."""

    faults: dict[str, HardwareFault] = field(default_factory=dict)
    """By fault key."""


@dataclass
class Instance:
    instance_id: InstanceId
    topology: InstanceTopology
    runtime: rt.FtRuntime
    evidence: Evidence = field(default_factory=Evidence)
    collection: Collection = field(default_factory=Collection)
    publication: Publication = field(default_factory=Publication)
    persistence: Persistence = field(default_factory=Persistence)
    strategy: StrategySlot = field(default_factory=StrategySlot)
    relaunches: Relaunches = field(default_factory=Relaunches)
    standing: StandingFaults = field(default_factory=StandingFaults)
    restores: Restores = field(default_factory=Restores)

    def elastic_ep_resized(self, pods: Mapping[str, PodState]) -> dict[int, int | None]:
        """Ranks not committed dead whose engine's world elastic EP resized since its launch, with the DP size asked
        for, as their pods' last heartbeats said. vLLM 0.34's fault tolerance keeps the launch's DP size through a
        resize, so neither a ``scale_down`` nor a ``retry`` round of such a world can be planned soundly."""
        resized: dict[int, int | None] = {}
        for pod in self.topology.pods:
            state = pods.get(pod.pod_id)
            if state is not None:
                resized |= state.elastic_ep_resized()
        return {rank: size for rank, size in resized.items() if rank not in self.runtime.dead_committed}
