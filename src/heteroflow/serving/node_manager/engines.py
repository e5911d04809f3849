"""The NodeManager's client of its own engines (FT status, apply, readiness, probe completions).

Errors (foreign ones translated here with ``raise … from``)::

    EngineCallError
    ├── EngineUnreachableError   timeout, refused or reset connection: DEAD evidence in the poll path (F-1)
    └── EngineProtocolError      an answer that breaks the protocol (bad JSON, wrong or missing engine id,
                                 unexpected HTTP status): never healthy

Every request carries ``Authorization: Bearer <cluster token>`` when one is configured: the engines guard
their OpenAI routes with it (vLLM's ``--api-key``; released vLLM leaves its FT routes open).

Which protocol profile an engine speaks (routes, whose request id tracks a command) is kept per endpoint:
pinned by configuration, or found by :meth:`HttpEngineClient.discover` at the engine's first readiness —
which status route answers (``/fault_tolerance/status``: vLLM 0.32/0.33; ``/v1/fault_tolerance/status``:
vLLM 0.34), then whether ``scale_down`` is an instruction it knows, asked with a body that every release
refuses with a 400 (no ``request_id``, ``params`` null), so a healthy engine is never disturbed.

An engine with elastic EP (vLLM 0.34, ``--enable-elastic-ep``) is also read for where its last resize stands
(:meth:`HttpEngineClient.elastic_ep_status`, ``POST /is_scaling_elastic_ep``, which never starts one).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from heteroflow.contracts.engine_protocol import (
    ELASTIC_EP_RETIRED_TEXT,
    ELASTIC_EP_SCALING_TEXT,
    IS_SCALING_ELASTIC_EP_PATH,
    VLLM_0_32,
    VLLM_0_34,
    ApplyRequest,
    ElasticEpPhase,
    ElasticEpStatus,
    EngineProfile,
    EngineStatusEntry,
    ProtocolError,
    apply_path,
    discovery_order,
    parse_status_response,
    select_engine,
    status_path,
)
from heteroflow.contracts.serving import MAX_DP_SIZE
from heteroflow.http.tls import client_tls


class EngineCallError(Exception):
    """Base of every failure talking to a local engine."""


class EngineUnreachableError(EngineCallError):
    """The engine did not answer in time, or its port refused or reset the connection."""


class EngineProtocolError(EngineCallError):
    """The engine answered, but not as the protocol says."""


class EnginePausedError(EngineProtocolError):
    """vLLM 0.34's elastic EP gate answered instead of the FT route: 503 ``{"error": …}`` with the text of a resize
    in progress (every path but ``/health`` and ``/is_scaling_elastic_ep`` while it commits) or of a rank a
    scale-down retired (for good). The engine is neither faulted nor off-protocol; it is paused by a resize."""


ELASTIC_EP_PAUSE_TEXTS = frozenset({ELASTIC_EP_SCALING_TEXT, ELASTIC_EP_RETIRED_TEXT})


def paused_text(response: httpx.Response) -> str | None:
    """The elastic EP gate's text when ``response`` is its 503, else ``None``."""
    if response.status_code != 503:
        return None
    try:
        body = response.json()
    except ValueError:
        return None
    text = body.get("error") if isinstance(body, dict) else None
    return text if text in ELASTIC_EP_PAUSE_TEXTS else None


class ElasticEpReading(BaseModel):
    """What ``POST /is_scaling_elastic_ep`` says of the last elastic EP resize: the two fields the NodeManager
    judges (``ft_manager.elastic_resize``), read from vLLM 0.34's body (``is_scaling_elastic_ep``, ``phase``,
    ``epoch``, ``error``, ``requested_data_parallel_size``); the others are ignored."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    phase: ElasticEpPhase
    requested_data_parallel_size: StrictInt | None = Field(default=None, ge=1, le=MAX_DP_SIZE)


@dataclass(frozen=True, slots=True)
class ApplyAnswer:
    http_status: int
    detail: str
    engine_request_id: str | None = None
    """The ``request_id`` of a 202 body: the engine's own uuid (released vLLM) or ours echoed."""


class EngineClient(Protocol):
    async def ready(self, endpoint_id: int) -> bool:
        """``GET /health`` answers 200 (liveness; the simulator and vLLM open it once the engine is up)."""
        ...

    async def status(self, endpoint_id: int, *, timeout_sec: float) -> EngineStatusEntry:
        """The entry of exactly the endpoint's engine, by the FT id it was launched with (the consumer rule),
        reported under ``endpoint_id``; raises :class:`EngineCallError`."""
        ...

    def renumber(self, endpoint_id: int, engine_rank: int) -> None:
        """The FT id the endpoint's engine now carries: its ``--data-parallel-rank`` in the launch's world
        (``spec.LaunchTarget``); the endpoint's own id until set."""
        ...

    async def apply(self, endpoint_id: int, body: ApplyRequest, *, timeout_sec: float) -> ApplyAnswer: ...

    def profile_of(self, endpoint_id: int) -> EngineProfile | None:
        """The profile the endpoint's engine speaks, once pinned or discovered."""
        ...

    async def discover(self, endpoint_id: int, *, timeout_sec: float) -> EngineProfile:
        """Find (and keep) the engine's profile; raises :class:`EngineCallError` when it speaks none."""
        ...

    def elastic_ep_of(self, endpoint_id: int) -> bool:
        """Whether discovery found the engine's elastic EP routes (vLLM 0.34 with ``--enable-elastic-ep``)."""
        ...

    async def elastic_ep_status(self, endpoint_id: int, *, timeout_sec: float) -> ElasticEpReading:
        """``POST /is_scaling_elastic_ep`` (it only reads the resize status); raises :class:`EngineCallError`."""
        ...

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
        ft_path_prefix: str | None = None,
        profile: EngineProfile | None = None,
        model: str | None = None,
        owns_clients: bool = False,
    ) -> None:
        """``profile`` pins every endpoint's profile; ``ft_path_prefix`` overrides the profiles' route prefix."""
        self._client_for = client_for
        self._prefix = ft_path_prefix
        self._pinned = profile
        self._profiles: dict[int, EngineProfile] = {}
        self._elastic_ep: set[int] = set()
        self._engine_ranks: dict[int, int] = {}
        self._model = model
        self._owned: dict[int, httpx.AsyncClient] = {}
        self._owns = owns_clients

    @classmethod
    def for_urls(
        cls,
        urls: Mapping[int, str],
        *,
        cluster_token: str | None,
        ft_path_prefix: str | None = None,
        profile: EngineProfile | None = None,
        model: str | None = None,
    ) -> HttpEngineClient:
        headers = {"Authorization": f"Bearer {cluster_token}"} if cluster_token else {}
        clients: dict[int, httpx.AsyncClient] = {}

        def client_for(endpoint_id: int) -> httpx.AsyncClient:
            client = clients.get(endpoint_id)
            if client is None:
                client = httpx.AsyncClient(
                    base_url=urls[endpoint_id], headers=headers, timeout=10.0, verify=client_tls()
                )
                clients[endpoint_id] = client
            return client

        engine_client = cls(client_for, ft_path_prefix=ft_path_prefix, profile=profile, model=model, owns_clients=True)
        engine_client._owned = clients
        return engine_client

    async def ready(self, endpoint_id: int) -> bool:
        try:
            response = await self._client_for(endpoint_id).get("/health", timeout=2.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def profile_of(self, endpoint_id: int) -> EngineProfile | None:
        return self._pinned or self._profiles.get(endpoint_id)

    def elastic_ep_of(self, endpoint_id: int) -> bool:
        return endpoint_id in self._elastic_ep

    def _paths(self, endpoint_id: int) -> tuple[str, str]:
        if self._prefix is not None:
            return status_path(self._prefix), apply_path(self._prefix)
        profile = self.profile_of(endpoint_id)
        if profile is None:
            raise EngineProtocolError(f"the protocol profile of engine {endpoint_id} is not known yet")
        return profile.status_path, profile.apply_path

    async def discover(self, endpoint_id: int, *, timeout_sec: float) -> EngineProfile:
        known = self.profile_of(endpoint_id)
        if known is not None:
            return known
        client = self._client_for(endpoint_id)
        candidates = (
            list(discovery_order()) if self._prefix is None else [VLLM_0_32]
        )  # an overridden prefix: the instruction probe alone tells the profile
        found: EngineProfile | None = None
        for candidate in candidates:
            path = status_path(self._prefix) if self._prefix is not None else candidate.status_path
            try:
                response = await client.get(path, timeout=timeout_sec)
            except httpx.TransportError as exc:
                raise EngineUnreachableError(f"discovery: {type(exc).__name__}: {exc}") from exc
            if response.status_code != 200:
                continue
            try:
                parse_status_response(response.json())  # the shape names the route; a wrong id is the poll's
            except (ValueError, ProtocolError):
                continue
            found = candidate
            break
        if found is None:
            raise EngineProtocolError(f"engine {endpoint_id} answers no known fault-tolerance status route")
        knows_scale_down = await self._knows_scale_down(endpoint_id, found, timeout_sec=timeout_sec)
        if self._prefix is not None:
            found = VLLM_0_34 if knows_scale_down else VLLM_0_32
        elif knows_scale_down != found.scale_down_supported:
            raise EngineProtocolError(
                f"engine {endpoint_id} answers {found.status_path} but "
                f"{'knows' if knows_scale_down else 'does not know'} scale_down: no known profile"
            )
        self._profiles[endpoint_id] = found
        if found.elastic_ep_routes and await self._answers_elastic_ep(endpoint_id, timeout_sec=timeout_sec):
            self._elastic_ep.add(endpoint_id)
        return found

    async def _answers_elastic_ep(self, endpoint_id: int, *, timeout_sec: float) -> bool:
        """``POST /is_scaling_elastic_ep`` answers a phase: the engine runs with ``--enable-elastic-ep``. The
        route only reads the resize status; it never starts one."""
        try:
            response = await self._client_for(endpoint_id).post(IS_SCALING_ELASTIC_EP_PATH, timeout=timeout_sec)
            if response.status_code != 200:
                return False
            ElasticEpStatus.model_validate(response.json())
        except (httpx.HTTPError, ValueError):
            return False
        return True

    async def _knows_scale_down(self, endpoint_id: int, profile: EngineProfile, *, timeout_sec: float) -> bool:
        """Ask with a body no profile accepts (no ``request_id``, ``params`` null): released vLLM's 400 names
        the instruction invalid; an engine that knows ``scale_down`` refuses something else. Never a command."""
        path = apply_path(self._prefix) if self._prefix is not None else profile.apply_path
        try:
            response = await self._client_for(endpoint_id).post(
                path, json={"instruction": "scale_down", "params": None}, timeout=timeout_sec
            )
        except httpx.TransportError as exc:
            raise EngineUnreachableError(f"discovery: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 400:
            raise EngineProtocolError(
                f"the instruction probe must be refused with 400, got HTTP {response.status_code}: "
                f"{response.text[:200]}"
            )
        text = response.text.lower()
        return not ("invalid instruction" in text or "unknown instruction" in text)

    def renumber(self, endpoint_id: int, engine_rank: int) -> None:
        self._engine_ranks[endpoint_id] = engine_rank

    async def status(self, endpoint_id: int, *, timeout_sec: float) -> EngineStatusEntry:
        status_route, _ = self._paths(endpoint_id)
        try:
            response = await self._client_for(endpoint_id).get(status_route, timeout=timeout_sec)
        except httpx.TimeoutException as exc:
            raise EngineUnreachableError(f"status timed out after {timeout_sec:g} s") from exc
        except httpx.TransportError as exc:
            raise EngineUnreachableError(f"status unreachable: {type(exc).__name__}: {exc}") from exc
        if (paused := paused_text(response)) is not None:
            raise EnginePausedError(f"elastic EP: {paused}")
        if response.status_code != 200:
            raise EngineProtocolError(f"status answered HTTP {response.status_code}: {response.text[:200]}")
        engine_rank = self._engine_ranks.get(endpoint_id, endpoint_id)
        try:
            entry = select_engine(parse_status_response(response.json()), endpoint_id=engine_rank)
        except (ValueError, ProtocolError) as exc:
            raise EngineProtocolError(str(exc)) from exc
        # every reader above the NodeManager counts in the instance's original ranks
        return entry if engine_rank == endpoint_id else entry.model_copy(update={"id": endpoint_id})

    async def apply(self, endpoint_id: int, body: ApplyRequest, *, timeout_sec: float) -> ApplyAnswer:
        _, apply_route = self._paths(endpoint_id)
        try:
            response = await self._client_for(endpoint_id).post(
                apply_route, json=body.model_dump(exclude_none=True), timeout=timeout_sec
            )
        except httpx.TimeoutException as exc:
            raise EngineUnreachableError(f"apply timed out after {timeout_sec:g} s") from exc
        except httpx.TransportError as exc:
            raise EngineUnreachableError(f"apply unreachable: {type(exc).__name__}: {exc}") from exc
        engine_request_id: str | None = None
        if response.status_code == 202:
            try:
                answered = response.json().get("request_id")
            except (ValueError, AttributeError):
                answered = None
            engine_request_id = answered if isinstance(answered, str) and answered else None
        return ApplyAnswer(
            http_status=response.status_code, detail=response.text[:300], engine_request_id=engine_request_id
        )

    async def elastic_ep_status(self, endpoint_id: int, *, timeout_sec: float) -> ElasticEpReading:
        try:
            response = await self._client_for(endpoint_id).post(IS_SCALING_ELASTIC_EP_PATH, timeout=timeout_sec)
        except httpx.TimeoutException as exc:
            raise EngineUnreachableError(f"elastic EP status timed out after {timeout_sec:g} s") from exc
        except httpx.TransportError as exc:
            raise EngineUnreachableError(f"elastic EP status unreachable: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:  # vLLM: 503 while the status is briefly unreadable
            raise EngineProtocolError(f"elastic EP status answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            return ElasticEpReading.model_validate(response.json())
        except ValueError as exc:  # bad JSON or a body without a known phase (pydantic's error is a ValueError)
            raise EngineProtocolError(f"not an elastic EP status: {response.text[:200]}") from exc

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
