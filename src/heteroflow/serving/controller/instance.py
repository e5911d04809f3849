"""The controller's state of one serving instance and of one pod, as the shell keeps it in memory.

:class:`Instance` holds what the pure core computes on (its ``FtRuntime``, the only thing persisted, F-32)
beside what the shell tracks around it: the snapshot of software evidence (never persisted, F-13), the hardware
events, the running strategy and the view last published to the Coordinator. The controller (``service.py``)
owns the registry of instances; the strategies change an instance's records through the ports in ``ports.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.decision import RunningStrategy
from heteroflow.serving.controller.core.normalizer import FtSnapshot, HardwareEvent
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId, RequestId
from heteroflow.serving.controller.core.topology import InstanceTopology
from heteroflow.serving.wire import EngineIdentity, RegisterRequest


@dataclass
class PodState:
    registration: RegisterRequest
    last_seen: float
    heartbeat_complete: bool = False
    heartbeats: int = 0


@dataclass
class Instance:
    instance_id: InstanceId
    topology: InstanceTopology
    runtime: rt.FtRuntime
    revision: int | None = None
    """The store's CAS revision of the persisted runtime; ``None``: never stored."""
    snapshot: FtSnapshot = field(default_factory=FtSnapshot)
    hardware: list[HardwareEvent] = field(default_factory=list)
    running: RunningStrategy | None = None
    task: asyncio.Task[None] | None = None
    published: frozenset[DpRank] = frozenset()
    """The view the Coordinator holds as far as we know (what the last successful DEL/ADD/SET left)."""
    engine_statuses: dict[int, str] = field(default_factory=dict)
    wake_at: float | None = None
    last_decision: str | None = None
    stopped_pods: set[str] = field(default_factory=set)
    persist_pending: bool = False
    persist_error_shown: bool = False
    """``last_error`` currently says a persist failed; a later successful persist clears it."""
    nudged: bool = False
    """F-54: the idle survivors of the current evidence were nudged once."""
    collecting: bool = False
    collected_at: float = float("-inf")
    hardware_seen: dict[str, dict[str, object]] = field(default_factory=dict)
    """Hardware faults already taken for this instance, by key (what the status shows of each): a source
    repeating a standing fault never opens a second window; the key is forgotten when the source clears it or
    the evidence is reset."""
    persist_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """One write at a time per instance, so that two writers never race on the same CAS revision."""
    fault_withdrawn: frozenset[DpRank] = frozenset()
    """Ranks withdrawn from the Coordinator at their first fault report (before any round): the periodic SET
    leaves them out until the evidence is reset (a round committed, a rebuild, a fast recovery)."""
    held_generation: int | None = None
    """The newest generation a DEL carried: the Coordinator holds those ranks back from ADD/SET of no newer
    generation, so the next publication must carry a newer one."""
    unreachable: dict[DpRank, EngineIdentity | None] = field(default_factory=dict)
    """Ranks reported DEAD by a status timeout (``FT_UNREACHABLE``), with the identity the report named: that
    evidence is withdrawn if the same engine answers again before a round starts (``evidence.py``)."""
    rechecking: bool = False
    rechecked_at: float = float("-inf")
    fallback_times: list[float] = field(default_factory=list)
    """Monotonic start times of the whole-instance relaunches within ``fallback_attempt_window_sec``."""
    intervention_required: str | None = None
    """Why the controller stopped relaunching the instance (``fallback_max_attempts`` used up), or ``None``."""
    measured_start_sec: float | None = None
    """How long the last relaunch took from the restart request to every engine ready."""
    pending_abort: RequestId | None = None
    pending_fallback: rt.FallbackStrategy | None = None
    fallback_attempts: int = 0
