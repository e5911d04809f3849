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

from heteroflow.contracts.serving import (
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


def controller_urls(base_url: str) -> tuple[str, ...]:
    """``"URL[,URL…]"`` → the controllers to try, in order; :class:`ValueError` when none is given."""
    urls = tuple(url.strip().rstrip("/") for url in base_url.split(",") if url.strip())
    if not urls:
        raise ValueError(f"no controller URL in {base_url!r}")
    return urls


class HttpControllerClient:
    """Talks to the controller; ``base_url`` may list several (active/standby): a request that finds one
    unreachable or not acting (5xx, ``503 not_leader``) moves on to the next, and the client stays with the one
    that answered."""

    def __init__(
        self,
        base_url: str,
        *,
        cluster_token: str | None,
        timeout_sec: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {cluster_token}"} if cluster_token else {}
        self.urls = controller_urls(base_url)
        self._current = 0
        self._http = httpx.AsyncClient(headers=headers, timeout=timeout_sec, transport=transport)

    @property
    def current_url(self) -> str:
        return self.urls[self._current]

    async def register(self, request: RegisterRequest) -> RegisterResponse:
        return _parse(await self._post(REGISTER_PATH, request), RegisterResponse)

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        return _parse(await self._post(HEARTBEAT_PATH, request), HeartbeatResponse)

    async def report_software_fault(self, report: SoftwareFaultReport) -> None:
        await self._post(REPORT_SOFTWARE_FAULT_PATH, report)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _post(self, path: str, body: BaseModel) -> httpx.Response:
        content = body.model_dump_json()
        failures: list[str] = []
        for _ in self.urls:
            url = self.current_url
            try:
                response = await self._http.post(url + path, content=content, headers=_JSON)
            except httpx.HTTPError as exc:
                failures.append(f"{url}: {type(exc).__name__}: {exc}")
            else:
                if response.status_code < 500:
                    if response.status_code >= 400:
                        raise ControllerRejectedError(
                            f"POST {path}: HTTP {response.status_code}: {response.text[:200]}"
                        )
                    return response
                failures.append(f"{url}: HTTP {response.status_code}")
            self._current = (self._current + 1) % len(self.urls)
        raise ControllerUnavailableError(f"POST {path}: " + "; ".join(failures))


def _parse(response: httpx.Response, answer: type[_M]) -> _M:
    try:
        return answer.model_validate_json(response.content or b"{}")
    except ValidationError as exc:
        raise ControllerRejectedError(
            f"{response.request.url.path}: unexpected answer: {exc.errors()[0]['msg']}"
        ) from exc


_JSON = {"Content-Type": "application/json"}
