"""The controller as the NodeManager sees it: register, heartbeat, report software faults.

Errors (foreign ones translated here with ``raise … from``)::

    ControllerError
    ├── ControllerUnavailableError   refused, reset, timeout, 5xx: the same request may succeed later
    └── ControllerRejectedError      4xx (bad token, invalid body): retrying the same request cannot help
"""

from __future__ import annotations

from typing import Protocol, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from heteroflow.serving.wire import (
    HEARTBEAT_PATH,
    REGISTER_PATH,
    REPORT_SOFTWARE_FAULT_PATH,
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
    SoftwareFaultReport,
)

_M = TypeVar("_M", bound=BaseModel)


class ControllerError(Exception):
    """Base of every failure talking to the controller."""


class ControllerUnavailableError(ControllerError):
    """The controller could not be reached or failed; retry later."""


class ControllerRejectedError(ControllerError):
    """The controller refused the request for good."""


class ControllerClient(Protocol):
    async def register(self, request: RegisterRequest) -> RegisterResponse: ...

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse: ...

    async def report_software_fault(self, report: SoftwareFaultReport) -> None: ...

    async def aclose(self) -> None: ...


class HttpControllerClient:
    def __init__(
        self,
        base_url: str,
        *,
        cluster_token: str | None,
        timeout_sec: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {cluster_token}"} if cluster_token else {}
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout_sec, transport=transport
        )

    async def register(self, request: RegisterRequest) -> RegisterResponse:
        return _parse(await self._post(REGISTER_PATH, request), RegisterResponse)

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        return _parse(await self._post(HEARTBEAT_PATH, request), HeartbeatResponse)

    async def report_software_fault(self, report: SoftwareFaultReport) -> None:
        await self._post(REPORT_SOFTWARE_FAULT_PATH, report)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: BaseModel) -> httpx.Response:
        try:
            response = await self._http.post(path, content=body.model_dump_json(), headers=_JSON)
        except httpx.HTTPError as exc:
            raise ControllerUnavailableError(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 500:
            raise ControllerUnavailableError(f"POST {path}: HTTP {response.status_code}")
        if response.status_code >= 400:
            raise ControllerRejectedError(f"POST {path}: HTTP {response.status_code}: {response.text[:200]}")
        return response


def _parse(response: httpx.Response, answer: type[_M]) -> _M:
    try:
        return answer.model_validate_json(response.content or b"{}")
    except ValidationError as exc:
        raise ControllerRejectedError(
            f"{response.request.url.path}: unexpected answer: {exc.errors()[0]['msg']}"
        ) from exc


_JSON = {"Content-Type": "application/json"}
