"""The controller as the NodeManager sees it: register, heartbeat, report software faults.

Errors are the peer client's (:mod:`heteroflow.http.peer`), under the names the NodeManager's modules use::

    ControllerError (PeerError)
    ├── ControllerUnavailableError (Unavailable)   refused, reset, timeout, 5xx from every controller listed:
    │                                              the same request may succeed later
    └── ControllerRejectedError (Rejected)         4xx (bad token, invalid body) or an answer that breaks the
                                                   contract: retrying the same request cannot help
"""

from __future__ import annotations

from typing import Protocol

import httpx
from pydantic import BaseModel

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
from heteroflow.http.peer import JsonPeer, PeerError, Rejected, Unavailable, one_transport, parse_answer

ControllerError = PeerError
ControllerUnavailableError = Unavailable
ControllerRejectedError = Rejected

_SUCCESS = range(200, 400)
"""An answer below 400 is the controller's; 4xx is a refusal (final), 5xx means "ask the next one"."""


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
    that answered. One pooled connection per controller (:class:`~heteroflow.http.peer.JsonPeer`)."""

    def __init__(
        self,
        base_url: str,
        *,
        cluster_token: str | None,
        timeout_sec: float = 5.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.urls = controller_urls(base_url)
        self._current = 0
        self._http = JsonPeer(
            token=cluster_token,
            timeout_sec=timeout_sec,
            transport_for=one_transport(transport),
        )

    @property
    def current_url(self) -> str:
        return self.urls[self._current]

    async def register(self, request: RegisterRequest) -> RegisterResponse:
        return parse_answer(await self._post(REGISTER_PATH, request), RegisterResponse)

    async def heartbeat(self, request: HeartbeatRequest) -> HeartbeatResponse:
        return parse_answer(await self._post(HEARTBEAT_PATH, request), HeartbeatResponse)

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
                response = await self._http.send(url, "POST", path, content)
            except Unavailable as exc:
                failures.append(f"{url}: {type(exc.__cause__).__name__}: {exc.__cause__}")
            else:
                if response.status_code < 500:
                    self._http.check(response, "POST", path, _SUCCESS)  # a 4xx is final: no failover
                    return response
                failures.append(f"{url}: HTTP {response.status_code}")
            self._current = (self._current + 1) % len(self.urls)
        raise ControllerUnavailableError(f"POST {path}: " + "; ".join(failures))
