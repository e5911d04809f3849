"""Error answers: the ``{"error", "detail"}`` body, and one exception → status table per service.

A service declares its table once (:class:`StatusMap`) and renders every typed error of its domain through it,
so that the status of an error is read in one place, not in each handler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from starlette.responses import JSONResponse

from heteroflow.http.gate import challenge_headers


def error_response(status: int, code: str, detail: str) -> JSONResponse:
    """``{"error": code, "detail": detail}`` with ``status``; a 401 carries the bearer challenge."""
    return JSONResponse({"error": code, "detail": detail}, status_code=status, headers=challenge_headers(status))


@dataclass(frozen=True, slots=True)
class StatusMap:
    """Exception types → HTTP statuses; the first entry the error is an instance of wins."""

    statuses: Mapping[type[BaseException], int] = field(default_factory=dict)
    default: int = 500
    """The status of an error no entry covers (a bug, not a refusal)."""

    def status_of(self, exc: BaseException) -> int:
        """The status ``exc`` is answered with. Purely computational."""
        return next((status for kind, status in self.statuses.items() if isinstance(exc, kind)), self.default)
