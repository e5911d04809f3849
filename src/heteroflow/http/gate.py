"""The cluster-token gate of an internal service, checked before anything reads the request body.

One rule for the controller, the NodeManager, the Coordinator's internal routes and the engine simulator: every
path but the open ones (the probes) needs ``Authorization: Bearer <cluster token>``. With no token configured
the internal routes are closed, unless the service was started with ``allow_no_token`` (a local cluster).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from starlette.requests import Request
from starlette.responses import Response

from heteroflow.core.authentication import BEARER_CHALLENGE, challenge_headers
from heteroflow.platform.auth import bearer_matches

__all__ = [
    "BEARER_CHALLENGE",
    "NO_TOKEN_CONFIGURED",
    "TOKEN_REQUIRED",
    "CallNext",
    "RenderRefusal",
    "TokenGate",
    "challenge_headers",
    "gate_middleware",
]

TOKEN_REQUIRED: Final = "a valid cluster token is required (Authorization: Bearer)"  # noqa: S105 - a message, not a secret
NO_TOKEN_CONFIGURED: Final = "no cluster token is configured; internal routes are closed"  # noqa: S105 - a message, not a secret


@dataclass(frozen=True, slots=True)
class TokenGate:
    """Who may call an internal service: the holder of ``token``; anyone on ``open_paths``."""

    token: str | None
    allow_no_token: bool = False
    """Open every route when no token is configured (a local cluster); otherwise they are closed."""
    open_paths: frozenset[str] = frozenset()
    """Paths answered without a token (the probes kubelet calls)."""

    def refusal(self, path: str, authorization: str | None) -> str | None:
        """Why a request to ``path`` with this ``Authorization`` header is refused; ``None``: let it in.

        Purely computational (the token compare is constant-time).
        """
        if path in self.open_paths:
            return None
        if self.token:
            return None if bearer_matches(authorization, self.token) else TOKEN_REQUIRED
        return None if self.allow_no_token else NO_TOKEN_CONFIGURED


RenderRefusal = Callable[[str], Response]
"""The detail of a refusal → the service's 401 answer (which carries :data:`BEARER_CHALLENGE`)."""

CallNext = Callable[[Request], Awaitable[Response]]


def gate_middleware(gate: TokenGate, render: RenderRefusal) -> Callable[[Request, CallNext], Awaitable[Response]]:
    """An ``http`` middleware that answers ``render(refusal)`` before the route (and its body) is touched.

    Add it last, so that it is the outermost middleware: a body limit added before it only reads the body of an
    authenticated request.
    """

    async def authenticate(request: Request, call_next: CallNext) -> Response:
        refusal = gate.refusal(request.url.path, request.headers.get("authorization"))
        if refusal is not None:
            return render(refusal)
        return await call_next(request)

    return authenticate
