"""What the controller sends: the NodeManagers' FT and lifecycle routes, and the Coordinator's view operations.

Errors (foreign ones translated here with ``raise … from``)::

    PeerError
    ├── PeerUnavailableError   refused, reset, timeout: nobody answered
    └── PeerRejectedError      an HTTP error status or an answer that breaks the contract (``status_code``)

The controller never talks to an engine: everything reaches the engines through their NodeManager (RFC §4.4).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from heteroflow.serving.wire import (
    COORDINATOR_ADD_PATH,
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

_M = TypeVar("_M", bound=BaseModel)
_JSON = {"Content-Type": "application/json"}

TransportFor = Callable[[str], httpx.AsyncBaseTransport | None]
"""Base URL → a transport (tests route to in-process apps); ``None``: the network."""


class PeerError(Exception):
    """A NodeManager or the Coordinator did not do what was asked."""


class PeerUnavailableError(PeerError):
    pass


class PeerRejectedError(PeerError):
    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


class _Http:
    """One pooled client per base URL, all with the cluster token."""

    def __init__(self, *, cluster_token: str | None, timeout_sec: float, transport_for: TransportFor | None) -> None:
        self._headers = {"Authorization": f"Bearer {cluster_token}"} if cluster_token else {}
        self._timeout = timeout_sec
        self._transport_for = transport_for
        self._clients: dict[str, httpx.AsyncClient] = {}

    def _client(self, base_url: str) -> httpx.AsyncClient:
        base = base_url.rstrip("/")
        client = self._clients.get(base)
        if client is None:
            transport = self._transport_for(base) if self._transport_for is not None else None
            client = httpx.AsyncClient(base_url=base, headers=self._headers, timeout=self._timeout, transport=transport)
            self._clients[base] = client
        return client

    async def post(
        self,
        base_url: str,
        path: str,
        body: BaseModel,
        answer: type[_M],
        *,
        ok: tuple[int, ...] = (200,),
        timeout_sec: float | None = None,
    ) -> _M:
        response = await self.send(
            base_url, "POST", path, body.model_dump_json(exclude_none=True), timeout_sec=timeout_sec
        )
        if response.status_code not in ok:
            raise PeerRejectedError(
                f"POST {base_url}{path}: HTTP {response.status_code}: {_detail(response)}",
                status_code=response.status_code,
            )
        return _parse(response, answer)

    async def send(
        self, base_url: str, method: str, path: str, content: str | None = None, *, timeout_sec: float | None = None
    ) -> httpx.Response:
        timeout = self._timeout if timeout_sec is None else max(timeout_sec, self._timeout)
        try:
            return await self._client(base_url).request(method, path, content=content, headers=_JSON, timeout=timeout)
        except httpx.HTTPError as exc:
            raise PeerUnavailableError(f"{method} {base_url}{path}: {type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict):
        return str(body.get("detail") or body.get("error") or body)[:200]
    return str(body)[:200]


def _parse(response: httpx.Response, answer: type[_M]) -> _M:
    try:
        return answer.model_validate_json(response.content or b"{}")
    except ValidationError as exc:
        raise PeerRejectedError(
            f"{response.request.url}: unexpected answer: {exc.errors()[0]['msg']}", status_code=response.status_code
        ) from exc


ENGINES_RESTART_TIMEOUT_SEC = 30.0
"""How long a NodeManager may take to stop and relaunch its engines (its stop grace is 5 s by default; the stops
run concurrently)."""


class NodeManagerClient:
    """The controller's side of the four FT routes, the probe and nudge, and the engine lifecycle routes."""

    def __init__(
        self, *, cluster_token: str | None, timeout_sec: float = 5.0, transport_for: TransportFor | None = None
    ) -> None:
        self._http = _Http(cluster_token=cluster_token, timeout_sec=timeout_sec, transport_for=transport_for)

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
        response = await self._http.send(url, "GET", NM_STATUS_PATH)
        if response.status_code != 200:
            raise PeerRejectedError(
                f"GET {url}{NM_STATUS_PATH}: HTTP {response.status_code}", status_code=response.status_code
            )
        try:
            body = response.json()
        except ValueError as exc:
            raise PeerRejectedError(f"GET {url}{NM_STATUS_PATH}: not JSON") from exc
        if not isinstance(body, dict):
            raise PeerRejectedError(f"GET {url}{NM_STATUS_PATH}: not an object")
        return body

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
        self._http = _Http(cluster_token=cluster_token, timeout_sec=timeout_sec, transport_for=transport_for)

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

    async def set(
        self, instance_id: str, model: str, endpoints: list[ServingEndpoint], *, generation: int
    ) -> ViewResponse:
        body = ViewAddRequest(instance_id=instance_id, model=model, endpoints=endpoints, generation=generation)
        return await self._http.post(self.base_url, COORDINATOR_SET_PATH, body, ViewResponse)

    async def aclose(self) -> None:
        await self._http.aclose()
