"""What the controller sends: the NodeManagers' FT and lifecycle routes, and the Coordinator's view operations.

Errors are the peer client's (:mod:`heteroflow.http.peer`), under the names the controller's modules use::

    PeerError
    ├── PeerUnavailableError   refused, reset, timeout: nobody answered
    └── PeerRejectedError      an HTTP error status or an answer that breaks the contract (``status_code``)

The controller never talks to an engine: everything reaches the engines through their NodeManager (RFC §4.4).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heteroflow.contracts.serving import (
    COORDINATOR_ADD_PATH,
    COORDINATOR_CLIENT_OUTCOMES_PATH,
    COORDINATOR_DEL_PATH,
    COORDINATOR_SET_PATH,
    NM_ENGINES_RESTART_PATH,
    NM_ENGINES_STOP_PATH,
    NM_FT_APPLY_PATH,
    NM_FT_FINALIZE_PATH,
    NM_FT_GUARD_PATH,
    NM_FT_NUDGE_PATH,
    NM_FT_PROBE_PATH,
    NM_FT_STATUS_PATH,
    NM_STATUS_PATH,
    EnginesResponse,
    EnginesStartRequest,
    EnginesStopRequest,
    FinalizeRequest,
    FinalizeResponse,
    FtStatusRequest,
    FtStatusResponse,
    GuardRequest,
    GuardResponse,
    NmApplyRequest,
    NmApplyResponse,
    ProbeRequest,
    ProbeResponse,
    ServingEndpoint,
    ViewAddRequest,
    ViewDelRequest,
    ViewResponse,
)
from heteroflow.http.peer import JsonPeer, PeerError, Rejected, TransportFor, Unavailable

PeerUnavailableError = Unavailable
PeerRejectedError = Rejected

__all__ = [
    "CoordinatorClient",
    "NodeManagerClient",
    "PeerError",
    "PeerRejectedError",
    "PeerUnavailableError",
    "TransportFor",
]


ENGINES_RESTART_TIMEOUT_SEC = 30.0
"""How long a NodeManager may take to stop and relaunch its engines (its stop grace is 5 s by default; the stops
run concurrently)."""


class NodeManagerClient:
    """The controller's side of the four FT routes, the probe and nudge, and the engine lifecycle routes."""

    def __init__(
        self, *, cluster_token: str | None, timeout_sec: float = 5.0, transport_for: TransportFor | None = None
    ) -> None:
        self._http = JsonPeer(token=cluster_token, timeout_sec=timeout_sec, transport_for=transport_for)

    async def status(self, url: str, endpoint_ids: Sequence[int]) -> FtStatusResponse:
        return await self._http.post(
            url, NM_FT_STATUS_PATH, FtStatusRequest(endpoint_ids=list(endpoint_ids)), FtStatusResponse
        )

    async def guard(self, url: str, request: GuardRequest) -> GuardResponse:
        return await self._http.post(url, NM_FT_GUARD_PATH, request, GuardResponse)

    async def apply(self, url: str, request: NmApplyRequest) -> NmApplyResponse:
        return await self._http.post(url, NM_FT_APPLY_PATH, request, NmApplyResponse, ok=(202,))

    async def finalize(self, url: str, request: FinalizeRequest) -> FinalizeResponse:
        return await self._http.post(url, NM_FT_FINALIZE_PATH, request, FinalizeResponse)

    async def probe(self, url: str, request: ProbeRequest) -> ProbeResponse:
        return await self._http.post(url, NM_FT_PROBE_PATH, request, ProbeResponse)

    async def nudge(self, url: str, request: ProbeRequest) -> ProbeResponse:
        return await self._http.post(url, NM_FT_NUDGE_PATH, request, ProbeResponse)

    async def stop_engines(self, url: str, request: EnginesStopRequest) -> EnginesResponse:
        return await self._http.post(url, NM_ENGINES_STOP_PATH, request, EnginesResponse)

    async def restart_engines(self, url: str, request: EnginesStartRequest) -> EnginesResponse:
        # a restart first stops the pod's engines, each allowed the NodeManager's stop grace (SIGTERM, then
        # SIGKILL; a hung engine uses all of it): longer than a plain request may take
        return await self._http.post(
            url, NM_ENGINES_RESTART_PATH, request, EnginesResponse, timeout_sec=ENGINES_RESTART_TIMEOUT_SEC
        )

    async def node_status(self, url: str) -> dict[str, Any]:
        return await self._http.get_object(url, NM_STATUS_PATH)

    async def aclose(self) -> None:
        await self._http.aclose()


class CoordinatorClient:
    """DEL / ADD / SET of one instance's serving view (F-40); every call goes through the overlay first."""

    def __init__(
        self,
        base_url: str,
        *,
        cluster_token: str | None,
        timeout_sec: float = 5.0,
        transport_for: TransportFor | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = JsonPeer(token=cluster_token, timeout_sec=timeout_sec, transport_for=transport_for)

    async def withdraw(
        self,
        instance_id: str,
        endpoint_ids: list[int],
        *,
        request_id: str | None,
        generation: int | None = None,
        faulted: bool = False,
    ) -> ViewResponse:
        body = ViewDelRequest(
            instance_id=instance_id,
            endpoint_ids=endpoint_ids,
            request_id=request_id,
            generation=generation,
            faulted=faulted,
        )
        return await self._http.post(self.base_url, COORDINATOR_DEL_PATH, body, ViewResponse)

    async def add(
        self, instance_id: str, model: str, endpoints: list[ServingEndpoint], *, generation: int, request_id: str | None
    ) -> ViewResponse:
        body = ViewAddRequest(
            instance_id=instance_id, model=model, endpoints=endpoints, generation=generation, request_id=request_id
        )
        return await self._http.post(self.base_url, COORDINATOR_ADD_PATH, body, ViewResponse)

    async def client_outcomes(self, *, since: float, until: float, model: str, instance_id: str) -> dict[str, Any]:
        """What clients saw in ``[since, until]`` (Unix seconds) on ``model`` or ``instance_id``."""
        params: dict[str, str | int] = {
            "since": f"{since:.3f}",
            "until": f"{until:.3f}",
            "model": model,
            "instance_id": instance_id,
        }
        return await self._http.get_object(self.base_url, COORDINATOR_CLIENT_OUTCOMES_PATH, params=params)

    async def set(
        self, instance_id: str, model: str, endpoints: list[ServingEndpoint], *, generation: int
    ) -> ViewResponse:
        body = ViewAddRequest(instance_id=instance_id, model=model, endpoints=endpoints, generation=generation)
        return await self._http.post(self.base_url, COORDINATOR_SET_PATH, body, ViewResponse)

    async def aclose(self) -> None:
        await self._http.aclose()
