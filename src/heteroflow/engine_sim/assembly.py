"""HTTP API of one simulated engine, assembled from the routers of :mod:`.routes`: OpenAI-compatible serving,
the FT routes and the sim-only routes.

Error mapping, in one place:

- OpenAI routes: malformed input → 400, unknown model → 404, engine not healthy or request aborted → 503,
  all with vLLM's ``{"error": {"message", "type", "code"}}`` body.
- Every route: a body over 1 MiB → 413, JSON nested deeper than 32 levels → 400, in the route's error shape
  (:mod:`heteroflow.core.request_body`), before the route runs.
- FT routes: a body that is not a protocol message → 400 ``{"error": …}``;
  a well-formed command → 202, whether the engine accepts it or rejects it. Upstream forwards the command
  to the engine core in a background task and answers 202 before the engine decides, so the outcome —
  including a rejection (``last_ft_request_id`` + ``ft_error``) — is read from the status route.
- Authentication: the cluster token plays the part of vLLM's ``--api-key``. When one is configured, every
  OpenAI route and both FT routes need ``Authorization: Bearer <token>`` (missing or wrong → 401 with the
  bearer challenge), checked before anything else by :class:`heteroflow.http.gate.TokenGate`; ``/health`` and
  ``/metrics`` stay open, as in vLLM. With no token configured those routes are open (vLLM without
  ``--api-key``; the server binds loopback by default) and the sim-only routes (``/sim/…``) answer 403; with
  one, the sim-only routes need it too, checked before their body.

Profile ``vllm-0.34`` (the default) answers as vLLM 0.34.0: FT routes under ``/v1``, an apply body judged in
vLLM's order with its messages and error body, the caller's ``request_id`` echoed in the 202, a new request to
a faulted engine answered 503 with vLLM's text, an in-flight request aborted at a fault ended HTTP 200 with
``finish_reason: "abort"``, ``/health`` 503 while dead, and (``--enable-elastic-ep``) the elastic EP routes
with their serving gate (:class:`ElasticEpGate`: 503 while scaling or retired; the scale answers 408 and 500
as vLLM does).
Profile ``vllm-0.32`` (``--ft-profile vllm-0.32``, alias ``vllm-released``) answers as vLLM 0.32/0.33: FT
routes without prefix and open even with a token, the engine's own uuid in the 202, no ``mask`` or
``ft_state`` in the status, a new request to a faulted engine hangs until the engine recovers or exits (no 503
anywhere), and ``/health`` answers 503 in the seconds between the engine deciding to exit and the process
exiting.

Nothing maps to 500 but a failed elastic EP resize (vLLM's "Scale failed").
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from heteroflow.contracts.engine_protocol import (
    ELASTIC_EP_OBSERVABILITY_PATHS,
    ELASTIC_EP_RETIRED_TEXT,
    ELASTIC_EP_SCALING_TEXT,
    IS_SCALING_ELASTIC_EP_PATH,
    SCALE_ELASTIC_EP_PATH,
    VLLM_0_34,
    EngineProfile,
    apply_path,
    status_path,
)
from heteroflow.core.request_body import BodyError, BodyLimit
from heteroflow.engine_sim.completions import OpenAiError, openai_error, openai_error_body
from heteroflow.engine_sim.engine import EngineCore
from heteroflow.engine_sim.routes import (
    SIM_PREFIX,
    SimAuthError,
    elastic_ep_router,
    ft_router,
    openai_router,
    operations_router,
    sim_router,
)
from heteroflow.http.gate import TokenGate, challenge_headers


class _GuardedPaths:
    """ASGI middleware: the cluster token on the paths ``guarded`` names, before routing and body parsing (a
    fault injection with a malformed body and no token is a 401, not a 400 that describes the body).

    Pure ASGI rather than :func:`heteroflow.http.gate.gate_middleware`: the completion streams pass through it
    untouched. The 401 is in the route's shape: vLLM's error object on the OpenAI routes, ``{"error"}`` else.
    """

    def __init__(
        self, app: ASGIApp, *, gate: TokenGate, guarded: Callable[[str], bool], plain: Callable[[str], bool]
    ) -> None:
        self.app = app
        self.gate = gate
        self.guarded = guarded
        self.plain = plain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if self.guarded(path):
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
            refusal = self.gate.refusal(path, headers.get("authorization"))
            if refusal is not None:
                body = (
                    {"error": refusal} if self.plain(path) else openai_error_body(401, "AuthenticationError", refusal)
                )
                response = JSONResponse(body, status_code=401, headers=challenge_headers(401))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ElasticEpGate:
    """ASGI middleware: vLLM 0.34's ``ScalingMiddleware`` (``entrypoints/serve/elastic_ep/middleware.py``
    L35-65). From the moment a resize's prepare succeeded (``async_llm.py`` L1352) until its commit succeeds (a failed
    commit leaves it closed), or for good once a scale-down retired this rank, every path but
    ``/health`` and ``/is_scaling_elastic_ep`` answers 503 ``{"error": …}`` with vLLM's text — the FT routes and
    ``/metrics`` included. vLLM adds it after its API-key middleware, so it runs first (a 503 before a 401:
    ``entrypoints/serve/middleware/register.py`` L32-47). The simulator's own ``/sim/…`` routes stay open."""

    def __init__(self, app: ASGIApp, *, core: EngineCore) -> None:
        self.app = app
        self.core = core

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            retired = self.core.elastic_retired
            paused = retired or self.core.elastic_scaling
            if paused and path not in ELASTIC_EP_OBSERVABILITY_PATHS and not path.startswith(SIM_PREFIX + "/"):
                error = ELASTIC_EP_RETIRED_TEXT if retired else ELASTIC_EP_SCALING_TEXT
                await JSONResponse({"error": error}, status_code=503)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    core: EngineCore,
    *,
    model_name: str,
    ft_path_prefix: str | None = None,
    cluster_token: str | None,
    max_tokens_limit: int,
    profile: EngineProfile = VLLM_0_34,
    enable_elastic_ep: bool = False,
) -> FastAPI:
    """``ft_path_prefix`` overrides the profile's route prefix (``None``: the profile's own)."""
    app = FastAPI(
        title="HeteroFlow engine simulator", docs_url=None, redoc_url=None, openapi_url=None, redirect_slashes=False
    )
    prefix = profile.route_prefix if ft_path_prefix is None else ft_path_prefix
    ft_paths = frozenset({status_path(prefix), apply_path(prefix)})
    elastic_paths = (
        frozenset({SCALE_ELASTIC_EP_PATH, IS_SCALING_ELASTIC_EP_PATH})
        if enable_elastic_ep and profile.elastic_ep_routes
        else frozenset()
    )
    # no token configured: the served routes are open (vLLM without --api-key), the sim-only routes closed (403)
    gate = TokenGate(cluster_token or None, allow_no_token=True)

    def sim_only(path: str) -> bool:
        return path.startswith(SIM_PREFIX + "/")

    def guarded(path: str) -> bool:
        if path in ft_paths:
            # released vLLM guards only /v1, /v2, /inference, /cohere: its FT routes stay open
            return profile.ft_routes_authenticated
        # vLLM leaves its elastic EP routes open; the simulator guards them with the cluster token
        return sim_only(path) or path.startswith("/v1/") or path in elastic_paths

    def plain(path: str) -> bool:
        return path in ft_paths or sim_only(path)

    def refused_body(path: str, exc: BodyError) -> dict[str, object]:
        if path.startswith("/v1/") and path not in ft_paths:
            return openai_error_body(exc.status, "BadRequestError", str(exc))
        if path in ft_paths:
            return profile.error_body_for(str(exc), status_code=exc.status)
        return {"error": str(exc)}

    # the token gate is added last, so it runs first: an anonymous body is never read
    app.add_middleware(BodyLimit, render=refused_body)
    if gate.token:
        app.add_middleware(_GuardedPaths, gate=gate, guarded=guarded, plain=plain)
    if elastic_paths:
        app.add_middleware(ElasticEpGate, core=core)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()) if p != 'body') or 'body'}: {err.get('msg')}"
            for err in errors[:3]
        )
        if request.url.path.startswith(SIM_PREFIX):
            return JSONResponse({"error": detail}, status_code=400)
        return openai_error(400, "BadRequestError", detail or "invalid request")

    @app.exception_handler(OpenAiError)
    async def _openai(_: Request, exc: OpenAiError) -> JSONResponse:
        return openai_error(exc.status_code, exc.kind, exc.message)

    @app.exception_handler(SimAuthError)
    async def _sim_auth(_: Request, exc: SimAuthError) -> JSONResponse:
        headers = challenge_headers(exc.status_code)
        return JSONResponse({"error": exc.message}, status_code=exc.status_code, headers=headers)

    app.include_router(operations_router(core, profile=profile))
    app.include_router(openai_router(core, model_name=model_name, max_tokens_limit=max_tokens_limit, profile=profile))
    if elastic_paths:
        app.include_router(elastic_ep_router(core, profile=profile))
    app.include_router(ft_router(core, profile=profile, prefix=prefix))
    app.include_router(sim_router(core, gate=gate))
    return app
