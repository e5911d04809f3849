"""The NodeManager's client of its own engines (FT status, apply, readiness, probe completions).

Errors (foreign ones translated here with ``raise … from``)::

    EngineCallError
    ├── EngineUnreachableError   timeout, refused or reset connection: DEAD evidence in the poll path (F-1)
    └── EngineProtocolError      an answer that breaks the protocol (bad JSON, wrong or missing engine id,
                                 unexpected HTTP status): never healthy

Every request carries ``Authorization: Bearer <cluster token>`` when one is configured: the engines guard
their OpenAI and FT routes with it (vLLM's ``--api-key``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import httpx

from heteroflow.contracts.engine_protocol import (
    ApplyRequest,
    EngineStatusEntry,
    ProtocolError,
    apply_path,
    parse_status_response,
    select_engine,
    status_path,
)


class EngineCallError(Exception):
    """Base of every failure talking to a local engine."""


class EngineUnreachableError(EngineCallError):
    """The engine did not answer in time, or its port refused or reset the connection."""


class EngineProtocolError(EngineCallError):
    """The engine answered, but not as the protocol says."""


@dataclass(frozen=True, slots=True)
class ApplyAnswer:
    http_status: int
    detail: str


class EngineClient(Protocol):
    async def ready(self, endpoint_id: int) -> bool:
        """``GET /health`` answers 200 (liveness; the simulator and vLLM open it once the engine is up)."""
        ...

    async def status(self, endpoint_id: int, *, timeout_sec: float) -> EngineStatusEntry:
        """The entry of exactly ``endpoint_id`` (the consumer rule); raises :class:`EngineCallError`."""
        ...

    async def apply(self, endpoint_id: int, body: ApplyRequest, *, timeout_sec: float) -> ApplyAnswer: ...

    async def complete(self, endpoint_id: int, *, max_tokens: int, timeout_sec: float) -> str:
        """One short completion (probe, nudge); the generated text. Raises :class:`EngineCallError`."""
        ...

    async def aclose(self) -> None: ...


class HttpEngineClient:
    """:class:`EngineClient` over httpx; ``client_for(endpoint_id)`` gives a client whose base URL is the engine."""

    def __init__(
        self,
        client_for: Callable[[int], httpx.AsyncClient],
        *,
        ft_path_prefix: str,
        model: str | None = None,
        owns_clients: bool = False,
    ) -> None:
        self._client_for = client_for
        self._status_path = status_path(ft_path_prefix)
        self._apply_path = apply_path(ft_path_prefix)
        self._model = model
        self._owned: dict[int, httpx.AsyncClient] = {}
        self._owns = owns_clients

    @classmethod
    def for_urls(
        cls, urls: Mapping[int, str], *, cluster_token: str | None, ft_path_prefix: str, model: str | None = None
    ) -> HttpEngineClient:
        headers = {"Authorization": f"Bearer {cluster_token}"} if cluster_token else {}
        clients: dict[int, httpx.AsyncClient] = {}

        def client_for(endpoint_id: int) -> httpx.AsyncClient:
            client = clients.get(endpoint_id)
            if client is None:
                client = httpx.AsyncClient(base_url=urls[endpoint_id], headers=headers, timeout=10.0)
                clients[endpoint_id] = client
            return client

        engine_client = cls(client_for, ft_path_prefix=ft_path_prefix, model=model, owns_clients=True)
        engine_client._owned = clients
        return engine_client

    async def ready(self, endpoint_id: int) -> bool:
        try:
            response = await self._client_for(endpoint_id).get("/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def status(self, endpoint_id: int, *, timeout_sec: float) -> EngineStatusEntry:
        try:
            response = await self._client_for(endpoint_id).get(self._status_path, timeout=timeout_sec)
        except httpx.TimeoutException as exc:
            raise EngineUnreachableError(f"status timed out after {timeout_sec:g} s") from exc
        except httpx.TransportError as exc:
            raise EngineUnreachableError(f"status unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise EngineProtocolError(f"status answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            return select_engine(parse_status_response(response.json()), endpoint_id=endpoint_id)
        except (ValueError, ProtocolError) as exc:
            raise EngineProtocolError(str(exc)) from exc

    async def apply(self, endpoint_id: int, body: ApplyRequest, *, timeout_sec: float) -> ApplyAnswer:
        try:
            response = await self._client_for(endpoint_id).post(
                self._apply_path, json=body.model_dump(exclude_none=True), timeout=timeout_sec
            )
        except httpx.TimeoutException as exc:
            raise EngineUnreachableError(f"apply timed out after {timeout_sec:g} s") from exc
        except httpx.TransportError as exc:
            raise EngineUnreachableError(f"apply unreachable: {type(exc).__name__}: {exc}") from exc
        return ApplyAnswer(http_status=response.status_code, detail=response.text[:300])

    async def complete(self, endpoint_id: int, *, max_tokens: int, timeout_sec: float) -> str:
        body: dict[str, object] = {"prompt": "ping", "max_tokens": max_tokens, "temperature": 0}
        if self._model is not None:
            body["model"] = self._model
        try:
            response = await self._client_for(endpoint_id).post("/v1/completions", json=body, timeout=timeout_sec)
        except httpx.TimeoutException as exc:
            raise EngineUnreachableError(f"completion timed out after {timeout_sec:g} s") from exc
        except httpx.TransportError as exc:
            raise EngineUnreachableError(f"completion unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise EngineProtocolError(f"completion answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            text = response.json()["choices"][0]["text"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EngineProtocolError(f"not a completion: {response.text[:200]}") from exc
        return str(text)

    async def aclose(self) -> None:
        if self._owns:
            for client in self._owned.values():
                await client.aclose()
            self._owned.clear()
