"""HTTP status mapping of the platform server, in one place.

    ApiError
    ├── Unauthorized (401)   missing, malformed, unknown or revoked token
    ├── Forbidden (403)      a valid token without the route's scope
    ├── NotFound (404)       absent, or outside the caller's tenant scope (identical on purpose)
    ├── BadRequest (400)     a parameter out of range, with the reason
    ├── Conflict (409)       a registration contradicting an existing node (its source, or its credential:
    │                        node_credential_required: only an operator gives the node a new one)
    ├── TooManyRequests (429)  a per-token quota of nodes or cards used up
    └── ServiceUnavailable (503)  the database is unreachable; retry later

    BodyError (heteroflow.core.request_body), answered before any route runs:
    ├── BodyTooLargeError (413)     a body over 1 MiB
    └── InvalidJsonBodyError (400)  JSON nested deeper than 32 levels

    Overloaded (503 + Retry-After, heteroflow.core.admission), answered before any route runs: a heartbeat
    beyond max_in_flight_heartbeats or its tenant's (token's) share of it, or while the event loop lags more
    than heartbeat_shed_lag_seconds;
    the agent retries after Retry-After

    Limited (429 + Retry-After, heteroflow.core.client_limits), answered before the body is read: a node's
    heartbeat beyond max_in_flight_per_node, or an address's request beyond max_in_flight_per_peer

Validation errors of request bodies keep FastAPI's 422 with the field locations. Nothing maps to 500.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from heteroflow.core.admission import Refusal
from heteroflow.core.request_body import BodyError
from heteroflow.health.store import StoreUnavailableError
from heteroflow.http.gate import challenge_headers
from heteroflow.platform_server.schemas import ErrorOut

_log = structlog.get_logger(__name__)


class ApiError(Exception):
    status_code = 500
    code = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class Unauthorized(ApiError):
    status_code = 401
    code = "unauthorized"


class Forbidden(ApiError):
    status_code = 403
    code = "forbidden"


class NotFound(ApiError):
    status_code = 404
    code = "not_found"


class BadRequest(ApiError):
    status_code = 400
    code = "bad_request"


class Conflict(ApiError):
    status_code = 409
    code = "conflict"


class NodeCredentialRequired(Conflict):
    """A registration of a hostname registered in the caller's tenant without that node's credential: only an
    operator gives the node a new one (its release, or an administrator's token)."""

    code = "node_credential_required"


class TooManyRequests(ApiError):
    status_code = 429
    code = "quota_exceeded"


class ServiceUnavailable(ApiError):
    status_code = 503
    code = "unavailable"


_DESCRIPTIONS: dict[int, str] = {
    400: "A parameter out of range, or a body nested deeper than 32 levels (bad_request, invalid_body).",
    401: "Missing, malformed, unknown or revoked token (unauthorized).",
    403: (
        "A valid token without the route's scope, or a write with the browser session that lacks this site's "
        "Origin or the session's CSRF token (forbidden)."
    ),
    404: "Absent, or outside the caller's tenant (not_found).",
    409: "Contradicts the current state (conflict).",
    429: "A per-token quota is used up (quota_exceeded).",
    413: "The body is larger than 1 MiB (body_too_large).",
    503: "The database or the controller is unavailable; retry later (unavailable).",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The documented error answers of a route: 401 and 503 (every route authenticates) and ``codes``."""
    return {code: {"model": ErrorOut, "description": _DESCRIPTIONS[code]} for code in sorted({401, 503, *codes})}


def refused_body(_: str, exc: BodyError) -> dict[str, object]:
    """The error body of a request body refused by :class:`BodyLimit`."""
    return {"error": exc.code, "detail": str(exc)}


def overloaded(_: object, why: Refusal) -> dict[str, object]:
    """The error body of a heartbeat refused by the admission gate (503 + Retry-After)."""
    reason = {
        "busy": "too many heartbeats in flight",
        "lagging": "the server is behind on its work",
        "tenant_share": "this node's tenant holds its share of the heartbeats in flight",
        "token_share": "the nodes of this node's token hold their share of the heartbeats in flight",
    }[why]
    return {"error": "overloaded", "detail": f"{reason}; retry after the Retry-After seconds"}


def limited(what: str) -> Callable[[object, int], dict[str, object]]:
    """The error body of a request refused by a per-client limit (429 + Retry-After): ``what`` names the client."""

    def render(_: object, limit: int) -> dict[str, object]:
        return {
            "error": "too_many_requests",
            "detail": f"{what} has {limit} requests in flight already; retry after the Retry-After seconds",
        }

    return render


def error_response(exc: ApiError) -> JSONResponse:
    headers = challenge_headers(exc.status_code)
    return JSONResponse({"error": exc.code, "detail": exc.message}, status_code=exc.status_code, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
        if exc.status_code == 401:  # counted against its address and token (core/auth_failures.py)
            on_unauthorized = getattr(request.app.state, "on_unauthorized", None)
            if on_unauthorized is not None:
                on_unauthorized(request.scope)
        return error_response(exc)

    @app.exception_handler(StoreUnavailableError)
    async def _store_unavailable(_: Request, exc: StoreUnavailableError) -> JSONResponse:
        _log.warning("server.database_unavailable", error=str(exc)[:300])
        return JSONResponse(
            {"error": "unavailable", "detail": "the database is unavailable; retry later"}, status_code=503
        )
