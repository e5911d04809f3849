"""Forwarding of OpenAI requests to published endpoints, with the retry-once rule (``serving-ft.md`` F-41).

One request, at most two endpoint attempts:

1. Take a lease on the best published endpoint of the model (:meth:`ServingViews.acquire`); with none
   published, wait up to ``unavailable_wait_sec`` for a publication (a scale-down round withdraws the view
   for a few seconds), then answer 503 with ``Retry-After``.
2. Right before the request headers are written, the lease is checked once more under the views' lock
   (through httpx's ``trace`` request extension, :meth:`Forwarder._tracer`): an endpoint withdrawn since it
   was chosen is never sent anything, and the request simply chooses again (that is not a failure).
3. A failure before anything reached the client — connection refused or reset, a timeout before the
   response headers, the connection closed before the body ended, or HTTP 503 (engines answer 503 while they
   recover) — is retried once on another published endpoint, never the same one. A second failure, or no
   other endpoint, is a 502 (transport) or 503 (engines unavailable) with a sentence naming both.
4. Upstream answers other than 503 are passed through unchanged (no retry): a 4xx is the client's problem.
5. Non-streaming answers are buffered, so "before anything reached the client" lasts until the whole answer
   is in. Streaming answers are relayed event by event from their first chunk on; a failure after that ends
   the stream with ``data: {"error": {...}}`` and ``data: [DONE]`` instead of hanging or cutting an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import httpx
import structlog
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from structlog.typing import FilteringBoundLogger

from heteroflow.serving.coordinator.body import InferenceRequest
from heteroflow.serving.coordinator.errors import (
    NoEndpointError,
    UpstreamFailedError,
    UpstreamUnavailableError,
    openai_error_body,
)
from heteroflow.serving.coordinator.metrics import CoordinatorMetrics
from heteroflow.serving.coordinator.views import EndpointKey, Lease, ServingViews

_log = structlog.get_logger(__name__)

FailureReason = Literal["connect", "timeout", "disconnect", "upstream_503"]

_MAX_RESELECTIONS = 16
"""Bound on "withdrawn between choice and send" re-selections of one request (each needs a view change)."""

_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade"}
)  # fmt: skip
_NOT_FORWARDED = _HOP_BY_HOP | {"host", "authorization", "content-length", "cookie", "accept-encoding", "x-request-id"}
ENDPOINT_HEADER = "x-heteroflow-endpoint"
"""Names the ``instance/endpoint`` whose engine answered (added to every engine answer, for tracing a request)."""
_NOT_RETURNED = _HOP_BY_HOP | {"content-length", "date", "server", ENDPOINT_HEADER}
_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    """Seconds: TCP connect; response headers and each later chunk; one whole request, retry included."""

    connect: float = 2.0
    first_byte: float = 60.0
    total: float = 600.0

    def httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect, read=self.first_byte, write=self.first_byte, pool=self.first_byte)


class PublicationSignal:
    """Wakes the requests that wait for a publication; take :meth:`current` before looking at the views."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._waiting = 0

    @property
    def waiting(self) -> int:
        """Requests waiting now for a publication (their model has no published endpoint)."""
        return self._waiting

    def current(self) -> asyncio.Event:
        return self._event

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seen: asyncio.Event, *, within: float) -> None:
        """Return at the first publication after ``seen`` was taken, or after ``within`` seconds."""
        self._waiting += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(within):
                    await seen.wait()
        finally:
            self._waiting -= 1


class _WithdrawnBeforeSendError(Exception):
    """The chosen endpoint was withdrawn before the request headers were written; nothing was sent."""


class _AttemptFailedError(Exception):
    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _reason_of(exc: httpx.HTTPError) -> FailureReason:
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.UnsupportedProtocol):
        return "connect"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    return "disconnect"


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def upstream_headers(
    client_headers: Iterable[tuple[str, str]], *, request_id: str, token: str | None, stream: bool
) -> dict[str, str]:
    """What the engine gets: the client's headers minus hop-by-hop ones and its credentials.

    The client's API key is never forwarded (the engine trusts the cluster token instead), and a streamed
    answer is asked uncompressed so that it can be cut at event boundaries.
    """
    given = list(client_headers)
    out = {name: value for name, value in given if name.lower() not in _NOT_FORWARDED}
    encoding = next((value for name, value in given if name.lower() == "accept-encoding"), "identity")
    out["accept-encoding"] = "identity" if stream else encoding
    out["x-request-id"] = request_id
    if token:
        out["authorization"] = f"Bearer {token}"
    return out


def returned_headers(upstream: httpx.Headers, *, decoded: bool, answered_by: EndpointKey) -> dict[str, str]:
    """What the client gets: the engine's headers minus hop-by-hop ones, plus which endpoint answered."""
    drop = _NOT_RETURNED | ({"content-encoding"} if decoded else frozenset())
    kept = {name: value for name, value in upstream.multi_items() if name.lower() not in drop}
    # header values are latin-1 on the wire: ids the controller chose may not be
    kept[ENDPOINT_HEADER] = answered_by.label.encode("ascii", "backslashreplace").decode("ascii")
    return kept


def last_event_end(buffer: bytes) -> int:
    """Length of the prefix of ``buffer`` that holds only complete SSE events (0 if none ends yet)."""
    ends = [buffer.rfind(separator) + len(separator) for separator in (b"\n\n", b"\r\n\r\n") if separator in buffer]
    return max(ends, default=0)


def stream_error_event(message: str, *, code: int = 502) -> bytes:
    body = openai_error_body(status_code=code, kind="BadGatewayError", message=message)
    return b"data: " + json.dumps(body).encode("utf-8") + b"\n\n" + _DONE


class Forwarder:
    """Sends requests to the engines; see the module docstring for the rules."""

    def __init__(
        self,
        *,
        views: ServingViews,
        client: httpx.AsyncClient,
        timeouts: UpstreamTimeouts,
        unavailable_wait_sec: float,
        retry_after_sec: int,
        upstream_token: str | None,
        metrics: CoordinatorMetrics,
        publications: PublicationSignal,
    ) -> None:
        self._views = views
        self._client = client
        self._timeouts = timeouts
        self._wait = unavailable_wait_sec
        self._retry_after = retry_after_sec
        self._token = upstream_token
        self._metrics = metrics
        self._publications = publications
        self._sending: dict[Lease, asyncio.Event] = {}

    async def wait_sent(self, leases: Sequence[Lease], *, within: float) -> bool:
        """Wait until these leases have written their request headers (or given up); False on timeout."""
        events = [self._sending[lease] for lease in leases if lease in self._sending]
        try:
            async with asyncio.timeout(within):
                for event in events:
                    await event.wait()
        except TimeoutError:
            return False
        return True

    async def forward(
        self, *, route: str, path: str, request: InferenceRequest, headers: Iterable[tuple[str, str]], request_id: str
    ) -> Response:
        """The engine's answer (or a relay of it); raises a 5xx :class:`CoordinatorError` when there is none."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeouts.total
        log = _log.bind(request_id=request_id, model=request.model, route=route)
        sent_headers = upstream_headers(headers, request_id=request_id, token=self._token, stream=request.stream)
        tried: list[EndpointKey] = []
        first_failure: tuple[EndpointKey, _AttemptFailedError] | None = None
        reselections = 0
        retry_counted = False
        while True:
            lease = await self._acquire(request.model, exclude=tried, deadline=deadline)
            if lease is None:
                raise self._nothing_to_send_to(request.model, first_failure)
            if first_failure is not None and not retry_counted:
                retry_counted = True
                self._metrics.retries.labels(reason=first_failure[1].reason).inc()
            attempt_log = log.bind(instance=lease.key.instance_id, endpoint=lease.key.endpoint_id)
            try:
                return await self._attempt(
                    lease, route=route, path=path, request=request, headers=sent_headers, deadline=deadline,
                    log=attempt_log,
                )  # fmt: skip
            except _WithdrawnBeforeSendError:
                reselections += 1
                attempt_log.info("coordinator.withdrawn_before_send", address=_address(lease.key))
                if reselections > _MAX_RESELECTIONS:
                    raise NoEndpointError(
                        f"the endpoints of model {request.model!r} kept being withdrawn; try again shortly",
                        retry_after=self._retry_after,
                    ) from None
            except _AttemptFailedError as exc:
                tried.append(lease.key)
                retry = first_failure is None
                attempt_log.warning(
                    "coordinator.upstream_failed",
                    address=_address(lease.key),
                    reason=exc.reason,
                    detail=exc.detail,
                    will_retry=retry,
                )
                if first_failure is not None:
                    raise self._retry_failed(first_failure, (lease.key, exc)) from None
                first_failure = (lease.key, exc)
                if loop.time() >= deadline:
                    raise UpstreamFailedError(
                        f"no answer within {self._timeouts.total:g} s: endpoint {lease.key.label} {exc.detail}"
                    ) from None

    # -- one attempt --------------------------------------------------------------------------------------
    async def _attempt(
        self,
        lease: Lease,
        *,
        route: str,
        path: str,
        request: InferenceRequest,
        headers: Mapping[str, str],
        deadline: float,
        log: FilteringBoundLogger,
    ) -> Response:
        loop = asyncio.get_running_loop()
        response: httpx.Response | None = None
        handed_over = False
        try:
            if not self._views.is_published(lease.key):
                raise _WithdrawnBeforeSendError
            upstream = self._client.build_request(
                "POST",
                lease.key.base_url + path,
                content=request.raw,
                headers=headers,
                extensions={"trace": self._tracer(lease)},
            )
            started = loop.time()
            response = await self._before_first_byte(self._client.send(upstream, stream=True), deadline)
            self._metrics.upstream_latency.labels(
                instance=lease.key.instance_id, endpoint=str(lease.key.endpoint_id)
            ).observe(loop.time() - started)
            if response.status_code == 503:
                detail = await self._error_detail(response, deadline)
                raise _AttemptFailedError("upstream_503", f"answered 503 (engine unavailable: {detail})")
            if request.stream and response.status_code == 200:
                chunks = response.aiter_bytes()
                first = await self._before_first_byte(anext(chunks, b""), deadline)
                relay = _RelayResponse(
                    first=first,
                    chunks=chunks,
                    deadline=deadline,
                    status_code=200,
                    headers=returned_headers(response.headers, decoded=True, answered_by=lease.key),
                    finish=self._finisher(lease, response, route=route, log=log),
                    log=log,
                )
                handed_over = True
                return relay
            body = await self._read_all(response, deadline)
            self._metrics.requests.labels(route=route, outcome=_outcome_of(response.status_code)).inc()
            log.debug("coordinator.forwarded", status=response.status_code)
            return Response(
                content=body,
                status_code=response.status_code,
                headers=returned_headers(response.headers, decoded=False, answered_by=lease.key),
            )
        finally:
            if not handed_over:
                try:
                    if response is not None:
                        await response.aclose()
                finally:
                    self._release(lease)

    async def _before_first_byte(self, step: Awaitable[Any], deadline: float) -> Any:
        """Await one step that comes before the client got anything: every failure here may be retried."""
        try:
            async with asyncio.timeout_at(deadline):
                return await step
        except (_WithdrawnBeforeSendError, _AttemptFailedError):
            raise
        except httpx.HTTPError as exc:
            raise _AttemptFailedError(_reason_of(exc), f"failed ({_describe(exc)})") from exc
        except TimeoutError as exc:
            raise _AttemptFailedError("timeout", f"did not answer within the total {self._timeouts.total:g} s") from exc

    async def _read_all(self, response: httpx.Response, deadline: float) -> bytes:
        parts: list[bytes] = []
        raw = response.aiter_raw()
        while True:
            chunk = await self._before_first_byte(anext(raw, None), deadline)
            if chunk is None:
                return b"".join(parts)
            parts.append(chunk)

    async def _error_detail(self, response: httpx.Response, deadline: float) -> str:
        with contextlib.suppress(_AttemptFailedError, ValueError):
            body = json.loads(await self._read_all(response, deadline))
            error = body.get("error") if isinstance(body, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            if isinstance(message, str) and message:
                return message[:300]
        return "no detail"

    def _tracer(self, lease: Lease) -> Callable[[str, Mapping[str, Any]], Awaitable[None]]:
        """httpcore's ``trace`` hook: the last check against the views sits right before the headers go out."""

        async def trace(event: str, _: Mapping[str, Any]) -> None:
            if event.endswith(".send_request_headers.started"):
                self._sending[lease] = asyncio.Event()
                if not self._views.begin_send(lease):
                    self._settle(lease)
                    raise _WithdrawnBeforeSendError
            elif event.endswith((".send_request_headers.complete", ".send_request_headers.failed")):
                self._views.mark_sent(lease)
                self._settle(lease)

        return trace

    def _settle(self, lease: Lease) -> None:
        event = self._sending.pop(lease, None)
        if event is not None:
            event.set()

    def _release(self, lease: Lease) -> None:
        self._views.release(lease)
        self._settle(lease)

    def _finisher(
        self, lease: Lease, response: httpx.Response, *, route: str, log: FilteringBoundLogger
    ) -> Callable[[str], Awaitable[None]]:
        done = False

        async def finish(outcome: str) -> None:
            nonlocal done
            if done:
                return
            done = True
            try:
                await response.aclose()
            finally:
                self._release(lease)
                self._metrics.requests.labels(route=route, outcome=outcome).inc()
                log.debug("coordinator.stream_finished", outcome=outcome)

        return finish

    # -- choosing an endpoint -----------------------------------------------------------------------------
    async def _acquire(self, model: str, *, exclude: Sequence[EndpointKey], deadline: float) -> Lease | None:
        loop = asyncio.get_running_loop()
        limit = min(loop.time() + self._wait, deadline)
        while True:
            published = self._publications.current()  # before looking, so that no publication is missed
            lease = self._views.acquire(model, exclude=exclude)
            if lease is not None:
                return lease
            remaining = limit - loop.time()
            if remaining <= 0:
                return None
            await self._publications.wait(published, within=remaining)

    def _nothing_to_send_to(
        self, model: str, first_failure: tuple[EndpointKey, _AttemptFailedError] | None
    ) -> NoEndpointError:
        if first_failure is None:
            message = f"no endpoint of model {model!r} is published (waited {self._wait:g} s); try again shortly"
        else:
            key, exc = first_failure
            message = (
                f"endpoint {key.label} {exc.detail}, and no other published endpoint of model {model!r} was "
                f"available to retry on within {self._wait:g} s; try again shortly"
            )
        return NoEndpointError(message, retry_after=self._retry_after)

    def _retry_failed(
        self, first: tuple[EndpointKey, _AttemptFailedError], second: tuple[EndpointKey, _AttemptFailedError]
    ) -> UpstreamFailedError | UpstreamUnavailableError:
        message = (
            f"endpoint {first[0].label} {first[1].detail}; the retry on endpoint {second[0].label} {second[1].detail}"
        )
        if second[1].reason == "upstream_503":
            return UpstreamUnavailableError(message, retry_after=self._retry_after)
        return UpstreamFailedError(message)


def _address(key: EndpointKey) -> str:
    return f"{key.ip}:{key.port}"


def _outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    return "upstream_4xx" if status < 500 else "upstream_5xx"


class _RelayResponse(StreamingResponse):
    """A streamed engine answer, passed on event by event; its lease and connection are released however the
    response ends (finished, failed upstream, or the client went away)."""

    def __init__(
        self,
        *,
        first: bytes,
        chunks: AsyncIterator[bytes],
        deadline: float,
        status_code: int,
        headers: Mapping[str, str],
        finish: Callable[[str], Awaitable[None]],
        log: FilteringBoundLogger,
    ) -> None:
        self._log = log
        self._first = first
        self._chunks = chunks
        self._deadline = deadline
        self._finish = finish
        self._outcome = "client_gone"
        self._events = self._relay()
        super().__init__(self._events, status_code=status_code, headers=dict(headers))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(RuntimeError):  # still running: it was cancelled and closes itself
                await self._events.aclose()
            await self._finish(self._outcome)

    async def _relay(self) -> AsyncGenerator[bytes, None]:
        pending = self._first
        while True:
            cut = last_event_end(pending)
            if cut:
                yield pending[:cut]
                pending = pending[cut:]
            try:
                async with asyncio.timeout_at(self._deadline):
                    chunk = await anext(self._chunks, None)
            except (httpx.HTTPError, TimeoutError) as exc:
                # the client already has part of the answer: no retry, a clean end instead of a hang;
                # an event cut in the middle is dropped, never delivered half
                self._outcome = "stream_error"
                detail = "the total timeout passed" if isinstance(exc, TimeoutError) else _describe(exc)
                self._log.warning("coordinator.stream_failed", detail=detail)
                yield stream_error_event(f"the engine failed while streaming ({detail}); the answer is incomplete")
                return
            if chunk is None:
                break
            pending += chunk
        if pending:
            yield pending
        self._outcome = "ok"
