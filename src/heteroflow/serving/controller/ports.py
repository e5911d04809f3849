"""The ports of the controller shell: what each part around the strategy center uses of the controller.

A round, a fast recovery and a fallback (``strategy.py``, ``fast_recovery.py``, ``fallbacks.py``) get a
:class:`StrategyPorts`; the serving view's publication (``serving_view.py``) a :class:`PublicationPorts`; the
on-demand evidence (``evidence.py``) an :class:`EvidencePorts`; the status view (``status.py``) a
:class:`StatusPorts`. All of them extend :class:`ShellPorts`, what every part reads: the settings, the clock, the
NodeManagers and the store's last error. :class:`~heteroflow.serving.controller.service.Controller` implements
all of them; the parts never import it, so the shell's modules form layers (``app`` → ``service`` → strategies →
``ports`` → ``instance``), which an import contract in ``pyproject.toml`` keeps.
"""

from __future__ import annotations

from collections.abc import Coroutine, Mapping
from typing import Protocol

from heteroflow.contracts.serving import SoftwareFaultReport
from heteroflow.core.clock import Clock
from heteroflow.serving.controller.clients import CoordinatorClient, NodeManagerClient
from heteroflow.serving.controller.config import ControllerConfig, FaultToleranceConfig
from heteroflow.serving.controller.core import overlay
from heteroflow.serving.controller.core import runtime as rt
from heteroflow.serving.controller.core.ranks import DpRank, InstanceId
from heteroflow.serving.controller.history import RoundHistory
from heteroflow.serving.controller.instance import Instance, PodState
from heteroflow.serving.controller.metrics import ControllerMetrics
from heteroflow.serving.controller.pod_replacement import PodReplacement


class ShellPorts(Protocol):
    """What every part of the shell reads: the FT settings, the clock, the NodeManagers, and the store's last
    error (``None`` while the store answers)."""

    @property
    def ft(self) -> FaultToleranceConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def nm(self) -> NodeManagerClient: ...

    @property
    def store_error(self) -> str | None: ...


class StrategyPorts(ShellPorts, Protocol):
    """What a strategy uses besides: the Coordinator view, the store (through ``persist``), the round history,
    the metrics, the pod replacement and the pods' registrations (a fallback), and the test-only crash hook."""

    @property
    def coordinator(self) -> CoordinatorClient | None: ...

    @property
    def history(self) -> RoundHistory: ...

    @property
    def metrics(self) -> ControllerMetrics: ...

    @property
    def pod_replacement(self) -> PodReplacement | None:
        """Deletes a pod for replacement (Kubernetes); ``None`` where no pod can be replaced (a local cluster)."""
        ...

    @property
    def pods(self) -> Mapping[str, PodState]: ...

    def crash_point(self, step: str) -> None: ...

    def set_runtime(self, inst: Instance, runtime: rt.FtRuntime) -> None: ...

    async def persist(self, inst: Instance, *, required: bool) -> None: ...

    def reset_evidence(self, inst: Instance) -> None: ...

    async def view(self, inst: Instance, op: overlay.CoordinatorOp, *, request_id: str | None = None) -> None: ...

    async def refresh_view(self, inst: Instance, *, by_strategy: bool = False) -> None: ...

    async def finalize_everywhere(
        self, inst: Instance, request_id: str, *, commit: bool, retired: frozenset[DpRank]
    ) -> dict[str, bool]: ...

    async def run_fallback(self, inst: Instance, fallback: rt.FallbackStrategy) -> None: ...


class PublicationPorts(StrategyPorts, Protocol):
    """What the serving view's publication (``serving_view.py``) uses besides: the model an instance serves and
    the side tasks (a faulted rank's DEL, a persist after a generation bump)."""

    def model_of(self, inst: Instance) -> str: ...

    def spawn(self, work: Coroutine[object, object, None], *, name: str) -> None: ...


class EvidencePorts(ShellPorts, Protocol):
    """What the on-demand evidence uses besides: the controller's report intake and its side tasks."""

    def report(self, report: SoftwareFaultReport) -> bool: ...

    def withdraw_evidence(self, inst: Instance, rank: DpRank, *, why: str) -> None: ...

    def wake(self) -> None: ...

    def spawn(self, work: Coroutine[object, object, None], *, name: str) -> None: ...


class StatusPorts(ShellPorts, Protocol):
    """What the status view reads besides: the configuration and the registries."""

    @property
    def config(self) -> ControllerConfig: ...

    @property
    def instances(self) -> Mapping[InstanceId, Instance]: ...

    @property
    def restored(self) -> Mapping[InstanceId, rt.Restored]: ...

    @property
    def pods(self) -> Mapping[str, PodState]: ...
