"""The probes: liveness (the process serves HTTP) and readiness (it does its job now)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from fastapi import APIRouter
from starlette.responses import JSONResponse, Response

LIVENESS_PATH = "/health"
READINESS_PATH = "/ready"
PROBE_PATHS = frozenset({LIVENESS_PATH, READINESS_PATH})
"""Open without a token: kubelet calls them with none, and they say nothing about the service's state."""

Readiness = Callable[[], tuple[bool, Mapping[str, object]]]
"""Whether the service is ready, and what else the readiness body says."""


def probes_router(*, readiness: Readiness | None = None, ready_description: str = "Not ready.") -> APIRouter:
    """``GET /health`` (always ``{"status": "ok"}``) and, given ``readiness``, ``GET /ready``.

    ``/ready`` answers ``{"ready": …, **extra}`` with 200 when ready and 503 otherwise.
    """
    router = APIRouter()

    @router.get(LIVENESS_PATH)
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    if readiness is not None:
        ready_of = readiness

        @router.get(READINESS_PATH, responses={503: {"description": ready_description}})
        async def ready() -> Response:
            ready, extra = ready_of()
            return JSONResponse({"ready": ready, **extra}, status_code=200 if ready else 503)

    return router
