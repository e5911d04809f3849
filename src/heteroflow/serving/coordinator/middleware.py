"""The Coordinator's body-reading middleware: every body it reads is bounded by the platform's shared
:class:`~heteroflow.core.request_body.BodyLimit` (size, read time, depth), and only once its caller is verified.

- OpenAI routes: after the API key (:class:`~heteroflow.serving.coordinator.auth.KeyFirst`, which the app adds
  outside these), the per-address limit (:func:`limited` renders its 429) and the admission gate; too large →
  413, too slow → 408, too deep → 400, and the engine never sees the request.
- Management routes (DEL/ADD/SET): after the cluster token, checked here before the body is read; a refused
  body is 400 ``invalid_body`` as the management contract says (too large included), a slow one 408.
"""

from __future__ import annotations

from fastapi import FastAPI

from heteroflow.contracts.serving import COORDINATOR_ADD_PATH, COORDINATOR_DEL_PATH, COORDINATOR_SET_PATH, ErrorBody
from heteroflow.core.admission import Scope
from heteroflow.core.authentication import AuthenticateFirst, Denial, header
from heteroflow.core.request_body import BodyError, BodyLimit
from heteroflow.serving.coordinator.auth import cluster_token_matches
from heteroflow.serving.coordinator.body import MAX_JSON_DEPTH
from heteroflow.serving.coordinator.errors import BadRequestError, ManagementAuthError, openai_error_body
from heteroflow.serving.coordinator.metrics import CoordinatorMetrics
from heteroflow.serving.coordinator.settings import CoordinatorSettings

INFERENCE_ROUTES = {"/v1/completions": "completions", "/v1/chat/completions": "chat_completions"}


def is_inference(scope: Scope) -> bool:
    return scope["method"] == "POST" and scope["path"] in INFERENCE_ROUTES


def cluster_token_problem(token: str | None, authorization: str | None) -> str | None:
    """Why ``authorization`` is not the cluster token, or ``None`` when it is."""
    if token is None:
        return "no cluster token is configured (HETEROFLOW_CLUSTER_TOKEN); management routes and /metrics are closed"
    if not cluster_token_matches(authorization, token):
        return "a valid cluster token is required (Authorization: Bearer <token>)"
    return None


def limited(_: Scope, limit: int) -> dict[str, object]:
    return openai_error_body(
        status_code=429,
        kind="RateLimitError",
        message=f"this address has {limit} requests in flight already; retry after the Retry-After seconds",
    )


def _refused_management_body(_: str, exc: BodyError) -> dict[str, object]:
    return ErrorBody(error=exc.code if exc.status == 408 else "invalid_body", detail=str(exc)).model_dump()


_MANAGEMENT_BODIES = frozenset({COORDINATOR_DEL_PATH, COORDINATOR_ADD_PATH, COORDINATOR_SET_PATH})


def _is_management_body(scope: Scope) -> bool:
    return scope["method"] == "POST" and scope["path"] in _MANAGEMENT_BODIES


def bound_bodies(app: FastAPI, settings: CoordinatorSettings, metrics: CoordinatorMetrics) -> None:
    """Every body the Coordinator reads goes through the shared :class:`BodyLimit` (size, read time, depth), and
    only once its caller is verified: an OpenAI body after its key (:class:`KeyFirst`, added by the caller, runs
    before this), a management body after the cluster token (checked here, before the body is read)."""

    def refused_inference_body(path: str, exc: BodyError) -> dict[str, object]:
        outcome = "body_timeout" if exc.status == 408 else BadRequestError.outcome
        metrics.requests.labels(route=INFERENCE_ROUTES[path], outcome=outcome).inc()
        kind = "RequestTimeoutError" if exc.status == 408 else BadRequestError.kind
        return openai_error_body(status_code=exc.status, kind=kind, message=str(exc))

    app.add_middleware(
        BodyLimit,
        applies=is_inference,
        render=refused_inference_body,
        max_bytes=settings.max_body_bytes,
        max_depth=MAX_JSON_DEPTH,
        read_timeout_sec=settings.body_read_timeout_sec,
        strict_text=lambda _: False,  # the body is the engine's: forwarded byte for byte, its text judged there
        strict_length=True,
    )
    app.add_middleware(
        BodyLimit,
        applies=_is_management_body,
        render=_refused_management_body,
        max_bytes=settings.max_body_bytes,
        read_timeout_sec=settings.body_read_timeout_sec,
        too_large_status=400,  # the management contract answers every refused body 400 invalid_body
        strict_length=True,
    )

    async def check(scope: Scope) -> Denial | None:
        authorization = header(scope, b"authorization")
        problem = cluster_token_problem(
            settings.cluster_token, authorization.decode("latin-1") if authorization is not None else None
        )
        return Denial(401, ManagementAuthError.code, problem) if problem is not None else None

    app.add_middleware(
        AuthenticateFirst,
        check=check,
        applies=_is_management_body,
        render=lambda _, denial: ErrorBody(error=denial.code, detail=denial.message).model_dump(),
    )
