"""What a NodeManager sends to the controller: registration, heartbeats and the report outbox.

The daemon decides *what* to say (its registration, its heartbeat, each fault report); this link owns *how*
it gets there: one registration whenever the controller has none of ours (first contact, ``register_again``)
or the engines' discovered capability changed, then a heartbeat per step; fault reports queue in an outbox
(``OUTBOX_LIMIT``, oldest dropped first) delivered in order by one flusher at a time, and wait there while
the controller is unreachable. Reports of retired endpoints are never sent (F-4): the daemon's
``is_retired`` is asked at enqueue and again at delivery, since a commit may come in between.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog

from heteroflow.contracts.engine_protocol import EngineProfile
from heteroflow.contracts.serving import FtCapability, FtFlags, HeartbeatRequest, RegisterRequest, SoftwareFaultReport
from heteroflow.serving.node_manager.client import ControllerClient, ControllerError, ControllerRejectedError
from heteroflow.serving.node_manager.spec import InstanceSpec

_log = structlog.get_logger(__name__)

OUTBOX_LIMIT = 1000
"""Reports kept while the controller is unreachable (oldest dropped first, with a warning)."""


@dataclass(frozen=True, slots=True)
class PodIdentity:
    """Who this NodeManager is to the controller."""

    pod_id: str
    pod_ip: str
    node_manager_url: str
    node_name: str = ""


def registration_request(
    spec: InstanceSpec, pod: PodIdentity, profiles: Sequence[EngineProfile], *, elastic_ep: bool = False
) -> RegisterRequest:
    """The registration of a pod whose engines speak ``profiles`` (those known so far): the spec's
    capability with the one profile they all speak; engines of this pod that differ fail closed.
    ``elastic_ep``: every engine of the pod answered the elastic EP status route at discovery."""
    names = {p.name for p in profiles}
    capability = spec.capability(profiles[0] if len(names) == 1 else None)
    capability = capability.model_copy(update={"elastic_ep_supported": elastic_ep and len(names) == 1})
    if len(names) > 1:
        capability = capability.model_copy(
            update={"protocol_profile": "mixed", "scale_down_supported": False, "retry_supported": False}
        )
    return RegisterRequest(
        pod_id=pod.pod_id,
        pod_ip=pod.pod_ip,
        node_name=pod.node_name,
        node_manager_url=pod.node_manager_url,
        instance_id=spec.instance_id,
        role=spec.role,
        dp_size=spec.dp_size,
        endpoints=spec.endpoint_infos(pod.pod_ip),
        ft_capability=capability,
    )


class ControllerLink:
    def __init__(
        self, *, controller: ControllerClient, heartbeat_interval_sec: float, is_retired: Callable[[int], bool]
    ) -> None:
        self._controller = controller
        self._is_retired = is_retired
        self.flags = FtFlags()
        """The controller's flags, from the last registration or heartbeat answer (all off until then)."""
        self.registered = False
        self.heartbeat_interval_sec = heartbeat_interval_sec
        """Seconds between two steps: the settings' until the registration answer sets the controller's."""
        self.reports_sent = 0
        self.heartbeats_sent = 0
        self._capability: FtCapability | None = None
        self._outbox: list[SoftwareFaultReport] = []
        self._flushing = False

    @property
    def reports_pending(self) -> int:
        return len(self._outbox)

    def step_interval_sec(self) -> float:
        """How long until the next step: at most 1 s while not registered."""
        return self.heartbeat_interval_sec if self.registered else min(self.heartbeat_interval_sec, 1.0)

    async def exchange(
        self,
        registration: RegisterRequest,
        *,
        heartbeat: Callable[[], HeartbeatRequest],
        on_retired: Callable[[Iterable[int]], None],
    ) -> None:
        """One step: register when needed (``on_retired`` gets the answer's retired set before the heartbeat
        is built), heartbeat when registered before this step, then deliver the outbox."""
        try:
            # the engines' profile became known (or changed): the controller hears it by a registration,
            # and this step's heartbeat still goes out
            first = not self.registered
            if first or registration.ft_capability != self._capability:
                answer = await self._controller.register(registration)
                self._capability = registration.ft_capability
                self.flags = answer.flags
                self.heartbeat_interval_sec = answer.heartbeat_interval_sec
                if answer.retired_endpoint_ids is not None:
                    on_retired(answer.retired_endpoint_ids)
                self.registered = True
                _log.info(
                    "node_manager.registered",
                    flags=answer.flags.model_dump(),
                    profile=registration.ft_capability.protocol_profile,
                )
            if not first:
                beat = await self._controller.heartbeat(heartbeat())
                self.heartbeats_sent += 1
                if beat.flags is not None:
                    self.flags = beat.flags
                if beat.register_again:
                    self.registered = False
        except ControllerError as exc:
            _log.warning("controller.unavailable", error=str(exc))
        await self.flush()

    def enqueue(self, report: SoftwareFaultReport) -> None:
        if self._is_retired(report.endpoint_id):
            return  # committed ranks are filtered from every report (F-4)
        self._outbox.append(report)
        if len(self._outbox) > OUTBOX_LIMIT:
            dropped = self._outbox.pop(0)
            _log.warning("report.dropped", endpoint_id=dropped.endpoint_id, evidence=dropped.evidence)

    def drop_retired(self) -> None:
        """Forget queued reports of endpoints retired since they were queued."""
        self._outbox = [r for r in self._outbox if not self._is_retired(r.endpoint_id)]

    async def flush(self) -> None:
        """Deliver the outbox in order; one flusher at a time (it also takes what others enqueue meanwhile)."""
        if self._flushing:
            return
        self._flushing = True
        try:
            await self._flush()
        finally:
            self._flushing = False

    async def _flush(self) -> None:
        while self._outbox:
            report = self._outbox[0]
            if self._is_retired(report.endpoint_id):
                self._outbox.pop(0)
                continue
            try:
                await self._controller.report_software_fault(report)
            except ControllerRejectedError as exc:
                _log.error("report.rejected", endpoint_id=report.endpoint_id, error=str(exc))
            except ControllerError as exc:
                _log.warning("report.deferred", endpoint_id=report.endpoint_id, error=str(exc))
                return
            else:
                self.reports_sent += 1
            self._outbox.pop(0)

    async def aclose(self) -> None:
        await self._controller.aclose()
