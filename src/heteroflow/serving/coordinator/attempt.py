"""One forwarding attempt's parts: why it failed, the time bound a fault report shortens, the opened stream.

Used by the :class:`~heteroflow.serving.coordinator.proxy.Forwarder`, whose module docstring gives the rules.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

import httpx

from heteroflow.serving.coordinator.relay_http import EventReader
from heteroflow.serving.coordinator.streams import Event
from heteroflow.serving.coordinator.views import Lease


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Seconds: TCP connect; response headers and each later chunk; one whole request, retry included."""

    connect: float = 2.0
    first_byte: float = 60.0
    total: float = 600.0

    def httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.first_byte, write=self.first_byte, pool=self.first_byte)


FailureReason = Literal[
    "connect", "timeout", "disconnect", "upstream_503", "upstream_5xx", "abort", "error_event", "faulted_stall"
]


class WithdrawnBeforeSendError(Exception):
    """The chosen endpoint was withdrawn before the request headers were written; nothing was sent."""


class AttemptFailedError(Exception):
    def __init__(self, reason: FailureReason, detail: str, *, suspect: bool = True) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.suspect = suspect
        """Skip the endpoint for every request for the fault pause. Not for a timeout: an engine slow to accept
        or answer under load is busy, not faulted, and pausing it for everyone would only make the rest busier."""


def failure_reason(exc: httpx.HTTPError) -> FailureReason:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.UnsupportedProtocol):
        return "connect"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "disconnect"


def describe_error(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass(eq=False)
class Watch:
    """One attempt's time bound, which a fault report on its endpoint shortens (:meth:`Forwarder.faulted`)."""

    scope: asyncio.Timeout
    stalled: bool = False


@dataclass(eq=False)
class Segment:
    """One engine's stream, opened and read up to (and including) its first event that carries output."""

    lease: Lease
    response: httpx.Response
    events: EventReader
    buffered: list[Event]
    ended: bool = False
    """The engine's stream already ended (``[DONE]`` among the buffered events)."""
