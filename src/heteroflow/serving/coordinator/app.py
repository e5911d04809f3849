"""The Coordinator's HTTP API: thin handlers over :class:`Coordinator`.

Routes and who may call them:

- ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` — an API key
  (:mod:`.auth`); the key is checked before the body is read, so an anonymous caller cannot make the
  Coordinator read a megabyte.
- ``POST /coordinator/manage/{del,add,set}``, ``GET /coordinator/instances`` — the cluster token; every
  answer is a ``wire.ViewResponse`` (the views after the operation), with the operation's outcome in the
  ``X-HeteroFlow-View-Outcome`` header (``applied``, ``stale_generation``, ``unknown_instance``). With
  ``management_port`` they are also served by :func:`create_management_app` on a listener with an event loop
  of its own (:meth:`Coordinator.main_loop` runs everything that belongs to the OpenAI side).
- ``GET /metrics`` — the cluster token, as the platform server guards its own /metrics with a scope: the
  series name every instance and its size. ``GET /health`` — open, liveness only (a probe carries no secret,
  and the answer says nothing but "the process serves HTTP").

Errors map to statuses in :mod:`.errors`; nothing maps to 500.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from heteroflow.contracts.serving import (
    COORDINATOR_ADD_PATH,
    COORDINATOR_DEL_PATH,
    COORDINATOR_INSTANCES_PATH,
    COORDINATOR_SET_PATH,
    ErrorBody,
    ViewAddRequest,
    ViewDelRequest,
    ViewResponse,
    ViewSetRequest,
)
from heteroflow.core.admission import AdmissionGate, AdmissionLimit, AdmissionStatus, Refusal, Scope
from heteroflow.core.client_limits import ClientLimit, InFlightByKey, peer_address
from heteroflow.core.clock import Clock, SystemClock
from heteroflow.core.openapi import json_request_body
from heteroflow.serving.coordinator.auth import (
    ApiKeyVerifier,
    KeyChecker,
    KeyFirst,
    PlatformKeyChecker,
)
from heteroflow.serving.coordinator.body import parse_inference_body
from heteroflow.serving.coordinator.errors import (
    CoordinatorError,
    InvalidViewRequestError,
    ManagementAuthError,
    ManagementError,
    ModelNotFoundError,
    OpenAiErrorBody,
    OverloadedError,
    ViewConflictError,
    management_error_response,
    openai_error_body,
    openai_error_response,
)
from heteroflow.serving.coordinator.metrics import CONTENT_TYPE, CoordinatorMetrics
from heteroflow.serving.coordinator.middleware import (
    INFERENCE_ROUTES,
    bound_bodies,
    cluster_token_problem,
    is_inference,
    limited,
)
from heteroflow.serving.coordinator.proxy import Forwarder, PublicationSignal, UpstreamTimeouts
from heteroflow.serving.coordinator.settings import CoordinatorSettings
from heteroflow.serving.coordinator.views import (
    InstanceView,
    Lease,
    ModelMismatchError,
    ServingViews,
    ViewChange,
    valid_host,
)

_log = structlog.get_logger(__name__)
_M = TypeVar("_M", bound=BaseModel)

VIEW_OUTCOME_HEADER = "X-HeteroFlow-View-Outcome"
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")

_MANAGEMENT_ERRORS: dict[int, str] = {
    400: "The body is not the wire model (invalid_body), or is larger than max_body_bytes.",
    401: "No valid cluster token, or none configured (unauthorized).",
    409: "ADD for an instance that serves another model (model_mismatch).",
}
_OPENAI_ERRORS: dict[int, str] = {
    400: "A malformed body: not JSON, nested too deeply, no string 'model', or a non-boolean 'stream'.",
    401: "No valid API key, or none configured.",
    404: "No instance was ever published for the model.",
    413: "The body is larger than max_body_bytes.",
    503: "No engine answered without a fault within the client deadline (held and re-routed until then), or the "
    "API key could not be checked; see Retry-After.",
}
_INFERENCE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "An OpenAI request; the Coordinator reads 'model' and 'stream' and forwards the "
                    "body unchanged.",
                    "required": ["model"],
                    "properties": {"model": {"type": "string", "minLength": 1}, "stream": {"type": "boolean"}},
                    "additionalProperties": True,
                }
            }
        },
    }
}


def _management_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorBody, "description": _MANAGEMENT_ERRORS[code]} for code in sorted({401, *codes})}


def _openai_errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": OpenAiErrorBody, "description": _OPENAI_ERRORS[code]} for code in sorted({401, *codes})}


_INFERENCE_ANSWERS: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The engine's answer, passed through (server-sent events when stream is true); an engine's "
        "own 4xx is passed through unchanged too.",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **_openai_errors(400, 404, 413, 503),
}


@dataclass(frozen=True, slots=True)
class CoordinatorStatus:
    """What the Coordinator publishes and carries now, and how it is configured (no secrets)."""

    instances: tuple[InstanceView, ...]
    in_flight: Mapping[str, int]
    """Upstream requests in flight per ``instance/endpoint`` (a withdrawn endpoint stays until they finish)."""
    waiting_for_publication: int
    """Requests waiting now for a publication of their model (the unavailable wait)."""
    stale_generations_ignored: int
    api_keys_configured: bool
    management_enabled: bool
    config_warnings: tuple[str, ...]
    admission: AdmissionStatus
    """OpenAI requests in flight against ``max_concurrent_requests``, and those refused with 503."""


class Coordinator:
    """The Coordinator's shell: views, forwarder, key verifier, metrics and the upstream connection pool."""

    def __init__(
        self,
        *,
        settings: CoordinatorSettings,
        clock: Clock | None = None,
        upstream_transport: httpx.AsyncBaseTransport | None = None,
        key_checker: KeyChecker | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.views = ServingViews()
        self.publications = PublicationSignal()
        self.admission = AdmissionGate(max_in_flight=settings.max_concurrent_requests)
        self.metrics = CoordinatorMetrics(
            self.views.status, waiting=lambda: self.publications.waiting, admission=self.admission.status
        )
        timeouts = UpstreamTimeouts(
            connect=settings.upstream_connect_timeout_sec,
            first_byte=settings.upstream_first_byte_timeout_sec,
            total=settings.upstream_total_timeout_sec,
        )
        self._client = httpx.AsyncClient(
            timeout=timeouts.httpx(),
            limits=httpx.Limits(
                max_connections=settings.upstream_max_connections,
                max_keepalive_connections=min(settings.upstream_max_connections, 256),
            ),
            transport=upstream_transport,
            follow_redirects=False,
            trust_env=False,  # engine traffic never goes through an HTTP proxy from the environment
        )
        self.forwarder = Forwarder(
            views=self.views,
            client=self._client,
            timeouts=timeouts,
            client_deadline_sec=settings.client_deadline_sec,
            faulted_first_byte_sec=settings.faulted_first_byte_sec,
            fault_pause_sec=settings.fault_pause_sec,
            retry_after_sec=settings.retry_after_sec,
            upstream_token=settings.cluster_token,
            metrics=self.metrics,
            publications=self.publications,
        )
        if key_checker is None and settings.platform_url is not None:
            key_checker = PlatformKeyChecker(base_url=settings.platform_url, timeout_sec=settings.platform_timeout_sec)
        self.keys = ApiKeyVerifier(
            digests=settings.api_key_digests,
            platform=key_checker,
            clock=self.clock,
            cache_sec=settings.platform_token_cache_sec,
            # a share as large as the pool is no share: when one key has the whole pool, the Coordinator is full
            # and its answer is the admission gate's ("overloaded"), not "this key is busy"
            max_in_flight_per_key=(
                settings.max_in_flight_per_key
                if settings.max_in_flight_per_key < settings.max_concurrent_requests
                else None
            ),
        )
        self.peer_limit = InFlightByKey(max_per_client=settings.max_in_flight_per_peer)
        """OpenAI requests with a verified key in flight per peer address (:mod:`heteroflow.core.client_limits`)."""

        self.main_loop: asyncio.AbstractEventLoop | None = None
        """The OpenAI listener's loop (set when its app starts): a management call from the management listener's
        loop hands it what touches requests (wake-ups, faulted bounds)."""

    def _on_main(self, work: Callable[[], object]) -> None:
        """Run ``work`` on the OpenAI listener's loop: now when this is it, else as soon as that loop runs."""
        main = self.main_loop
        try:
            current: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            current = None
        if main is None or main is current or main.is_closed():
            work()
        else:
            main.call_soon_threadsafe(work)

    # -- management (F-40) ---------------------------------------------------------------------------------
    async def delete(self, request: ViewDelRequest) -> ViewChange:
        change = self.views.delete(request)
        if request.faulted:

            def bound() -> None:
                shortened = self.forwarder.faulted(request.instance_id, request.endpoint_ids)
                if shortened:
                    _log.info("coordinator.faulted_attempts_bounded", instance=request.instance_id, attempts=shortened)

            self._on_main(bound)
        return await self._applied("DEL", request.instance_id, request.request_id, change, request.generation)

    async def add(self, request: ViewAddRequest) -> ViewChange:
        try:
            change = self.views.add(request)
        except ModelMismatchError as exc:
            self.metrics.view_operations.labels(op="ADD", outcome="model_mismatch").inc()
            _log.warning("coordinator.view_refused", op="ADD", instance=request.instance_id, detail=str(exc))
            raise ViewConflictError(str(exc)) from exc
        return await self._applied("ADD", request.instance_id, request.request_id, change, request.generation)

    async def replace(self, request: ViewSetRequest) -> ViewChange:
        change = self.views.replace(request)
        return await self._applied("SET", request.instance_id, request.request_id, change, request.generation)

    async def _applied(
        self, op: str, instance_id: str, request_id: str | None, change: ViewChange, generation: int | None = None
    ) -> ViewChange:
        # logged before held requests are woken: the change took effect at the swap, and a woken request's
        # "forwarded" line must never precede the publication that let it go (the soak's invariant 2 reads both)
        _log.info(
            "coordinator.view_changed",
            op=op,
            instance=instance_id,
            outcome=change.outcome.value,
            generation=generation,
            withdrawn=sorted(key.endpoint_id for key in change.withdrawn),
            published=sorted(key.endpoint_id for key in change.published),
            request_id=request_id,
            detail=change.detail or None,
        )
        if change.published:
            self._on_main(self.publications.notify)
        if change.sending:
            # a request that passed the last check just before the swap is writing its headers now: the
            # operation returns only once they are out, so "returned" really means "nothing new goes there"
            sent = await self._sent(change.sending)
            if not sent:
                _log.warning("coordinator.withdraw_drain_timeout", op=op, instance=instance_id)
        self.metrics.view_operations.labels(op=op, outcome=change.outcome.value).inc()
        return change

    async def _sent(self, leases: tuple[Lease, ...]) -> bool:
        within = self.settings.upstream_connect_timeout_sec
        main = self.main_loop
        if main is None or main is asyncio.get_running_loop():
            return await self.forwarder.wait_sent(leases, within=within)
        # another loop: the leases' events belong to the OpenAI loop, so watch their state instead
        deadline = self.clock.monotonic() + within
        while self.views.still_sending(leases):
            if self.clock.monotonic() > deadline:
                return False
            await self.clock.sleep(0.0005)  # a header write lasts microseconds
        return True

    # -- status and lifecycle ------------------------------------------------------------------------------
    def status(self) -> CoordinatorStatus:
        snap = self.views.status()
        return CoordinatorStatus(
            instances=snap.instances,
            in_flight={key.label: count for key, count in sorted(snap.in_flight.items())},
            waiting_for_publication=self.publications.waiting,
            stale_generations_ignored=snap.generation_refusals,
            api_keys_configured=self.keys.configured,
            management_enabled=self.settings.cluster_token is not None,
            config_warnings=self.settings.config_warnings,
            admission=self.admission.status(),
        )

    async def aclose(self) -> None:
        await self._client.aclose()
        await self.keys.aclose()


def _view_response(change: ViewChange | None, views: tuple[InstanceView, ...]) -> JSONResponse:
    body = ViewResponse(instances=[view.wire() for view in views]).model_dump(mode="json")
    headers = {VIEW_OUTCOME_HEADER: change.outcome.value} if change is not None else None
    if change is not None and change.detail:
        # header values are latin-1 on the wire: ids the controller chose may not be
        detail = change.detail.encode("ascii", "backslashreplace").decode("ascii")
        headers = {**(headers or {}), "X-HeteroFlow-View-Detail": detail}
    return JSONResponse(body, headers=headers)


async def _management_body(request: Request, model: type[_M]) -> _M:
    """The wire model of a management body: its size, read time and depth were bounded by :class:`BodyLimit`,
    after the cluster token was checked (:func:`_bound_bodies`)."""
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(part) for part in err["loc"]) or "body"
        raise InvalidViewRequestError(f"{where}: {err['msg']}") from exc


def _routable(body: ViewAddRequest) -> ViewAddRequest:
    for endpoint in body.endpoints:
        if not valid_host(endpoint.ip):
            raise InvalidViewRequestError(f"endpoint {endpoint.id}: {endpoint.ip!r} is not an IP address or host name")
    return body


def _request_id(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if _REQUEST_ID.fullmatch(given) else uuid.uuid4().hex


def _overloaded(_: Scope, __: Refusal) -> dict[str, object]:
    return openai_error_body(
        status_code=OverloadedError.status_code,
        kind=OverloadedError.kind,
        message="the Coordinator is handling as many requests as it is configured for; try again shortly",
    )


def create_app(coordinator: Coordinator) -> FastAPI:
    settings = coordinator.settings
    created = int(coordinator.clock.now().timestamp())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        coordinator.main_loop = asyncio.get_running_loop()
        try:
            yield
        finally:
            await coordinator.aclose()

    app = FastAPI(
        title="HeteroFlow Coordinator",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        lifespan=lifespan,
        redirect_slashes=False,
    )
    # the last added runs first: key (and its per-key bound) → per-address limit → admission gate → body size,
    # read time and depth → FastAPI. A key is verified before it takes a slot or sends a byte of its body.
    bound_bodies(app, coordinator.settings, coordinator.metrics)
    app.add_middleware(
        AdmissionLimit,
        gate=coordinator.admission,
        applies=is_inference,
        retry_after_sec=settings.retry_after_sec,
        render=_overloaded,
        on_refused=lambda scope, _: coordinator.metrics.requests.labels(
            route=INFERENCE_ROUTES[scope["path"]], outcome=OverloadedError.outcome
        ).inc(),
    )
    app.add_middleware(
        ClientLimit,
        limiter=coordinator.peer_limit,
        key_of=lambda scope: peer_address(scope) if is_inference(scope) else None,
        retry_after_sec=settings.retry_after_sec,
        render=limited,
        on_refused=lambda scope: coordinator.metrics.requests.labels(
            route=INFERENCE_ROUTES[scope["path"]], outcome="limited"
        ).inc(),
    )
    # added last, so it runs first: a key is verified before it takes an admission slot or sends its body
    keyed = {**INFERENCE_ROUTES, "/v1/models": "models"}
    app.add_middleware(
        KeyFirst,
        verifier=coordinator.keys,
        routes=keyed,
        registry=coordinator.metrics.registry,
        retry_after_sec=settings.retry_after_sec,
        on_refused=lambda route, exc: coordinator.metrics.requests.labels(route=route, outcome=exc.outcome).inc(),
    )

    @app.exception_handler(ManagementError)
    async def _management_error(_: Request, exc: ManagementError) -> JSONResponse:
        return management_error_response(exc)

    @app.exception_handler(CoordinatorError)
    async def _openai_error(_: Request, exc: CoordinatorError) -> JSONResponse:
        return openai_error_response(exc)

    def require_cluster_token(request: Request) -> None:
        _require_cluster_token(settings.cluster_token, request)

    # -- operations ---------------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/metrics", response_class=Response, responses=_management_errors())
    async def prometheus(request: Request) -> Response:
        require_cluster_token(request)
        return Response(coordinator.metrics.render(), media_type=CONTENT_TYPE)

    _add_management_routes(app, coordinator, require_cluster_token)

    # -- OpenAI (F-41) ------------------------------------------------------------------------------------
    @app.get("/v1/models", responses=_openai_errors(503))
    async def models(request: Request) -> Response:
        try:
            await coordinator.keys.verify(request.headers.get("authorization"))
        except CoordinatorError as exc:
            coordinator.metrics.requests.labels(route="models", outcome=exc.outcome).inc()
            raise
        coordinator.metrics.requests.labels(route="models", outcome="ok").inc()
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "heteroflow", "root": name}
            for name in coordinator.views.models()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def inference(request: Request, *, route: str, path: str) -> Response:
        request_id = _request_id(request)
        try:
            await coordinator.keys.verify(request.headers.get("authorization"))
            # size, read time and depth were bounded by BodyLimit, after the key (create_app's middleware)
            body = parse_inference_body(await request.body(), max_bytes=settings.max_body_bytes)
            if not coordinator.views.is_known(body.model):
                raise ModelNotFoundError(f"The model `{body.model}` does not exist.")
            response = await coordinator.forwarder.forward(
                route=route, path=path, request=body, headers=request.headers.items(), request_id=request_id
            )
        except CoordinatorError as exc:
            coordinator.metrics.requests.labels(route=route, outcome=exc.outcome).inc()
            response = openai_error_response(exc)
        response.headers["x-request-id"] = request_id
        return response

    @app.post("/v1/completions", responses=_INFERENCE_ANSWERS, openapi_extra=_INFERENCE_BODY)
    async def completions(request: Request) -> Response:
        return await inference(request, route="completions", path="/v1/completions")

    @app.post("/v1/chat/completions", responses=_INFERENCE_ANSWERS, openapi_extra=_INFERENCE_BODY)
    async def chat_completions(request: Request) -> Response:
        return await inference(request, route="chat_completions", path="/v1/chat/completions")

    return app


def _add_management_routes(
    app: FastAPI, coordinator: Coordinator, require_cluster_token: Callable[[Request], None]
) -> None:
    """DEL, ADD, SET and the views (F-40), on the main app and on the management listener's."""

    @app.post(
        COORDINATOR_DEL_PATH,
        responses={200: {"model": ViewResponse}, **_management_errors(400)},
        openapi_extra=json_request_body(ViewDelRequest),
    )
    async def view_del(request: Request) -> JSONResponse:
        require_cluster_token(request)
        body = await _management_body(request, ViewDelRequest)
        change = await coordinator.delete(body)
        return _view_response(change, change.instances)

    @app.post(
        COORDINATOR_ADD_PATH,
        responses={200: {"model": ViewResponse}, **_management_errors(400, 409)},
        openapi_extra=json_request_body(ViewAddRequest),
    )
    async def view_add(request: Request) -> JSONResponse:
        require_cluster_token(request)
        body = _routable(await _management_body(request, ViewAddRequest))
        change = await coordinator.add(body)
        return _view_response(change, change.instances)

    @app.post(
        COORDINATOR_SET_PATH,
        responses={200: {"model": ViewResponse}, **_management_errors(400)},
        openapi_extra=json_request_body(ViewSetRequest),
    )
    async def view_set(request: Request) -> JSONResponse:
        require_cluster_token(request)
        body = _routable(await _management_body(request, ViewSetRequest))
        change = await coordinator.replace(body)
        return _view_response(change, change.instances)

    @app.get(COORDINATOR_INSTANCES_PATH, responses={200: {"model": ViewResponse}, **_management_errors()})
    async def instances(request: Request) -> JSONResponse:
        require_cluster_token(request)
        return _view_response(None, coordinator.views.snapshot())


def create_management_app(coordinator: Coordinator) -> FastAPI:
    """The management routes alone, for the listener of ``management_port`` (a thread and loop of its own):
    a withdrawal never waits behind the OpenAI traffic in the main loop."""
    settings = coordinator.settings
    app = FastAPI(title="HeteroFlow Coordinator management", docs_url=None, redoc_url=None, openapi_url=None)

    bound_bodies(app, coordinator.settings, coordinator.metrics)

    @app.exception_handler(ManagementError)
    async def _management_error(_: Request, exc: ManagementError) -> JSONResponse:
        return management_error_response(exc)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    def require_cluster_token(request: Request) -> None:
        _require_cluster_token(settings.cluster_token, request)

    _add_management_routes(app, coordinator, require_cluster_token)
    return app


def _require_cluster_token(token: str | None, request: Request) -> None:
    problem = cluster_token_problem(token, request.headers.get("authorization"))
    if problem is not None:
        raise ManagementAuthError(problem)
