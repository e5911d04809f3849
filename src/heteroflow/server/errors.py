"""HTTP status mapping of the platform server, in one place.

    ApiError
    ├── Unauthorized (401)   missing, malformed, unknown or revoked token
    ├── Forbidden (403)      a valid token without the route's scope
    ├── NotFound (404)       absent, or outside the caller's tenant scope (identical on purpose)
    ├── BadRequest (400)     a parameter out of range, with the reason
    ├── Conflict (409)       a registration contradicting an existing node
    └── ServiceUnavailable (503)  the database is unreachable; retry later

Validation errors of request bodies keep FastAPI's 422 with the field locations. Nothing maps to 500.
"""

from __future__ import annotations

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from heteroflow.health.store import StoreUnavailableError

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


class ServiceUnavailable(ApiError):
    status_code = 503
    code = "unavailable"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return JSONResponse({"error": exc.code, "detail": exc.message}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(StoreUnavailableError)
    async def _store_unavailable(_: Request, exc: StoreUnavailableError) -> JSONResponse:
        _log.warning("server.database_unavailable", error=str(exc)[:300])
        return JSONResponse(
            {"error": "unavailable", "detail": "the database is unavailable; retry later"}, status_code=503
        )
