"""Typed errors of the Coordinator and their HTTP answers, in one place.

::

    CoordinatorError                 OpenAI routes: {"error": {"message", "type", "param", "code"}}
    ├── BadRequestError          400 malformed body, missing or non-string model, JSON nested too deeply
    ├── BodyTooLargeError        413 body over max_body_bytes
    ├── AuthenticationError      401 no, wrong or unconfigured API key
    ├── ModelNotFoundError       404 no instance was ever published for the model
    ├── NoEndpointError          503 + Retry-After: no published endpoint (after the unavailable wait)
    ├── UpstreamUnavailableError 503 + Retry-After: the engines answered 503 (recovering), retry included
    ├── UpstreamFailedError      502 connection refused/reset or timeout before the first byte, retry included
    ├── AuthBackendUnavailableError 503: the platform could not be asked whether a key is valid
    ├── KeyBusyError             503 + Retry-After: the key has max_in_flight_per_key requests in flight
    │                            (held ones included); answered by KeyFirst before the body is read
    └── OverloadedError          503 + Retry-After: max_concurrent_requests are in flight; answered by the
                                 admission middleware (heteroflow.core.admission) before the body is read

    ManagementError                  management routes: wire.ErrorBody {"error": code, "detail"}
    ├── ManagementAuthError      401 no or wrong cluster token, or none configured
    ├── InvalidViewRequestError  400 the body is not the wire model
    └── ViewConflictError        409 ADD for an instance that serves another model

Upstream 4xx are not errors here: they are passed through unchanged. An upstream 5xx is a fault answer
(re-routed, held, then UpstreamUnavailableError), never passed through. Nothing maps to 500.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel
from starlette.responses import JSONResponse

from heteroflow.contracts.serving import ErrorBody
from heteroflow.http.gate import challenge_headers


class CoordinatorError(Exception):
    """An OpenAI route's failure; ``outcome`` labels the request in the metrics."""

    status_code: ClassVar[int] = 500
    kind: ClassVar[str] = "InternalServerError"
    outcome: ClassVar[str] = "error"

    def __init__(self, message: str, *, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class BadRequestError(CoordinatorError):
    status_code = 400
    kind = "BadRequestError"
    outcome = "bad_request"


class BodyTooLargeError(CoordinatorError):
    status_code = 413
    kind = "BadRequestError"
    outcome = "bad_request"


class AuthenticationError(CoordinatorError):
    status_code = 401
    kind = "AuthenticationError"
    outcome = "unauthorized"


class ModelNotFoundError(CoordinatorError):
    status_code = 404
    kind = "NotFoundError"
    outcome = "unknown_model"


class NoEndpointError(CoordinatorError):
    status_code = 503
    kind = "ServiceUnavailableError"
    outcome = "no_endpoint"


class UpstreamUnavailableError(CoordinatorError):
    status_code = 503
    kind = "ServiceUnavailableError"
    outcome = "upstream_unavailable"


class UpstreamFailedError(CoordinatorError):
    status_code = 502
    kind = "BadGatewayError"
    outcome = "upstream_failed"


class AuthBackendUnavailableError(CoordinatorError):
    status_code = 503
    kind = "ServiceUnavailableError"
    outcome = "auth_unavailable"


class KeyBusyError(CoordinatorError):
    """One key's share of the pool is taken (``auth.KeyFirst``): that key should slow down, the others are served."""

    status_code = 503
    kind = "ServiceUnavailableError"
    outcome = "key_busy"


class KeyThrottledError(CoordinatorError):
    """An address or a key with too many 401s in its window (``core/auth_failures.py``): 429 with Retry-After."""

    status_code = 429
    kind = "RateLimitError"
    outcome = "key_throttled"


class OverloadedError(CoordinatorError):
    """Never raised: its status, type and outcome label the admission middleware's refusal."""

    status_code = 503
    kind = "ServiceUnavailableError"
    outcome = "overloaded"


class OpenAiErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class OpenAiErrorBody(BaseModel):
    """The OpenAI routes' error answer, as the schema documents it (:func:`openai_error_body` builds it)."""

    error: OpenAiErrorDetail


def openai_error_body(*, status_code: int, kind: str, message: str) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": None, "code": status_code}}


def openai_error_response(exc: CoordinatorError) -> JSONResponse:
    headers: dict[str, str] = challenge_headers(exc.status_code) or {}
    if exc.retry_after is not None:
        headers["Retry-After"] = str(exc.retry_after)
    # a message may quote the request ("model `\ud800`"): lone surrogates escaped, so the answer can be written
    message = exc.message.encode("utf-8", "backslashreplace").decode("utf-8")
    body = openai_error_body(status_code=exc.status_code, kind=exc.kind, message=message)
    return JSONResponse(body, status_code=exc.status_code, headers=headers)


class ManagementError(Exception):
    status_code: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ManagementAuthError(ManagementError):
    status_code = 401
    code = "unauthorized"


class InvalidViewRequestError(ManagementError):
    status_code = 400
    code = "invalid_body"


class ViewConflictError(ManagementError):
    status_code = 409
    code = "model_mismatch"


def management_error_response(exc: ManagementError) -> JSONResponse:
    headers = challenge_headers(exc.status_code)
    body = ErrorBody(error=exc.code, detail=exc.detail).model_dump()
    return JSONResponse(body, status_code=exc.status_code, headers=headers)
